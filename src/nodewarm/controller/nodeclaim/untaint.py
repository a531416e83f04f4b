"""Untaint phase -> condition Untainted: the Node reported nodewarm.io/Warm=True, so the write lifts the readiness
taint, labels the node (the generation it warmed included) and records the decision. A node kept past its deadline
(onDeadline=keep) that turns Warm late is lifted the same way; until then it waits for the node's next change. So is
a node whose taint is back after a lift (nodewarm.api.lifecycle.readded): told as TaintReAdded, and counted."""

from __future__ import annotations

import re

from nodewarm.api import lifecycle
from nodewarm.api.decisions import ConditionType, Decision, EventReason, Reason
from nodewarm.api.lifecycle import Phase
from nodewarm.api.timeutil import parse_time
from nodewarm.api.names import (
    CACHE_ANNOTATION, CACHE_LABEL, CACHE_OUTCOMES, CACHE_REASON_ANNOTATION, GENERATION_LABEL, MODEL_LABEL,
    PROFILE_LABEL, WARM_LABEL,
)
from nodewarm.api.views import Condition, NodeView, WarmState, warm_generation
from nodewarm.api.warmprofile import WarmProfile

from .phase import Lift, Observed, Step, phase_times


_LABEL_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def label_value(s: str) -> str:
    """Squeeze any string into a valid label value (<= 63 chars, alnum at both ends)."""
    v = _LABEL_BAD.sub("-", s)[:63]
    return v.strip("-_.")


def model_label(p: WarmProfile) -> str:
    """The model's last path element (+ revision): what an operator recognises in `kubectl get nodes -L`."""
    name = p.model.uri.rstrip("/").rsplit("/", 1)[-1]
    return label_value(f"{name}-{p.model.revision}" if p.model.revision else name)


def node_labels(p: WarmProfile, lift: Lift) -> dict[str, str]:
    """What a node whose taint comes off is labelled (here or at its deadline, deadline.py): the profile and model,
    the compile cache's outcome, warm or cold, the generation the vLLM pods select on, and the label of each further
    model the node reports warm (the model's pods select it)."""
    labels = {PROFILE_LABEL: label_value(p.name), MODEL_LABEL: model_label(p), CACHE_LABEL: lift.cache,
              WARM_LABEL: lift.warm}
    if lift.generation:
        labels[GENERATION_LABEL] = lift.generation
    labels.update({c.key: c.value for c in lift.models})
    return labels


def condition(p: WarmProfile, node: NodeView) -> Condition:
    w = node.warm
    if w is None:
        return Condition(ConditionType.UNTAINTED, "False", Reason.WARMING, f"waiting for {p.readiness.taint_key} to "
                         "be lifted: the node has not reported nodewarm.io/Warm yet")
    if w.status == "True":
        return Condition(ConditionType.UNTAINTED, "True", Reason.WARM_CONDITION_TRUE,
                         f"node reported Warm ({w.reason}: {w.message})")
    return Condition(ConditionType.UNTAINTED, "False", w.reason or Reason.NOT_WARM,
                     f"node reports Warm={w.status}: {w.message}")


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


def reconcile(seen: Observed, earlier: tuple[Condition, ...]) -> Step:
    p, node = seen.profile, seen.node
    gated = condition(p, node)
    if seen.stage.phase is Phase.KEPT:
        return Step((gated,), done=True)        # the node's next change brings it back
    if seen.stage.phase is not Phase.WARM:
        return Step((gated,))
    kept = node.state is not None and node.state.decision == Decision.DEADLINE_KEEP
    back = lifecycle.readded(node, seen.taint_key)
    # Only the contract's values reach labels and metric labels (an odd annotation must not mint series).
    cache = node.annotations.get(CACHE_ANNOTATION, "")
    cache = cache if cache in CACHE_OUTCOMES else "unknown"
    why = node.annotations.get(CACHE_REASON_ANNOTATION, "")
    msg = (f"removed {seen.taint_key}: node Warm ({node.warm.reason}); model {model_label(p)}, compile cache {cache}"
           + (f" ({why})" if why else "") + ("; after its deadline (onDeadline=keep)" if kept else ""))
    lift = Lift("true", cache, warm_generation(node.annotations))
    if back is not None:
        msg = f"{seen.taint_key} was back on the node after nodewarm lifted it at {back.decided} ({_who(seen, back)}); " \
              f"{msg}"
        # Counted as a lift again, never timed again: the node's phases were observed at the first lift.
        return Step((gated,), done=True, decision=Decision.UNTAINTED, lift=lift,
                    events=seen.events(EventReason.TAINT_READDED, msg, "Warning", f"node {node.name}: {msg}"),
                    counters=(("taints_removed", ""), ("taints_readded", "")))
    return Step(
        (gated,), done=True, decision=Decision.UNTAINTED,
        # The generation label the vLLM pods select on, in this same write (nodewarm/bootstrap/nodestatus.py says why).
        lift=lift,
        events=seen.events(EventReason.UNTAINTED, msg, claim_message=f"node {node.name}: {msg}"),
        durations=_durations(phase_times(seen.claim, node), seen.now),
        # Only "cold" is final at warm time; hit/miss are counted when serving proves them (the manager's Node
        # handler), so a restored bundle is never counted as if it were a hit.
        counters=(("taints_removed", ""),) + ((("compile_cache", cache),) if cache == "cold" else ()))


def _who(seen: Observed, back: WarmState) -> str:
    """Who most likely put the taint back: Karpenter's registration if it completed after the lift (it merges the
    NodeClaim's startupTaints into the Node; the record holds the registration time known when it lifted, which a
    lift before registration took from the Node's creation), else someone or something else."""
    if seen.claim.registered is not None and parse_time(back.registered) != seen.claim.registered:
        return "Karpenter's registration merges the NodeClaim's startupTaints into the Node"
    return "not by nodewarm: an operator, a re-apply, or another controller"
