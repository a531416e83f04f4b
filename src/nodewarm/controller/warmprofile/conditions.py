"""Conditions -> the WarmProfile's status: what each phase returns (``Step``), the Warning event a changed condition
gets, and the one status body the reconciler writes for all of them.

WarmProfile status is ours (our CRD): one condition per phase (Injected, DevicePluginsTolerate, Cleanup, and the
NodeClaim side's ReplacementsPaused), each rewritten only when its status, reason or message changes (its
lastTransitionTime kept while the status stays), with the observed generation; the write carries the object's
resourceVersion, so a concurrent writer makes us re-read instead of clobbering.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from nodewarm.api.timeutil import fmt_time_s
from nodewarm.api.views import Condition

from ..events import EventSpec
from ..profiles import ProfileView


@dataclass(frozen=True)
class Step:
    """What one WarmProfile phase decided."""

    condition: Condition | None = None
    injected: dict | None = None            # status.injected, written with the condition (inject.py)
    events: tuple[EventSpec, ...] = ()
    finalizer_ops: tuple[dict, ...] = ()    # a JSON patch taking the clean-up finalizer off (cleanup.py)


def _current(view: ProfileView, ctype: str) -> dict | None:
    return next((c for c in view.conditions if c.get("type") == ctype), None)


def warning(view: ProfileView | None, cond: Condition) -> tuple[EventSpec, ...]:
    """A Warning event on the WarmProfile, once per new reason/message (the condition is the record)."""
    if view is None:
        return ()
    old = _current(view, cond.type)
    if old and (old.get("reason"), old.get("message")) == (cond.reason, cond.message):
        return ()
    return (EventSpec("WarmProfile", view.name, view.uid, cond.reason, cond.message, "Warning"),)


def status(view: ProfileView, updates: Sequence[tuple[Condition, dict | None]], now: float) -> dict | None:
    """The status after ``updates`` (each condition, with the status.injected it carries or None), or None when
    nothing changes. A rewritten condition moves to the end of the list."""
    conds = list(view.conditions)
    changed, injected = False, None
    for cond, inj in updates:
        old = next((c for c in conds if c.get("type") == cond.type), None)
        same = old and (old.get("status"), old.get("reason"), old.get("message")) == (cond.status, cond.reason,
                                                                                        cond.message)
        if same and (inj is None or inj == view.injected):
            continue
        injected = inj if inj is not None else injected
        stamp = fmt_time_s(now)
        new = {"type": cond.type, "status": cond.status, "reason": cond.reason, "message": cond.message[:4096],
               "lastTransitionTime": old.get("lastTransitionTime", stamp) if old and old.get("status") == cond.status
               else stamp, "observedGeneration": view.generation}
        conds = [c for c in conds if c.get("type") != cond.type] + [new]
        changed = True
    if not changed:
        return None
    out: dict = {"conditions": conds}
    if injected is not None:
        out["injected"] = injected
    return out
