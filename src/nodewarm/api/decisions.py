"""What the controller decides about a warming node, by the names it writes them under.

The controller writes these into its record on the Node (``Decision``), the NodeClaim lifecycle conditions it keeps
in that record (``ConditionType``, ``Reason``) and its Events (``EventReason``); `nodewarm status`, the dashboards
and the e2e tests read them back. The string values are the wire format: a Node already carries them, so a value is
added, never renamed.
"""

from __future__ import annotations

from enum import StrEnum


class Decision(StrEnum):
    """``WarmState.decision``: what the controller did to a node's startup taint (``nodewarm.io/state``)."""
    UNTAINTED = "Untainted"                 # the node reported Warm: the taint was lifted
    DEADLINE_UNTAINT = "DeadlineUntaint"    # readiness.deadline passed, onDeadline=untaint: lifted cold
    DEADLINE_KEEP = "DeadlineKeep"          # the deadline passed and the taint stays (keep, or a refused replace);
                                            # the only decision that is not final: a late Warm still lifts it


class OnDeadline(StrEnum):
    """``spec.readiness.onDeadline``: what to do with a node still not Warm at its deadline."""
    UNTAINT = "untaint"
    REPLACE = "replace"
    KEEP = "keep"


class DeadlineOutcome(StrEnum):
    """What a deadline plan carried out (``Plan.deadline`` and the ``deadline`` metric's label)."""
    UNTAINT = "untaint"
    REPLACE = "replace"
    KEEP = "keep"
    NOT_REPLACED = "not_replaced"           # onDeadline=replace refused: a new node would fail the same way


class ConditionType(StrEnum):
    """The NodeClaim lifecycle conditions the controller computes (kept in its record on the Node)."""
    TRACKED = "Tracked"
    UNTAINTED = "Untainted"
    WARM_DEADLINE = "WarmDeadline"
    REPLACEMENT = "Replacement"
    REPLACEMENTS_PAUSED = "ReplacementsPaused"     # on the WarmProfile: the per-NodePool replace budget


class Reason(StrEnum):
    """Reasons of those conditions that more than the controller reads."""
    NODE_FOUND = "NodeFound"
    NODE_NOT_FOUND = "NodeNotFound"
    NOT_REGISTERED = "NotRegistered"
    NOT_LAUNCHED = "NotLaunched"
    WARMING = "Warming"
    WARM_CONDITION_TRUE = "WarmConditionTrue"
    TAINT_READDED = "TaintReAdded"          # Warm, and the startup taint back on after nodewarm lifted it
    NOT_WARM = "NotWarm"
    WITHIN_DEADLINE = "WithinDeadline"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    KARPENTER_REPLACING = "KarpenterReplacing"
    BUDGET_EXHAUSTED = "BudgetExhausted"
    WITHIN_BUDGET = "WithinBudget"


class EventReason(StrEnum):
    """The controller's Events on the Node and its NodeClaim."""
    UNTAINTED = "Untainted"
    TAINT_READDED = "TaintReAdded"          # the startup taint was back after nodewarm lifted it: lifted again
    WARM_DEADLINE_UNTAINT = "WarmDeadlineUntaint"
    WARM_DEADLINE_REPLACE = "WarmDeadlineReplace"
    WARM_DEADLINE_NOT_REPLACED = "WarmDeadlineNotReplaced"
    WARM_DEADLINE_KEEP = "WarmDeadlineKeep"
    # readiness.engineCheck (nodewarm/controller/enginecheck.py), on the Node.
    ENGINE_CHECK_STARTED = "EngineCheckStarted"            # the check pod was created for the node's request
    ENGINE_CHECK_PASSED = "EngineCheckPassed"              # the node reported the check passed; its pod deleted
    ENGINE_CHECK_FAILED = "EngineCheckFailed"              # ... failed (reason, message, the engine's last lines)
    ENGINE_CHECK_SUPERSEDED = "EngineCheckSuperseded"      # a pod no longer asked for (a newer request, taint gone)
    ENGINE_CHECK_NOT_STARTED = "EngineCheckNotStarted"     # no PodTemplate, or no Role to create the pod with
