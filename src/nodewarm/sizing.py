"""Sizing rules shared by validation, rendering and the node agent. Pure arithmetic, no I/O."""

from __future__ import annotations

GB = 10**9
GIB = 2**30

# Beside the weights the NVMe RAID holds the compile caches (a few GB per model/TP) and, because
# nodeadm binds /var/lib/containerd onto it, the vLLM image layers (~10-20 GB unpacked).
MIN_HEADROOM_GB = 30
HEADROOM_FRACTION = 0.10

# Auto Mode: stay this far below the smallest NVMe capacity. Karpenter's own estimate ignores xfs/RAID
# overhead (real capacity is a little lower), and Auto Mode compares against the real capacity: landing
# on or just over it silently switches the node to EBS, so the margin must exceed that overhead.
AUTOMODE_MARGIN_FRACTION = 0.05


# On the node, the check is against *free* space at pull time, which already excludes whatever images
# and caches are on the RAID; so only a margin is kept, for logs and what lands while we pull.
NODE_FREE_MARGIN_FRACTION = 0.02
NODE_FREE_MARGIN_MIN_BYTES = 2 * GIB


def headroom_gb(model_gb: float) -> float:
    return max(MIN_HEADROOM_GB, model_gb * HEADROOM_FRACTION)


def required_nvme_gb(model_gb: float) -> float:
    """Bytes the cache mount must have free (in GB) before the first byte of weights is written."""
    return model_gb + headroom_gb(model_gb)


def parse_quantity_bytes(q: str) -> int:
    """'3800G', '100Gi', '2T', '1Ti' -> bytes (the units Auto Mode's ephemeralStorage.size documents)."""
    units = {"G": GB, "Gi": GIB, "T": 1000 * GB, "Ti": 1024 * GIB}
    for suffix in ("Gi", "Ti", "G", "T"):
        if q.endswith(suffix) and q[: -len(suffix)].isdigit():
            return int(q[: -len(suffix)]) * units[suffix]
    raise ValueError(f"not a storage quantity: {q!r} (use e.g. 3500Gi or 3700G)")


def automode_ephemeral_size(smallest_nvme_gb: int) -> str:
    """The Auto Mode ``ephemeralStorage.size``: whole GiB, strictly below the smallest NVMe capacity."""
    limit_bytes = smallest_nvme_gb * GB * (1 - AUTOMODE_MARGIN_FRACTION)
    return f"{int(limit_bytes // GIB)}Gi"
