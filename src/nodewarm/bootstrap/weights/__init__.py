"""The model's weights onto the node's NVMe instance store: proof of the mount (mounts), free space
(capacity), the S3 listing (listing), what to fetch (manifest), the parallel pull (s3pull), its
verification (verify), the load check (loadcheck) and the pipeline that runs them in order (pipeline)."""

from .pipeline import WeightsConfig, WeightsSummary, warm_weights

__all__ = ["WeightsConfig", "WeightsSummary", "warm_weights"]
