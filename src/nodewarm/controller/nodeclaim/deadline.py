"""Deadline phase -> condition WarmDeadline: readiness.deadline passed without Warm, so spec.readiness.onDeadline acts.

* untaint: lift the taint anyway and label the node cold (nodewarm.io/warm=cold, the profile's generation label);
* replace: delete the NodeClaim so Karpenter launches a replacement (the reconciler holds it to the per-NodePool
  budget, budget.py), unless Karpenter is already taking the node down, or the node failed in a way a new node
  would repeat (UNFIXABLE_REASONS: then it is kept and says why);
* keep: the taint stays; the decision is recorded, and a late Warm still lifts it (untaint.py).

Deadline plans carry ``deadline``: the reconciler re-reads the objects live and plans again before acting on them
(the cache may be a moment behind a node that has just turned Warm), and the write carries the live objects'
uid/resourceVersion as preconditions.
"""

from __future__ import annotations

from nodewarm.api import lifecycle
from nodewarm.api.decisions import ConditionType, DeadlineOutcome, Decision, EventReason, OnDeadline, Reason
from nodewarm.api.generation import generation
from nodewarm.api.names import GENERATION_LABEL, WARM_LABEL
from nodewarm.api.enginecheck import Reason as EngineCheckReason
from nodewarm.api.views import DISRUPTED_TAINT, Condition
from nodewarm.api.warmprofile import WarmProfile, cold_mode

from .phase import Lift, Observed, Step

# Warm=False reasons a replacement node would hit again (instance type, sizes, IAM, the model source, a model or
# KV cache that does not fit the type's GPUs as the engine check found): replacing would only burn instances, so
# onDeadline=replace keeps the node and says why instead. A check's other failures may be this node's own (a bad
# GPU, a bundle now marked stale that the next node will not restore): those are replaced.
UNFIXABLE_REASONS = frozenset({"NotInstanceStore", "InsufficientNVMe", "InvalidModelSource", "S3AccessDenied",
                               "S3ObjectMissing", "InvalidProfile", "InvalidArgument",
                               EngineCheckReason.MODEL_DOES_NOT_FIT})

# How soon a deadline replace held back for Karpenter's own disruption looks again (Karpenter drops its mark when
# a disruption command fails or times out, after which nodewarm's deadline acts).
KARPENTER_RECHECK_S = 60.0


def condition(p: WarmProfile, start: float, now: float) -> Condition:
    left = start + p.readiness.deadline_s - now
    if left > 0:
        return Condition(ConditionType.WARM_DEADLINE, "False", Reason.WITHIN_DEADLINE,
                         f"{left:.0f}s left of {p.readiness.deadline}")
    return Condition(ConditionType.WARM_DEADLINE, "True", Reason.DEADLINE_EXCEEDED,
                     f"not Warm {p.readiness.deadline} after registration; onDeadline={p.readiness.on_deadline}")


def reconcile(seen: Observed, earlier: tuple[Condition, ...]) -> Step:
    p, claim, node, now, key = seen.profile, seen.claim, seen.node, seen.now, seen.taint_key
    gated = next(c for c in earlier if c.type == ConditionType.UNTAINTED)
    start = lifecycle.deadline_start(claim, node)
    dl = condition(p, start, now)
    if dl.status != "True":
        return Step((dl,), done=True, requeue_after=start + p.readiness.deadline_s - now)

    action = p.readiness.on_deadline
    base = f"not Warm after {p.readiness.deadline} (last: {gated.reason}: {gated.message})"
    if action == OnDeadline.REPLACE and gated.reason not in UNFIXABLE_REASONS:
        by_karpenter = claim.disrupting or ("Disrupted" if node.has_taint(DISRUPTED_TAINT) else "")
        if by_karpenter:
            # Karpenter is already replacing this node (repair, drift, consolidation): a delete of ours would start
            # a second replacement for one node. Wait: if Karpenter gives up, its mark goes and this re-plans.
            return Step((dl, Condition(
                ConditionType.REPLACEMENT, "True", Reason.KARPENTER_REPLACING,
                f"{base}; not deleting NodeClaim {claim.name}: Karpenter is already disrupting it "
                f"({by_karpenter}), and one replacement is enough")), done=True, requeue_after=KARPENTER_RECHECK_S)
        msg = f"{base}; deleting NodeClaim {claim.name} so Karpenter launches a replacement"
        return Step((dl,), done=True, delete_claim=True,
                    events=seen.events(EventReason.WARM_DEADLINE_REPLACE, msg, "Warning"),
                    counters=(("deadline", DeadlineOutcome.REPLACE),), deadline=DeadlineOutcome.REPLACE)
    if action == OnDeadline.UNTAINT:
        # The vLLM pods select the profile's generation label: without it they could never land here. The
        # node is marked cold beside it (warm=cold, compile-cache=cold): its local copy is incomplete, so the
        # vLLM pod's start script (nodewarm/nodeclasses/servestart.py) streams the model from S3 or waits for the copy.
        gen = generation(p)
        cold = ("streams the model from S3 (cold, through the publisher's identity)" if cold_mode(p) == "stream" else
                "waits for the agent's copy (the pod has no identity that may read the model from S3)")
        msg = (f"{base}; removed {key} anyway and labelled the node {GENERATION_LABEL}={gen} (the vLLM pods select "
               f"it) and {WARM_LABEL}=cold: until this node's copy is complete, the vLLM pod {cold}, and it "
               "compiles without the compile cache")
        return Step((dl,), done=True, decision=Decision.DEADLINE_UNTAINT, lift=Lift("cold", "cold", gen),
                    events=seen.events(EventReason.WARM_DEADLINE_UNTAINT, msg, "Warning"),
                    counters=(("deadline", DeadlineOutcome.UNTAINT),), deadline=DeadlineOutcome.UNTAINT)
    if action == OnDeadline.REPLACE:
        msg = (f"{base}; not replacing NodeClaim {claim.name}: a new node would fail the same way "
               f"({gated.reason}). Keeping {key}; fix the cause (profile, instance types, IAM or model source)")
        return Step((dl,), done=True, decision=Decision.DEADLINE_KEEP,
                    events=seen.events(EventReason.WARM_DEADLINE_NOT_REPLACED, msg, "Warning"),
                    counters=(("deadline", DeadlineOutcome.NOT_REPLACED),), deadline=DeadlineOutcome.NOT_REPLACED)
    msg = (f"{base}; keeping {key} (onDeadline=keep): the node stays unschedulable until it turns Warm or "
           "someone acts")
    return Step((dl,), done=True, decision=Decision.DEADLINE_KEEP,
                events=seen.events(EventReason.WARM_DEADLINE_KEEP, msg, "Warning"),
                counters=(("deadline", DeadlineOutcome.KEEP),), deadline=DeadlineOutcome.KEEP)
