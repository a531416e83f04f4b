"""Track phase -> condition Tracked: launched / registered / node found, from Karpenter's own conditions. It ends
the plan when nothing is left to decide: no Node yet, or it is going; a decision already recorded on the Node; the
taint lifted by someone else. In particular a restarted controller sends no second event or metric."""

from __future__ import annotations

from nodewarm.api import lifecycle
from nodewarm.api.decisions import ConditionType, Reason
from nodewarm.api.views import ClaimView, Condition, NodeView

from .phase import Observed, Step


def condition(claim: ClaimView, node: NodeView | None) -> Condition:
    if node is not None:
        return Condition(ConditionType.TRACKED, "True", Reason.NODE_FOUND,
                         f"node {node.name} carries providerID {claim.provider_id}")
    if claim.registered is not None:
        return Condition(ConditionType.TRACKED, "False", Reason.NODE_NOT_FOUND, f"NodeClaim is Registered but no Node "
                         f"has providerID {claim.provider_id}; it was deleted or has not reached the cache yet")
    if claim.launched is not None:
        return Condition(ConditionType.TRACKED, "False", Reason.NOT_REGISTERED,
                         "instance launched, node not registered yet")
    return Condition(ConditionType.TRACKED, "False", Reason.NOT_LAUNCHED, "waiting for Karpenter to launch the instance")


def reconcile(seen: Observed, earlier: tuple[Condition, ...]) -> Step:
    # Only "keep" waits on among the decisions: a node that turns Warm after its deadline is still untainted.
    return Step((condition(seen.claim, seen.node),), done=seen.stage.phase not in lifecycle.UNDECIDED_PHASES)
