"""Where a warming node stands, derived once: the controller plans on it and `nodewarm status` shows it.

Four rules, each used by both (tests/api/test_lifecycle_contract.py holds them to it):

* pairing: which Node is a NodeClaim's (``paired``, ``pair``);
* ownership: which WarmProfile gates a NodePool (``binding_order``, ``pool_owner``) and by which taint key
  (``gating_taint``);
* the deadline's start (``deadline_start``) and when it runs (``DEADLINE_PHASES``);
* which phases leave the controller a decision to make (``UNDECIDED_PHASES``);
* the phase (``phase``): from the NodeClaim's Karpenter conditions, the Node's startup taint, the agent's Warm
  condition and the controller's record.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Iterable, Protocol, Sequence, TypeVar

from .decisions import Decision, Reason
from .names import CLEANUP_FINALIZER
from .timeline import Timeline
from .timeutil import parse_time
from .views import ClaimView, NodeView

# --------------------------------------------------------------------------------------------------- pairing

# Karpenter pairs a NodeClaim with its Node by providerID alone (kubernetes-sigs/karpenter pkg/utils/nodeclaim
# NodeForNodeClaim: a field index on the Node's spec.providerID, and a NodeClaim without status.providerID has no
# Node). status.nodeName is written by Karpenter's registration from that very pairing, so it adds nothing, and it
# can name a Node that is gone while a namesake of another instance registers. Pairing as Karpenter does means the
# controller acts on exactly the Node Karpenter manages for the claim.


def paired(claim: ClaimView, node: NodeView) -> bool:
    return bool(claim.provider_id) and claim.provider_id == node.provider_id


C = TypeVar("C", bound=ClaimView)
N = TypeVar("N", bound=NodeView)


def pair(claims: Sequence[C], nodes: Sequence[N]) -> list[tuple[C | None, N | None]]:
    """Each NodeClaim with its Node (None before it registers), then the Nodes no claim pairs with. Two Nodes with
    one providerID (Karpenter refuses that pair: DuplicateNodeError) pair by the last listed, as the controller's
    index does."""
    by_pid = {n.provider_id: n for n in nodes if n.provider_id}
    out: list[tuple[C | None, N | None]] = []
    used: set[str] = set()
    for c in claims:
        n = by_pid.get(c.provider_id) if c.provider_id else None
        if n is not None:
            used.add(n.name)
        out.append((c, n))
    return out + [(None, n) for n in nodes if n.name not in used]


# --------------------------------------------------------------------------------------------------- ownership

class Bindable(Protocol):
    name: str
    created: float
    deleting: bool
    finalizers: tuple[str, ...]


B = TypeVar("B", bound=Bindable)


def is_held(p: Bindable) -> bool:
    """Deleted, its clean-up still holding it (the finalizer on): it keeps gating its pool's new nodes, so none is
    left under a taint nobody lifts."""
    return p.deleting and CLEANUP_FINALIZER in p.finalizers


def live(profiles: Iterable[B]) -> list[B]:
    """The profiles not deleted, oldest first (creation, then name): a NodePool or NodeClass belongs to the first
    that names it, and a later one is refused (NodePoolTaken)."""
    return sorted((p for p in profiles if not p.deleting), key=lambda p: (p.created, p.name))


def held(profiles: Iterable[B]) -> list[B]:
    return sorted((p for p in profiles if is_held(p)), key=lambda p: (p.created, p.name))


def binding_order(profiles: Iterable[B]) -> list[B]:
    """Who binds a NodePool first: the live profiles, then the held ones. A deleted profile with nothing held binds
    nothing."""
    profiles = list(profiles)
    return live(profiles) + held(profiles)


class Pooled(Bindable, Protocol):
    node_pool: str


P = TypeVar("P", bound=Pooled)


def pool_owner(pool: str, profiles: Iterable[P]) -> P | None:
    return next((p for p in binding_order(profiles) if pool and p.node_pool == pool), None)


def gating_taint(taint_key: str, retired_keys: Iterable[str], node: NodeView | None) -> str:
    """The startup taint that gates this node: the profile's, or, on a node registered before a taintKey rename,
    the retired key it still carries."""
    if node is None or node.has_taint(taint_key):
        return taint_key
    return next((k for k in retired_keys if node.has_taint(k)), taint_key)


# --------------------------------------------------------------------------------------------------- times

def deadline_start(claim: ClaimView | None, node: NodeView) -> float:
    """readiness.deadline counts from registration: the NodeClaim's Registered=True, else the Node's creation."""
    return (claim.registered if claim is not None else None) or node.created


def warm_at(node: NodeView) -> float | None:
    """When the node turned Warm: the agent's timeline (sub-second), else the Warm condition's transition (whole
    seconds); None while it is not Warm."""
    if node.warm is None or node.warm.status != "True":
        return None
    return parse_time(node.timeline.get(Timeline.WARM_REPORTED)) or node.warm.last_transition


# --------------------------------------------------------------------------------------------------- phase

class Phase(StrEnum):
    """In the order a node goes through them; the values are what `nodewarm status` prints."""
    LAUNCHING = "Launching"                     # NodeClaim created, instance not launched yet
    REGISTERING = "Registering"                 # instance launched, no Node yet
    WARMING = "Warming"                         # Node registered under the startup taint, not Warm yet
    WARM = "Warm"                               # reported Warm, the controller has not lifted the taint yet
    SERVING = "Untainted(serving)"              # the controller lifted the taint on Warm
    COLD = "DeadlineUntaint(cold)"              # the deadline passed and onDeadline=untaint lifted it cold
    KEPT = "DeadlineKeep"                       # the deadline passed, the taint stays (keep, or replace refused)
    FAILED = "Failed"                           # the agent reported Warm=False
    REPLACING = "Replacing"                     # the NodeClaim (or Node) is being deleted
    UNTAINTED = "Untainted(external)"           # the taint is gone but nodewarm did not lift it


# The phases in which readiness.deadline runs: the taint is on, nothing is decided, the node is not Warm.
DEADLINE_PHASES = frozenset({Phase.WARMING, Phase.FAILED})
# The phases in which the controller still has a decision to make: lift the taint of a Warm node (a kept one
# included), or run the deadline. In every other the node has no Node yet, is going, or is decided.
UNDECIDED_PHASES = frozenset({Phase.WARM, Phase.KEPT}) | DEADLINE_PHASES

NODECLAIM_DELETING = "NodeClaimDeleting"
NODE_DELETING = "NodeDeleting"
TAINT_GONE = "TaintGone"


@dataclass(frozen=True)
class Stage:
    phase: Phase
    since: float | None             # when the phase began (epoch seconds), if the views say: they leave out the
                                    # deletion time (Replacing), which only `status` shows, from the objects
    reason: str
    message: str


def phase(claim: ClaimView | None, node: NodeView | None, taint_key: str) -> Stage:
    """Where a NodeClaim and its Node (either may be missing, not both) stand, for a profile gating by
    ``taint_key`` (``gating_taint``)."""
    if claim is not None and claim.deleting:
        return Stage(Phase.REPLACING, None, NODECLAIM_DELETING,
                     "Karpenter is terminating the NodeClaim (a replacement, if any, is a new NodeClaim)")
    if node is not None and node.deleting:
        return Stage(Phase.REPLACING, None, NODE_DELETING, "the Node is being deleted")
    if node is None:
        if claim is None:
            raise ValueError("phase of nothing: a NodeClaim or a Node is needed")
        if claim.launched is None:
            return Stage(Phase.LAUNCHING, claim.created or None, Reason.NOT_LAUNCHED,
                         "waiting for Karpenter to launch the instance")
        return Stage(Phase.REGISTERING, claim.launched, Reason.NOT_REGISTERED,
                     "instance launched, its Node has not registered yet")
    state, warm, tainted = node.state, node.warm, node.has_taint(taint_key)
    warm_true = warm is not None and warm.status == "True"
    reason, message = (warm.reason, warm.message) if warm is not None else ("", "")
    if state is not None and state.decision == Decision.UNTAINTED:
        return Stage(Phase.SERVING, parse_time(state.decided), reason or Decision.UNTAINTED, message)
    if state is not None and state.decision == Decision.DEADLINE_UNTAINT:
        return Stage(Phase.COLD, parse_time(state.decided), Reason.DEADLINE_EXCEEDED,
                     message or "not Warm by the deadline: untainted cold")
    if state is not None and state.decision == Decision.DEADLINE_KEEP and tainted and not warm_true:
        return Stage(Phase.KEPT, parse_time(state.decided), reason or Reason.DEADLINE_EXCEEDED,
                     message or "not Warm by the deadline: the taint stays")
    if not tainted:
        if warm_true:
            return Stage(Phase.SERVING, warm.last_transition, reason, message)
        return Stage(Phase.UNTAINTED, None, TAINT_GONE, f"{taint_key} is not on the node and nodewarm did not lift it")
    if warm_true:
        return Stage(Phase.WARM, warm_at(node), reason, message)
    if warm is not None and warm.status == "False":
        return Stage(Phase.FAILED, warm.last_transition, reason, message)
    return Stage(Phase.WARMING, deadline_start(claim, node), Reason.WARMING,
                 "the node agent has not reported nodewarm.io/Warm yet")
