"""A NodeClaim's plan: its phases run in order, Karpenter's way, and the deciding one becomes one guarded write.

  track     -> Tracked       (track.py: launched / registered / node found; ends the plan when nothing is undecided)
  untaint   -> Untainted     (untaint.py: the Node reported Warm: lift the readiness taint, label, record)
  deadline  -> WarmDeadline  (deadline.py: readiness.deadline passed without Warm: untaint cold, replace, or keep)

Each phase is pure and returns a Step (phase.py); ``plan_claim`` folds the conditions of the phases that ran and the
deciding Step into one ``Plan``. The reconciler (controller.py) carries it out with a single write, so every
decision is one atomic step: the taint lifted, the labels and the record on the Node in one JSON patch
(nodewarm/api/views.py says why the record lives on the Node), or the NodeClaim's deletion. A replace also waits
for the per-NodePool replace budget (budget.py), which needs the reconciler's memory of this term. Where a node
stands is nodewarm.api.lifecycle's, the same derivation `nodewarm status` shows. No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nodewarm.api import lifecycle
from nodewarm.api.decisions import Decision
from nodewarm.api.names import STATE_ANNOTATION
from nodewarm.api.timeutil import fmt_time
from nodewarm.api.views import ClaimView, Condition, NodeView, WarmState
from nodewarm.api.warmprofile import WarmProfile

from ..events import EventSpec
from ..modellabels import plan as modellabels
from ..nodepatch import guarded_taint_removal, identity_guard, set_map_ops
from . import deadline, track, untaint
from .phase import Observed, Step, phase_times

PHASES = (track.reconcile, untaint.reconcile, deadline.reconcile)

UNTAINT = "untaint"
DELETE_CLAIM = "delete_claim"
RECORD = "record"
NONE = "none"


@dataclass(frozen=True)
class Plan:
    claim: str
    action: str = NONE
    conditions: tuple[Condition, ...] = ()
    node_ops: tuple[dict, ...] = ()           # the JSON patch for UNTAINT / RECORD
    events: tuple[EventSpec, ...] = ()
    durations: tuple[tuple[str, float], ...] = ()   # (phase, seconds) to observe once the write succeeds
    counters: tuple[tuple[str, str], ...] = ()      # (metric, label)
    requeue_after: float | None = None
    deadline: str = ""                        # the onDeadline action this plan carries out, if any
    profile: str = ""                         # the WarmProfile gating the claim's pool (a metric label)


def plan_claim(claim: ClaimView, node: NodeView | None, p: WarmProfile | None, now: float) -> Plan:
    if p is None or claim.deleting:
        return Plan(claim.name)
    seen = Observed(claim, node, p, now, lifecycle.phase(claim, node, p.readiness.taint_key))
    conditions: tuple[Condition, ...] = ()
    for phase in PHASES:
        step = phase(seen, conditions)
        conditions += step.conditions
        if step.done:
            return _fold(seen, conditions, step)
    return Plan(claim.name, conditions=conditions)


def _fold(seen: Observed, conditions: tuple[Condition, ...], step: Step) -> Plan:
    if step.lift is not None:
        step = _with_models(seen, step)
    action = (DELETE_CLAIM if step.delete_claim else UNTAINT if step.lift is not None else
              RECORD if step.decision is not None else NONE)
    ops = _node_patch(seen, conditions, step) if step.decision is not None else ()
    return Plan(seen.claim.name, action, conditions, ops, step.events, step.durations, step.counters,
                step.requeue_after, step.deadline, seen.profile.name)


def _with_models(seen: Observed, step: Step) -> Step:
    """A lift also sets the labels of the further models the node reports warm: the model-label reconciler sets
    none while the taint is on (modellabels/plan.py says why), so they come with the taint's removal, told like it."""
    extra = modellabels.lift_changes(seen.profile, seen.node)
    how = f" as {seen.taint_key} was removed"
    return replace(step, lift=replace(step.lift, models=extra),
                   events=step.events + tuple(modellabels.change_event(seen.node, c, how) for c in extra),
                   counters=step.counters + tuple(("model_labels", c.action) for c in extra))


def _node_patch(seen: Observed, conditions: tuple[Condition, ...], step: Step) -> tuple[dict, ...]:
    """The one write on the Node: guarded by its identity (and, for a deadline action planned on a live read, its
    resourceVersion), the taint lifted and the node labelled if the step lifts it, and the record of the decision."""
    node = seen.node
    ops = identity_guard(node, with_version=bool(step.deadline))
    if step.lift is not None:
        ops += guarded_taint_removal(node, seen.taint_key)
        ops += set_map_ops(node.any_labels, "/metadata/labels", untaint.node_labels(seen.profile, step.lift))
    state = record(seen, step.decision, conditions)
    ops += set_map_ops(node.any_annotations, "/metadata/annotations", {STATE_ANNOTATION: state.to_json()})
    return tuple(ops)


def record(seen: Observed, decision: Decision, conditions: tuple[Condition, ...]) -> WarmState:
    """What the Node's nodewarm.io/state says of the decision: the phase times and the conditions, stamped now."""
    times = phase_times(seen.claim, seen.node)
    return WarmState(profile=seen.profile.name, node_claim=seen.claim.name, decision=decision,
                     launched=fmt_time(times["launched"]), registered=fmt_time(times["registered"]),
                     warm=fmt_time(times["warm"]), decided=fmt_time(seen.now),
                     conditions=tuple(replace(c, last_transition=seen.now) for c in conditions))
