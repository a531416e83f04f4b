"""A model pulled in the background, beside a node that already serves (docs/models.md): its pull's settings."""

from __future__ import annotations

from nodewarm.api.warmprofile import Background


def pull_overrides(b: Background) -> dict:
    """As WeightsConfig.pull_overrides; nice 19: the pull gets only the CPU the serving pod leaves idle."""
    return {"concurrency": b.concurrency, "max_bps": b.max_mbps * 1e6, "nice": 19}
