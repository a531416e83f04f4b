"""What a failed local write means for the node: a full disk, or some other local fault — never S3's.

Both products write to the NVMe RAID (weights, compile-cache bundles); an OSError from a local file
must not be classified with the network errors around it (an ENOSPC retried as if S3 were down, then
reported as S3Unavailable, sends operators to the wrong place).
"""

from __future__ import annotations

import errno
from pathlib import Path

from nodewarm.api.errors import NodewarmError


class InsufficientNVMe(NodewarmError):
    reason = "InsufficientNVMe"


class LocalWriteFailed(NodewarmError):
    reason = "LocalWriteFailed"


def write_error(e: OSError, path: Path | str) -> NodewarmError:
    """The NodewarmError for an OSError raised while writing ``path``."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientNVMe(f"disk full while writing {path}: {e.strerror}")
    return LocalWriteFailed(f"cannot write {path}: {e.strerror or e}")
