"""What a NodeClaim phase reads (``Observed``) and what it returns (``Step``).

A phase (track.py, untaint.py, deadline.py) is a pure function ``(Observed, earlier conditions) -> Step``, the clock
passed in: its condition and, once it decides, what the one write should do (lift the taint, record the decision on
the Node, or delete the NodeClaim), with the events and metrics that go with it. plan.py runs the phases in order,
as Karpenter's NodeClaim lifecycle controller runs launch, registration, initialization and liveness, and turns the
deciding Step into the one guarded write.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodewarm.api import lifecycle
from nodewarm.api.decisions import Decision
from nodewarm.api.views import ClaimView, Condition, NodeView
from nodewarm.api.warmprofile import WarmProfile

from ..events import EventSpec
from ..modellabels.plan import Change


@dataclass(frozen=True)
class Observed:
    """The NodeClaim, its Node (None before it registers), the profile gating its pool, the clock, and where the
    node stands (nodewarm.api.lifecycle, the phase `nodewarm status` shows)."""

    claim: ClaimView
    node: NodeView | None
    profile: WarmProfile
    now: float
    stage: lifecycle.Stage

    @property
    def taint_key(self) -> str:
        return self.profile.readiness.taint_key

    def events(self, reason: str, message: str, type: str = "Normal",
               claim_message: str | None = None) -> tuple[EventSpec, EventSpec]:
        """One decision, told on the Node and on its NodeClaim (`kubectl describe` on either shows it)."""
        node, claim = self.node, self.claim
        return (EventSpec("Node", node.name, node.uid, reason, message, type),
                EventSpec("NodeClaim", claim.name, claim.uid, reason, claim_message or message, type))


@dataclass(frozen=True)
class Lift:
    """The readiness taint comes off in the write, and the node is labelled for what it now serves."""

    warm: str                       # nodewarm.io/warm: "true" (reported Warm) or "cold" (lifted at its deadline)
    cache: str                      # nodewarm.io/compile-cache: the outcome at warm time, "cold" when lifted cold
    generation: str | None          # the generation label the vLLM pods select on (None: no label)
    models: tuple[Change, ...] = ()  # the further models' labels (spec.models), set in this same write (plan.py)


@dataclass(frozen=True)
class Step:
    conditions: tuple[Condition, ...]
    done: bool = False                      # this phase decided: the later ones do not run
    decision: Decision | None = None        # recorded on the Node (nodewarm.io/state) in the write
    lift: Lift | None = None
    delete_claim: bool = False              # the write is the NodeClaim's deletion (Karpenter replaces the node)
    events: tuple[EventSpec, ...] = ()
    durations: tuple[tuple[str, float], ...] = ()   # (phase, seconds) to observe once the write succeeds
    counters: tuple[tuple[str, str], ...] = ()      # (metric, label)
    requeue_after: float | None = None
    deadline: str = ""                      # the onDeadline action this step carries out, if any


def phase_times(claim: ClaimView, node: NodeView) -> dict[str, float | None]:
    """launched / registered from Karpenter's conditions; warm from the bootstrap's timeline (sub-second)
    or, failing that, the Warm condition's transition time (whole seconds)."""
    return {"launched": claim.launched, "registered": lifecycle.deadline_start(claim, node),
            "warm": lifecycle.warm_at(node)}
