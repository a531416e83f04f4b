"""Where a warming node stands, derived once: the controller plans on it and `nodewarm status` shows it.

Four rules, each used by both (tests/api/test_lifecycle_contract.py holds them to it):

* pairing: which Node is a NodeClaim's (``paired``, ``pair``);
* ownership: which WarmProfile gates a NodePool (``binding_order``, ``pool_owner``) and by which taint key
  (``gating_taint``);
* the deadline's start (``deadline_start``) and when it runs (``DEADLINE_PHASES``);
* which phases leave the controller a decision to make (``UNDECIDED_PHASES``);
* registration (``registration_pending``): nothing is decided before Karpenter has registered the node;
* the phase (``phase``): from the NodeClaim's Karpenter conditions, the Node's taints as they are, the agent's Warm
  condition and the controller's record, which is history: a lift the Node contradicts (``readded``) is undone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Iterable, Protocol, Sequence, TypeVar

from .decisions import Decision, Reason
from .names import CLEANUP_FINALIZER
from .timeline import Timeline
from .timeutil import parse_time
from .views import UNREGISTERED_TAINT, ClaimView, NodeView, WarmState

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


# --------------------------------------------------------------------------------------------------- registration

# Karpenter's registration (kubernetes-sigs/karpenter pkg/controllers/nodeclaim/lifecycle/registration.go, syncNode)
# appends every NodeClaim spec.taints and spec.startupTaints entry whose key and effect the Node lacks, then removes
# karpenter.sh/unregistered and sets Registered=True; registration hooks can hold it back, merging again on every
# pass, while the unregistered taint stays. A startup taint lifted before then comes back, and Karpenter never lifts
# it (kubernetes-sigs/karpenter #1772). Before registration Karpenter's own registration timeout (15 min from launch)
# guards the node, so nodewarm decides nothing until both marks say it is done: the Node's taint is gone (the merge
# happened in that same write) and the NodeClaim is Registered=True (Karpenter will not merge again).


def registration_pending(claim: ClaimView | None, node: NodeView) -> str:
    """Why Karpenter has not finished registering ``node`` ("" once it has)."""
    if node.has_taint(UNREGISTERED_TAINT):
        why = f" ({claim.registering})" if claim is not None and claim.registering else ""
        return f"the Node still carries {UNREGISTERED_TAINT}: Karpenter has not registered it{why}"
    if claim is not None and claim.registered is None:
        return (f"NodeClaim {claim.name} is not Registered=True yet"
                + (f" ({claim.registering})" if claim.registering else ""))
    return ""


# The decisions that lift the startup taint.
LIFTS = frozenset({Decision.UNTAINTED, Decision.DEADLINE_UNTAINT})


def readded(node: NodeView, taint_key: str) -> WarmState | None:
    """The controller's record of a lift that the Node contradicts (the taint is on it again: put back by Karpenter's
    registration, an operator, a re-apply), else None. Such a node is undecided again."""
    state = node.state
    if state is not None and state.decision in LIFTS and node.has_taint(taint_key):
        return state
    return None


# --------------------------------------------------------------------------------------------------- phase

class Phase(StrEnum):
    """In the order a node goes through them; the values are what `nodewarm status` prints."""
    LAUNCHING = "Launching"                     # NodeClaim created, instance not launched yet
    REGISTERING = "Registering"                 # instance launched, Karpenter has not registered its Node yet
    WARMING = "Warming"                         # Node registered under the startup taint, not Warm yet
    WARM = "Warm"                               # reported Warm, the controller has not lifted the taint yet
    SERVING = "Untainted(serving)"              # the controller lifted the taint on Warm, and it stays off
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
WARM_BEFORE_REGISTRATION = "WarmBeforeRegistration"


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
    warm, tainted = node.warm, node.has_taint(taint_key)
    warm_true = warm is not None and warm.status == "True"
    waiting = registration_pending(claim, node)
    if waiting:
        since = (claim.launched if claim is not None else None) or node.created
        if warm_true:
            return Stage(Phase.REGISTERING, since, WARM_BEFORE_REGISTRATION,
                         f"the node reported Warm, but {waiting}; {taint_key} is lifted once it has (Karpenter's "
                         "registration merges the NodeClaim's startupTaints back into the Node: a lift before it "
                         "would not stay)")
        return Stage(Phase.REGISTERING, since, Reason.NOT_REGISTERED, waiting)
    back = readded(node, taint_key)
    state = None if back is not None else node.state
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
    again = f"{taint_key} is back on the node after nodewarm lifted it at {back.decided}" if back is not None else ""
    if warm_true:
        if back is not None:
            return Stage(Phase.WARM, warm_at(node), Reason.TAINT_READDED, f"{again}; the controller lifts it again")
        return Stage(Phase.WARM, warm_at(node), reason, message)
    if warm is not None and warm.status == "False":
        return Stage(Phase.FAILED, warm.last_transition, reason, f"{message}; {again}" if again else message)
    return Stage(Phase.WARMING, deadline_start(claim, node), Reason.WARMING,
                 "the node agent has not reported nodewarm.io/Warm yet" + (f"; {again}" if again else ""))
