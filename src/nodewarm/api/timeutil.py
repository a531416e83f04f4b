"""Times as the cluster's objects carry them (RFC 3339 strings) and as people read them (45s, 4m12s).

The controller stamps its record and conditions with these and `nodewarm status` reads them back, so both parse and
format through this one module.
"""

from __future__ import annotations

from datetime import datetime, timezone


def parse_time(s: object) -> float | None:
    """Epoch seconds from an RFC 3339 time; None for a missing one, and for anything that is not a time: the values
    come from annotations that people and older agents write too, and a bad one must read as unknown, not stop a
    reconcile or the table."""
    if not s or not isinstance(s, str):
        return None
    try:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def fmt_time(t: float | None) -> str | None:
    """RFC3339 in UTC with milliseconds (the bench needs sub-second phase times)."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def fmt_time_s(t: float) -> str:
    """Seconds precision: what metav1.Time fields (condition/event times) accept."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def fmt_duration(s: float | None) -> str:
    """kubectl-like: 45s, 4m12s, 2h5m, 3d4h."""
    if s is None:
        return "-"
    s = max(0, int(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s % 60 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m" if s % 3600 // 60 else f"{s // 3600}h"
    return f"{s // 86400}d{s % 86400 // 3600}h"
