"""Will the model fit? Checked before any byte is written.

The NVMe RAID is shared with kubelet, containerd images and pod logs (nodeadm bind-mounts them onto
it), so filling it to the last byte would break the node; we keep headroom on top of the model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nodewarm import sizing

from ..localwrite import InsufficientNVMe

GiB = 1024**3


@dataclass(frozen=True)
class Headroom:
    """Space to leave free: the larger of a fraction of the bytes to write and a fixed minimum.
    (Render-time sizing against the whole NVMe capacity is nodewarm.sizing.required_nvme_gb.)"""

    fraction: float = sizing.NODE_FREE_MARGIN_FRACTION
    minimum_bytes: int = sizing.NODE_FREE_MARGIN_MIN_BYTES

    def for_bytes(self, need: int) -> int:
        return max(int(need * self.fraction), self.minimum_bytes)


@dataclass(frozen=True)
class Space:
    path: str
    free_bytes: int  # usable by us (f_bavail), not counting root-reserved blocks
    total_bytes: int


def free_space(path: str) -> Space:
    st = os.statvfs(path)
    return Space(path, st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


def check_fits(space: Space, need_bytes: int, headroom: Headroom) -> None:
    """Raise InsufficientNVMe unless ``need_bytes`` plus headroom fit in ``space``."""
    margin = headroom.for_bytes(need_bytes)
    if need_bytes + margin > space.free_bytes:
        raise InsufficientNVMe(
            f"{space.path} has {space.free_bytes / GiB:.2f} GiB free of {space.total_bytes / GiB:.2f} GiB but the "
            f"model needs {need_bytes / GiB:.2f} GiB plus {margin / GiB:.2f} GiB headroom; pick an instance type "
            "with more NVMe instance storage or free space on the RAID"
        )
