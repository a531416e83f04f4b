"""Pure planning: from observed objects (and the clock) to what to do. No I/O here.

One small reconciler per phase, Karpenter-style, each returning one condition with reason and message:

  track     -> Tracked      (launched / registered / node found, from Karpenter's own conditions)
  gate      -> Untainted    (the Node's nodewarm.io/Warm=True: remove the readiness taint, label the node,
                             the generation it warmed included, in one write)
  deadline  -> WarmDeadline (readiness.deadline passed without Warm: untaint cold, replace, or keep)

Deadline plans carry ``deadline``: the shell re-reads the objects live and plans again before acting
on them (the cache may be a moment behind a node that has just turned Warm), and writes with the
live objects' uid/resourceVersion as preconditions. ``replace_gate`` is the per-NodePool replace
budget with exponential backoff; replacing is never tried for failures a new node would repeat.

``plan_claim`` runs them in order and folds their results into one ``Plan``; the shell executes it
with a single guarded write, so every decision is one atomic step (nodewarm/api/views.py says why the record
lives on the Node). Where a node stands is nodewarm.api.lifecycle's, the same derivation `nodewarm status` shows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import re

from nodewarm.api import lifecycle
from nodewarm.api.decisions import ConditionType, DeadlineOutcome, Decision, EventReason, OnDeadline, Reason
from nodewarm.api.lifecycle import Phase
from nodewarm.api.names import (
    CACHE_ANNOTATION, CACHE_LABEL, CACHE_OUTCOMES, CACHE_REASON_ANNOTATION, CLEANUP_CONDITION, GENERATION_LABEL,
    MODEL_LABEL, PROFILE_LABEL, STATE_ANNOTATION, WARM_LABEL,
)
from nodewarm.api.timeutil import fmt_time
from nodewarm.api.views import DISRUPTED_TAINT, ClaimView, Condition, NodeView, WarmState, warm_generation
from nodewarm.api.generation import generation
from nodewarm.api.warmprofile import WarmProfile, cold_mode

# What the node agent reports at warm time (cold) and what the publisher proves once vLLM serves (hit | miss);
# a restore is not a hit, so it has no value here. Anything else is counted as "unknown" so an odd annotation
# cannot mint series.

# Warm=False reasons a replacement node would hit again (instance type, sizes, IAM, the model source):
# replacing would only burn instances, so onDeadline=replace keeps the node and says why instead.
UNFIXABLE_REASONS = frozenset({"NotInstanceStore", "InsufficientNVMe", "InvalidModelSource", "S3AccessDenied",
                               "S3ObjectMissing", "InvalidProfile", "InvalidArgument"})

# How soon a deadline replace held back for Karpenter's own disruption looks again (Karpenter drops its mark when
# a disruption command fails or times out, after which nodewarm's deadline acts).
KARPENTER_RECHECK_S = 60.0

UNTAINT = "untaint"
DELETE_CLAIM = "delete_claim"
RECORD = "record"
NONE = "none"


@dataclass(frozen=True)
class EventSpec:
    kind: str                       # Node | NodeClaim
    name: str
    uid: str
    reason: str
    message: str
    type: str = "Normal"


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


_LABEL_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def label_value(s: str) -> str:
    """Squeeze any string into a valid label value (<= 63 chars, alnum at both ends)."""
    v = _LABEL_BAD.sub("-", s)[:63]
    return v.strip("-_.")


def model_label(p: WarmProfile) -> str:
    """The model's last path element (+ revision): what an operator recognises in `kubectl get nodes -L`."""
    name = p.model.uri.rstrip("/").rsplit("/", 1)[-1]
    return label_value(f"{name}-{p.model.revision}" if p.model.revision else name)


def _esc(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def track(claim: ClaimView, node: NodeView | None) -> Condition:
    if node is not None:
        return Condition(ConditionType.TRACKED, "True", Reason.NODE_FOUND,
                         f"node {node.name} carries providerID {claim.provider_id}")
    if claim.registered is not None:
        return Condition(ConditionType.TRACKED, "False", Reason.NODE_NOT_FOUND, f"NodeClaim is Registered but no Node "
                         f"has providerID {claim.provider_id}; it was deleted or has not reached the cache yet")
    if claim.launched is not None:
        return Condition(ConditionType.TRACKED, "False", Reason.NOT_REGISTERED,
                         "instance launched, node not registered yet")
    return Condition(ConditionType.TRACKED, "False", Reason.NOT_LAUNCHED,
                     "waiting for Karpenter to launch the instance")


def guarded_taint_removal(node: NodeView, taint_key: str) -> list[dict]:
    """test-then-remove for every entry with ``taint_key``, highest index first so indexes stay valid.

    The ``test`` makes the patch fail (422) if the taint list changed since we read it; the shell then
    re-reads and re-plans. Other taints are never named, so they cannot be touched."""
    ops: list[dict] = []
    for i in reversed(range(len(node.taints))):
        t = node.taints[i]
        if t.get("key") == taint_key:
            ops += [{"op": "test", "path": f"/spec/taints/{i}", "value": t},
                    {"op": "remove", "path": f"/spec/taints/{i}"}]
    return ops


def identity_guard(node: NodeView, with_version: bool) -> list[dict]:
    """``test`` ops that make the patch fail unless it meets the very Node we planned for: same uid (not a
    re-created namesake) and, for deadline actions planned on a live read, the same resourceVersion."""
    ops = [{"op": "test", "path": "/metadata/uid", "value": node.uid}] if node.uid else []
    if with_version and node.resource_version:
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": node.resource_version})
    return ops


def _set_map_ops(present: bool, root: str, values: dict[str, str]) -> list[dict]:
    """JSON-patch ``add`` for map entries; a missing map must be added whole (a pointer into it fails)."""
    if not present:
        return [{"op": "add", "path": root, "value": values}]
    return [{"op": "add", "path": f"{root}/{_esc(k)}", "value": v} for k, v in values.items()]


def _label_ops(node: NodeView, values: dict[str, str]) -> list[dict]:
    return _set_map_ops(node.any_labels, "/metadata/labels", values)


def _state_ops(node: NodeView, state: WarmState) -> list[dict]:
    return _set_map_ops(node.any_annotations, "/metadata/annotations", {STATE_ANNOTATION: state.to_json()})


def phase_times(claim: ClaimView, node: NodeView) -> dict[str, float | None]:
    """launched / registered from Karpenter's conditions; warm from the bootstrap's timeline (sub-second)
    or, failing that, the Warm condition's transition time (whole seconds)."""
    return {"launched": claim.launched, "registered": lifecycle.deadline_start(claim, node),
            "warm": lifecycle.warm_at(node)}


def _durations(times: dict[str, float | None], done: float) -> tuple[tuple[str, float], ...]:
    out = []
    pairs = (("launch_to_register", "launched", "registered"), ("register_to_warm", "registered", "warm"))
    for phase, a, b in pairs:
        if times[a] is not None and times[b] is not None:
            out.append((phase, max(0.0, times[b] - times[a])))
    if times["warm"] is not None:
        out.append(("warm_to_untaint", max(0.0, done - times["warm"])))
    if times["launched"] is not None:
        out.append(("launch_to_ready", max(0.0, done - times["launched"])))
    return tuple(out)


def gate(p: WarmProfile, node: NodeView) -> Condition:
    w = node.warm
    if w is None:
        return Condition(ConditionType.UNTAINTED, "False", Reason.WARMING, f"waiting for {p.readiness.taint_key} to "
                         "be lifted: the node has not reported nodewarm.io/Warm yet")
    if w.status == "True":
        return Condition(ConditionType.UNTAINTED, "True", Reason.WARM_CONDITION_TRUE,
                         f"node reported Warm ({w.reason}: {w.message})")
    return Condition(ConditionType.UNTAINTED, "False", w.reason or Reason.NOT_WARM,
                     f"node reports Warm={w.status}: {w.message}")


def deadline(p: WarmProfile, start: float, now: float) -> Condition:
    left = start + p.readiness.deadline_s - now
    if left > 0:
        return Condition(ConditionType.WARM_DEADLINE, "False", Reason.WITHIN_DEADLINE,
                         f"{left:.0f}s left of {p.readiness.deadline}")
    return Condition(ConditionType.WARM_DEADLINE, "True", Reason.DEADLINE_EXCEEDED,
                     f"not Warm {p.readiness.deadline} after registration; onDeadline={p.readiness.on_deadline}")


@dataclass(frozen=True)
class ReplacePolicy:
    """At most ``budget`` replacements per NodePool in any ``window_s``; after the k-th, the next waits
    ``backoff_base_s * 2**(k-1)`` (capped). A pool whose nodes keep failing stops costing instances."""

    budget: int = 3
    window_s: float = 3600.0
    backoff_base_s: float = 60.0
    backoff_max_s: float = 1800.0


@dataclass(frozen=True)
class ReplaceGate:
    allowed: bool
    until: float | None             # when the next replacement may go, if not now
    condition: Condition            # ReplacementsPaused, for the WarmProfile's status


def replace_gate(pool: str, recent: tuple[float, ...], now: float, policy: ReplacePolicy) -> ReplaceGate:
    within = sorted(t for t in recent if now - t < policy.window_s)
    if len(within) >= policy.budget:
        until = (within[-policy.budget] if policy.budget > 0 else now) + policy.window_s
        return ReplaceGate(False, until, Condition(
            ConditionType.REPLACEMENTS_PAUSED, "True", Reason.BUDGET_EXHAUSTED,
            f"NodePool {pool}: {len(within)} nodes replaced for missing the warm deadline in the last "
            f"{policy.window_s:.0f}s (budget {policy.budget}); nodes past the deadline keep the readiness taint "
            f"until {fmt_time(until)}. Check why nodes do not turn Warm (the Nodes' nodewarm.io/Warm condition)"))
    closed = Condition(ConditionType.REPLACEMENTS_PAUSED, "False", Reason.WITHIN_BUDGET,
                       f"NodePool {pool}: {len(within)} of {policy.budget} replacements used in the last "
                       f"{policy.window_s:.0f}s")
    if within:
        wait = min(policy.backoff_max_s, policy.backoff_base_s * 2 ** (len(within) - 1))
        if now < within[-1] + wait:
            return ReplaceGate(False, within[-1] + wait, closed)
    return ReplaceGate(True, None, closed)


def plan_claim(claim: ClaimView, node: NodeView | None, p: WarmProfile | None, now: float) -> Plan:
    if p is None or claim.deleting:
        return Plan(claim.name)
    tracked = track(claim, node)
    key = p.readiness.taint_key
    stage = lifecycle.phase(claim, node, key)
    if stage.phase not in lifecycle.UNDECIDED_PHASES:
        # No Node yet, or it is going; or decided earlier (record present) or the taint is gone (someone else
        # lifted it): nothing to do, and in particular no second event or metric after a restart. Only "keep"
        # waits on: a node that turns Warm after its deadline is still untainted.
        return Plan(claim.name, conditions=(tracked,))
    kept = node.state is not None and node.state.decision == Decision.DEADLINE_KEEP

    gated = gate(p, node)
    times = phase_times(claim, node)
    # Only the contract's values reach labels and metric labels (an odd annotation must not mint series).
    cache = node.annotations.get(CACHE_ANNOTATION, "")
    cache = cache if cache in CACHE_OUTCOMES else "unknown"
    claim_ev = lambda reason, msg, typ="Normal": EventSpec("NodeClaim", claim.name, claim.uid, reason, msg, typ)  # noqa: E731
    node_ev = lambda reason, msg, typ="Normal": EventSpec("Node", node.name, node.uid, reason, msg, typ)  # noqa: E731

    def record(decision: Decision, conds: tuple[Condition, ...]) -> WarmState:
        conds = tuple(replace(c, last_transition=now) for c in conds)
        return WarmState(profile=p.name, node_claim=claim.name, decision=decision,
                         launched=fmt_time(times["launched"]), registered=fmt_time(times["registered"]),
                         warm=fmt_time(times["warm"]), decided=fmt_time(now), conditions=conds)

    if stage.phase is Phase.WARM:
        conds = (tracked, gated)
        state = record(Decision.UNTAINTED, conds)
        labels = {PROFILE_LABEL: label_value(p.name), MODEL_LABEL: model_label(p), CACHE_LABEL: cache,
                  WARM_LABEL: "true"}
        # The generation label the vLLM pods select on, in this same write (bootstrap/nodestatus.py says why).
        gen = warm_generation(node.annotations)
        if gen:
            labels[GENERATION_LABEL] = gen
        ops = (identity_guard(node, False) + guarded_taint_removal(node, key) + _label_ops(node, labels)
               + _state_ops(node, state))
        why = node.annotations.get(CACHE_REASON_ANNOTATION, "")
        msg = (f"removed {key}: node Warm ({node.warm.reason}); model {model_label(p)}, compile cache {cache}"
               + (f" ({why})" if why else "") + ("; after its deadline (onDeadline=keep)" if kept else ""))
        return Plan(claim.name, UNTAINT, conds, tuple(ops),
                    (node_ev(EventReason.UNTAINTED, msg), claim_ev(EventReason.UNTAINTED, f"node {node.name}: {msg}")),
                    _durations(times, now),
                    # Only "cold" is final at warm time; hit/miss are counted when serving proves them
                    # (Controller._on_node), so a restored bundle is never counted as if it were a hit.
                    (("taints_removed", ""),) + ((("compile_cache", cache),) if cache == "cold" else ()))
    if stage.phase is Phase.KEPT:
        return Plan(claim.name, conditions=(tracked, gated))   # the node's next change brings it back

    start = lifecycle.deadline_start(claim, node)
    dl = deadline(p, start, now)
    conds = (tracked, gated, dl)
    if dl.status != "True":
        return Plan(claim.name, conditions=conds, requeue_after=start + p.readiness.deadline_s - now)

    action = p.readiness.on_deadline
    base = f"not Warm after {p.readiness.deadline} (last: {gated.reason}: {gated.message})"
    if action == OnDeadline.REPLACE and gated.reason not in UNFIXABLE_REASONS:
        by_karpenter = claim.disrupting or ("Disrupted" if node.has_taint(DISRUPTED_TAINT) else "")
        if by_karpenter:
            # Karpenter is already replacing this node (repair, drift, consolidation): a delete of ours would start
            # a second replacement for one node. Wait: if Karpenter gives up, its mark goes and this re-plans.
            return Plan(claim.name, conditions=conds + (Condition(
                ConditionType.REPLACEMENT, "True", Reason.KARPENTER_REPLACING,
                f"{base}; not deleting NodeClaim {claim.name}: Karpenter is already disrupting it "
                f"({by_karpenter}), and one replacement is enough"),), requeue_after=KARPENTER_RECHECK_S)
        msg = f"{base}; deleting NodeClaim {claim.name} so Karpenter launches a replacement"
        return Plan(claim.name, DELETE_CLAIM, conds, (),
                    (node_ev(EventReason.WARM_DEADLINE_REPLACE, msg, "Warning"),
                     claim_ev(EventReason.WARM_DEADLINE_REPLACE, msg, "Warning")),
                    (), (("deadline", DeadlineOutcome.REPLACE),), deadline=DeadlineOutcome.REPLACE)
    if action == OnDeadline.UNTAINT:
        state = record(Decision.DEADLINE_UNTAINT, conds)
        # The vLLM pods select the profile's generation label: without it they could never land here. The
        # node is marked cold beside it (warm=cold, compile-cache=cold): its local copy is incomplete, so the
        # vLLM pod's start script (nodeclasses/servestart.py) streams the model from S3 or waits for the copy.
        gen = generation(p)
        cold = ("streams the model from S3 (cold, through the publisher's identity)" if cold_mode(p) == "stream" else
                "waits for the agent's copy (the pod has no identity that may read the model from S3)")
        labels = {PROFILE_LABEL: label_value(p.name), MODEL_LABEL: model_label(p), CACHE_LABEL: "cold",
                  WARM_LABEL: "cold", GENERATION_LABEL: gen}
        ops = (identity_guard(node, True) + guarded_taint_removal(node, key) + _label_ops(node, labels)
               + _state_ops(node, state))
        msg = (f"{base}; removed {key} anyway and labelled the node {GENERATION_LABEL}={gen} (the vLLM pods select "
               f"it) and {WARM_LABEL}=cold: until this node's copy is complete, the vLLM pod {cold}, and it "
               "compiles without the compile cache")
        return Plan(claim.name, UNTAINT, conds, tuple(ops),
                    (node_ev(EventReason.WARM_DEADLINE_UNTAINT, msg, "Warning"),
                     claim_ev(EventReason.WARM_DEADLINE_UNTAINT, msg, "Warning")),
                    (), (("deadline", DeadlineOutcome.UNTAINT),), deadline=DeadlineOutcome.UNTAINT)
    state = record(Decision.DEADLINE_KEEP, conds)
    ops = identity_guard(node, True) + _state_ops(node, state)
    if action == OnDeadline.REPLACE:
        msg = (f"{base}; not replacing NodeClaim {claim.name}: a new node would fail the same way "
               f"({gated.reason}). Keeping {key}; fix the cause (profile, instance types, IAM or model source)")
        return Plan(claim.name, RECORD, conds, tuple(ops),
                    (node_ev(EventReason.WARM_DEADLINE_NOT_REPLACED, msg, "Warning"),
                     claim_ev(EventReason.WARM_DEADLINE_NOT_REPLACED, msg, "Warning")),
                    (), (("deadline", DeadlineOutcome.NOT_REPLACED),), deadline=DeadlineOutcome.NOT_REPLACED)
    msg = (f"{base}; keeping {key} (onDeadline=keep): the node stays unschedulable until it turns Warm or "
           "someone acts")
    return Plan(claim.name, RECORD, conds, tuple(ops),
                (node_ev(EventReason.WARM_DEADLINE_KEEP, msg, "Warning"),
                 claim_ev(EventReason.WARM_DEADLINE_KEEP, msg, "Warning")),
                (), (("deadline", DeadlineOutcome.KEEP),), deadline=DeadlineOutcome.KEEP)


def cleanup_held(profile: str, pool: str, keys: list[str], nodeclaims: int, p: WarmProfile | None) -> Condition:
    """Why a deleted profile's clean-up waits, what finishing it costs (the nodes Karpenter would replace, and the
    weights each pulls again), and the ways to finish it."""
    size = p.model.size_gb if p is not None else None
    pull = f", {nodeclaims * size:g} GB of weights pulled again ({nodeclaims} x {size:g} GB)" if size else ""
    taints = " and ".join(keys)
    return Condition(
        CLEANUP_CONDITION, "False", "WouldDrift",
        f"WarmProfile {profile} is deleted, but NodePool {pool} keeps startupTaint {taints}: startupTaints is in "
        f"Karpenter's NodePool hash, so removing it would drift {nodeclaims} live NodeClaim(s) and Karpenter would "
        f"replace those nodes{pull}, compile caches cold. Until then this profile stays (Terminating) and new nodes "
        f"of {pool} are still warmed and untainted. To finish: let {pool} scale to zero nodes (the taint then goes "
        f"and nothing is replaced), or set spec.injection.onLive: drift on this WarmProfile to remove it now and "
        f"replace the {nodeclaims} node(s), or take {taints} out of the NodePool yourself (the same replacement). "
        "Do not remove the finalizer nodewarm.io/cleanup by hand: the taint would stay with nobody to lift it")
