"""The model's weights onto the node's NVMe instance store, every byte verified against S3's own evidence.

pipeline   the phases in order (NVMe proof, listing, plan, capacity, pull and verify, load check) and their summary
mounts     where the weights go: the instance-store NVMe mount, and proof that it is one
capacity   whether the model fits, checked before any byte is written
listing    the S3 listing, and a HEAD of each wanted object for its identity and checksums
manifest   what the model is in S3, what is already here, and what to fetch (pure but for the local manifest)
linking    files held verified in another model's folder, hard-linked instead of downloaded
s3pull     the transfer: parallel ranged GETs into preallocated temp files, parts from peers first when given
sharing    what the pull is handed to share with other nodes: another source of its parts, a sink for what it holds
rangeget   the pull's transport: ranged GETs read from the socket into a reused buffer
partial    a file still being pulled: its temp file and the journal of the parts already in it
verify     the proof that a downloaded file holds exactly the S3 object's bytes
loadcheck  the proof that the weights load with the loader vLLM will use
throttle   one bandwidth cap over many connections, and a lower CPU and I/O priority for a pull beside serving
progress   bytes done, rate and ETA: a log line every few seconds, a bar on a terminal
"""

from .pipeline import WeightsConfig, WeightsSummary, warm_weights

__all__ = ["WeightsConfig", "WeightsSummary", "warm_weights"]
