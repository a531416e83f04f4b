"""Budget -> condition ReplacementsPaused (on the WarmProfile): the per-NodePool replace budget a deadline replace
(deadline.py) waits for before the reconciler deletes the NodeClaim.

At most ``budget`` replacements per NodePool in any ``window_s``; after the k-th, the next waits
``backoff_base_s * 2**(k-1)`` (capped): a pool whose nodes keep failing stops costing instances. ``replace_gate`` is
the rule, pure; ``ReplaceBudget`` is what it is applied to: when this replica replaced each pool's nodes during its
term (a new leader starts with a full budget). ``held_back`` and ``profile_condition`` turn a closed gate into the
plan and the condition the reconciler writes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from nodewarm.api.decisions import ConditionType, Reason
from nodewarm.api.timeutil import fmt_time
from nodewarm.api.views import Condition

from .plan import Plan


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


def held_back(plan: Plan, gate: ReplaceGate, now: float) -> Plan:
    """A replace the budget does not allow yet: no write, its conditions kept, back when the gate opens."""
    return Plan(plan.claim, conditions=plan.conditions, requeue_after=gate.until - now)


def profile_condition(gate: ReplaceGate, conditions: tuple[dict, ...]) -> Condition | None:
    """The ReplacementsPaused condition to write among the WarmProfile's ``conditions``, if any: a pool never
    paused has no condition to clear."""
    old = next((c for c in conditions if c.get("type") == gate.condition.type), None)
    return None if old is None and gate.condition.status == "False" else gate.condition


class ReplaceBudget:
    """This term's replacements per NodePool, and the gate they give."""

    def __init__(self, policy: ReplacePolicy):
        self.policy = policy
        self._lock = threading.Lock()
        self._replaced: dict[str, list[float]] = {}     # NodePool -> when we replaced its nodes (this term)

    def gate(self, pool: str, now: float, reserve: bool) -> ReplaceGate:
        """The gate for ``pool`` now; ``reserve`` counts a replacement it allows (undone by ``unreserve``)."""
        with self._lock:
            history = self._replaced.setdefault(pool, [])
            history[:] = [t for t in history if now - t < self.policy.window_s]
            gate = replace_gate(pool, tuple(history), now, self.policy)
            if gate.allowed and reserve:
                history.append(now)
        return gate

    def unreserve(self, pool: str) -> None:
        """The replacement reserved last was not sent (the write failed or the Lease ran out)."""
        with self._lock:
            if self._replaced.get(pool):
                self._replaced[pool].pop()
