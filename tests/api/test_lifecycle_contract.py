"""The controller and `nodewarm status` agree on where a node stands: one table of object states, both sides real.

For each state, the controller side is its own code: the manager's informer handlers index the objects (the
NodeClaim<->Node pairing, the profiles bound to each NodePool, a held profile included), the NodeClaim reconciler
picks the taint key, and its planner decides (nodewarm.controller.nodeclaim.plan's plan_claim: the phases track,
untaint, deadline).
The status side is `nodewarm status`'s rows over the same objects. The row says the phase before the controller
acts; the plan's write (its JSON patch on the Node, or the NodeClaim's deletion) is applied as the API server would,
and the row after it is the phase the decision leads to. Besides the table, every state holds the rules that tie
the two together: a phase with no decision left is planned nothing, a Warm node is untainted, the deadline `status`
counts down is the one the planner waits for, and a decision, once written, is not made again. Pure: no servers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from kubernetes import client

from nodewarm.api import lifecycle
from nodewarm.api.decisions import DeadlineOutcome, Reason
from nodewarm.api.lifecycle import Phase
from nodewarm.api.names import CLEANUP_CONDITION, CLEANUP_FINALIZER, STATE_ANNOTATION
from nodewarm.api.views import DISRUPTION_CONDITION, UNREGISTERED_TAINT
from nodewarm.controller.nodeclaim import deadline
from nodewarm.controller.nodeclaim import plan as planner
from nodewarm.controller.manager import Controller
from nodewarm.controller.options import ControllerOptions
from nodewarm.status.observed import Observed
from nodewarm.status.rows import Row, rows
from support.builders import POOL, TAINT, condition, node, nodeclaim, stamp, v
from support.jsonpatch import apply_json_patch

T0 = 1_800_000_000.0            # the NodeClaim registers
SOON = T0 + 300                 # 5 min in: within the 20m deadline
LATE = T0 + 1500                # 25 min in: past it
PID = "aws:///us-west-2a/i-0abc"
OLD_KEY = "nodewarm.io/warming-v1"
UNREG = {"key": UNREGISTERED_TAINT, "effect": "NoExecute"}
FIXABLE = "S3Throttled"         # a Warm=False reason a new node may not hit again


def profile(name: str = "qwen3-35b", on_deadline: str = "untaint", created: float = T0 - 86400, **kw) -> dict:
    doc = v(metadata__name=name, spec__readiness__onDeadline=on_deadline, **kw)
    doc["metadata"].update(uid=f"uid-{name}", creationTimestamp=stamp(created))
    return doc


def held(doc: dict, finalizers=(CLEANUP_FINALIZER,)) -> dict:
    """``doc`` deleted, its clean-up holding it (the finalizer on, the controller's Cleanup condition)."""
    doc["metadata"].update(deletionTimestamp=stamp(T0 - 60), finalizers=list(finalizers))
    doc["status"] = {"conditions": [condition(CLEANUP_CONDITION, "False", "WouldDrift", T0 - 50,
                                              "removing it would drift 1 live NodeClaim(s)")]}
    return doc


def claim(**kw) -> dict:
    args = dict(created=T0 - 90, launched=T0 - 80, registered=T0, provider_id=PID)
    return nodeclaim("gpu-p5-abcde", **{**args, **kw})


def the_node(c: dict | None = None, *, warm: str | dict | None = None, record: str | None = None,
             taints=(TAINT,), annotations: dict | None = None, **kw) -> dict:
    ann = dict(annotations or {})
    if record:
        ann[STATE_ANNOTATION] = ('{"profile":"qwen3-35b","nodeClaim":"gpu-p5-abcde","decision":"%s",'
                                 '"decided":"%s","conditions":[]}' % (record, stamp(T0 + 1300)))
    # The kubelet creates the Node a moment before Karpenter marks the claim Registered: the deadline counts from the
    # latter.
    return node("ip-10-0-1-1.ec2.internal", claim=c if c is not None else claim(), created=T0 - 2, warm=warm,
                warm_at=T0 + 200, taints=taints, annotations=ann, **kw)


def failed(reason: str) -> dict:
    return condition("nodewarm.io/Warm", "False", reason, T0 + 200, "the agent gave up")


@dataclass(frozen=True)
class Case:
    claim: dict
    node: dict | None
    now: float
    before: Phase | None        # what `status` shows first (None: no row, no profile gates the pool)
    action: str                 # what the controller plans
    after: Phase | None         # what `status` shows once that is written
    profiles: list[dict] = field(default_factory=lambda: [profile()])
    outcome: str = ""           # the deadline plan's outcome, if any
    extra_nodes: tuple[dict, ...] = ()


def _namesake_case() -> Case:
    # Registered, its Node not (yet) seen; status.nodeName names a Node of another instance under the same name, Warm
    # under its taint. Karpenter pairs by providerID alone: that Node is not this claim's, nobody lifts its taint.
    c = claim()
    c["status"]["nodeName"] = "ip-10-0-9-9.ec2.internal"
    other = node("ip-10-0-9-9.ec2.internal", pool=POOL, provider_id="aws:///us-west-2a/i-0other", created=T0,
                 warm="True", warm_at=T0 + 100)
    return Case(c, None, SOON, Phase.REGISTERING, planner.NONE, Phase.REGISTERING, extra_nodes=(other,))


def _cases() -> dict[str, Case]:
    c = claim()
    disrupted = claim()
    disrupted["status"]["conditions"].append(condition(DISRUPTION_CONDITION, "True", "Drifted", LATE - 10))
    initialized = claim()
    initialized["status"]["conditions"].append(condition("Initialized", "True", "Initialized", T0 + 260))
    unregistered = claim(registered=None)
    hooked = claim(registered=None)
    hooked["status"]["conditions"][1] = condition("Registered", "Unknown", "RegistrationHookPending", T0 - 80,
                                                  "capacity-reservation")
    cases = {
        "launching": Case(nodeclaim("gpu-p5-abcde", created=T0 - 30), None, SOON, Phase.LAUNCHING, planner.NONE,
                          Phase.LAUNCHING),
        "launched": Case(claim(registered=None), None, SOON, Phase.REGISTERING, planner.NONE, Phase.REGISTERING),
        "registered, node missing": Case(c, None, SOON, Phase.REGISTERING, planner.NONE, Phase.REGISTERING),
        "registered, a namesake node": _namesake_case(),
        "warming": Case(c, the_node(), SOON, Phase.WARMING, planner.NONE, Phase.WARMING),
        "warming, Warm=Unknown": Case(c, the_node(warm=condition("nodewarm.io/Warm", "Unknown", "Pulling", T0 + 5)),
                                      SOON, Phase.WARMING, planner.NONE, Phase.WARMING),
        "warm": Case(c, the_node(warm="True"), SOON, Phase.WARM, planner.UNTAINT, Phase.SERVING),
        "warm, generation reported": Case(c, the_node(warm="True", annotations={
            "nodewarm.io/warm-generation": "4f2a9c1e0b7d3a65"}), SOON, Phase.WARM, planner.UNTAINT, Phase.SERVING),
        "failed, within the deadline": Case(c, the_node(warm=failed("NotInstanceStore")), SOON, Phase.FAILED,
                                            planner.NONE, Phase.FAILED),
        "past the deadline, untaint": Case(c, the_node(), LATE, Phase.WARMING, planner.UNTAINT, Phase.COLD,
                                           outcome=DeadlineOutcome.UNTAINT),
        "past the deadline, keep": Case(c, the_node(), LATE, Phase.WARMING, planner.RECORD, Phase.KEPT,
                                        [profile(on_deadline="keep")], DeadlineOutcome.KEEP),
        "past the deadline, replace": Case(c, the_node(), LATE, Phase.WARMING, planner.DELETE_CLAIM, Phase.REPLACING,
                                           [profile(on_deadline="replace")], DeadlineOutcome.REPLACE),
        "past the deadline, replace, Karpenter already disrupting": Case(
            disrupted, the_node(disrupted), LATE, Phase.WARMING, planner.NONE, Phase.WARMING,
            [profile(on_deadline="replace")]),
        "kept, still not Warm": Case(c, the_node(record="DeadlineKeep"), LATE, Phase.KEPT, planner.NONE, Phase.KEPT,
                                     [profile(on_deadline="keep")]),
        "kept, then Warm": Case(c, the_node(warm="True", record="DeadlineKeep"), LATE, Phase.WARM, planner.UNTAINT,
                                Phase.SERVING, [profile(on_deadline="keep")]),
        "a record that is not ours, Warm": Case(c, the_node(warm="True", record="Bogus"), SOON, Phase.WARM,
                                                planner.UNTAINT, Phase.SERVING),
        "untainted by the controller": Case(c, the_node(warm="True", record="Untainted", taints=()), LATE,
                                            Phase.SERVING, planner.NONE, Phase.SERVING),
        "initialized": Case(initialized, the_node(initialized, warm="True", record="Untainted", taints=()), LATE,
                            Phase.SERVING, planner.NONE, Phase.SERVING),
        "untainted cold at the deadline": Case(c, the_node(record="DeadlineUntaint", taints=()), LATE, Phase.COLD,
                                               planner.NONE, Phase.COLD),
        "untainted by someone else": Case(c, the_node(taints=()), SOON, Phase.UNTAINTED, planner.NONE,
                                          Phase.UNTAINTED),
        "claim deleting": Case(claim(deleting=T0 + 250), the_node(), SOON, Phase.REPLACING, planner.NONE,
                               Phase.REPLACING),
        "held profile in clean-up, warm": Case(c, the_node(warm="True"), SOON, Phase.WARM, planner.UNTAINT,
                                               Phase.SERVING, [held(profile())]),
        "held profile in clean-up, past the deadline": Case(c, the_node(), LATE, Phase.WARMING, planner.RECORD,
                                                            Phase.KEPT, [held(profile(on_deadline="keep"))],
                                                            DeadlineOutcome.KEEP),
        "a deleted profile, nothing held": Case(c, the_node(warm="True"), SOON, None, planner.NONE, None,
                                                [held(profile(), finalizers=())]),
        "two profiles name the pool: the oldest binds it": Case(c, the_node(), LATE, Phase.WARMING, planner.RECORD,
                                                                Phase.KEPT, [profile("a-newer", created=T0 - 60),
                                                                             profile("z-older", "keep")],
                                                                DeadlineOutcome.KEEP),
        "a live profile comes before a held one": Case(c, the_node(), LATE, Phase.WARMING, planner.UNTAINT,
                                                       Phase.COLD, [held(profile("z-held", "keep", created=T0 - 9e5)),
                                                                    profile("a-live", created=T0 - 60)],
                                                       DeadlineOutcome.UNTAINT),
        # Karpenter's registration merges the NodeClaim's startupTaints back into the Node: nothing is lifted before
        # it (the Node's unregistered taint, or a NodeClaim not yet Registered=True, both say so).
        "warm before registration": Case(unregistered, the_node(unregistered, warm="True", taints=(TAINT, UNREG)),
                                         SOON, Phase.REGISTERING, planner.NONE, Phase.REGISTERING),
        "warm, registration held by a hook": Case(hooked, the_node(hooked, warm="True", taints=(TAINT, UNREG)), SOON,
                                                  Phase.REGISTERING, planner.NONE, Phase.REGISTERING),
        "warm, the Node synced, the NodeClaim not yet Registered": Case(
            unregistered, the_node(unregistered, warm="True"), SOON, Phase.REGISTERING, planner.NONE,
            Phase.REGISTERING),
        "warming before registration, past the deadline's length": Case(
            unregistered, the_node(unregistered, taints=(TAINT, UNREG)), LATE, Phase.REGISTERING, planner.NONE,
            Phase.REGISTERING),
        # A record is history; the Node's taints are the truth.
        "untainted, the taint put back, Warm": Case(c, the_node(warm="True", record="Untainted"), LATE, Phase.WARM,
                                                    planner.UNTAINT, Phase.SERVING),
        "untainted cold, the taint put back, still not Warm": Case(
            c, the_node(record="DeadlineUntaint"), LATE, Phase.WARMING, planner.UNTAINT, Phase.COLD,
            outcome=DeadlineOutcome.UNTAINT),
        "untainted, the taint put back, Warm=False within the deadline": Case(
            c, the_node(warm=failed(FIXABLE), record="Untainted"), SOON, Phase.FAILED, planner.NONE, Phase.FAILED),
        "gated by a retired taint key": Case(c, the_node(warm="True", taints=({**TAINT, "key": OLD_KEY},)), SOON,
                                             Phase.WARM, planner.UNTAINT, Phase.SERVING, [retired(profile())]),
    }
    node_deleting = the_node()
    node_deleting["metadata"]["deletionTimestamp"] = stamp(T0 + 250)
    cases["node deleting"] = Case(c, node_deleting, SOON, Phase.REPLACING, planner.NONE, Phase.REPLACING)
    # Failed with each reason, at the deadline, for each onDeadline: a reason a new node would hit again is not
    # replaced (the taint stays: DeadlineKeep), a fixable one is.
    for reason in sorted(deadline.UNFIXABLE_REASONS) + [FIXABLE]:
        for on_deadline, action, after, outcome in (
                ("untaint", planner.UNTAINT, Phase.COLD, DeadlineOutcome.UNTAINT),
                ("keep", planner.RECORD, Phase.KEPT, DeadlineOutcome.KEEP),
                ("replace", planner.DELETE_CLAIM, Phase.REPLACING, DeadlineOutcome.REPLACE) if reason == FIXABLE else
                ("replace", planner.RECORD, Phase.KEPT, DeadlineOutcome.NOT_REPLACED)):
            cases[f"failed {reason}, onDeadline={on_deadline}"] = Case(
                c, the_node(warm=failed(reason)), LATE, Phase.FAILED, action, after, [profile(on_deadline=on_deadline)],
                outcome)
    return cases


def retired(doc: dict) -> dict:
    """The profile renamed its taintKey; nodes registered before carry the old one (status.injected says which)."""
    doc["status"] = {"injected": {"retiredTaintKeys": [OLD_KEY]}}
    return doc


CASES = _cases()


def controller_plan(case: Case, claim_obj: dict, nodes: list[dict]) -> planner.Plan:
    """The controller's own path to a plan, without the API server: its informer handlers index what the watches
    would deliver, then its pairing (node_for), its binding of profiles to pools (profile_index.for_pool, held profiles
    included), the NodeClaim reconciler's retired-key gating and the planner."""
    mgr = Controller(client.ApiClient(), ControllerOptions())
    for o in case.profiles:
        mgr.profiles._apply("ADDED", o)
    mgr.claims._apply("ADDED", claim_obj)
    for n in nodes:
        mgr.nodes._apply("ADDED", n)
    cv = mgr.claims.store[claim_obj["metadata"]["name"]]
    p, nv = mgr.profile_index.for_pool(cv.nodepool), mgr.node_for(cv)
    if p is not None and nv is not None and not nv.has_taint(p.readiness.taint_key):
        p = mgr.nodeclaim._gated_by_retired_key(p, nv)
    return planner.plan_claim(cv, nv, p, case.now)


def status_row(case: Case, claim_obj: dict, nodes: list[dict]) -> Row | None:
    """`nodewarm status`'s row for the claim."""
    rs = rows(Observed(nodes=nodes, claims=[claim_obj], profiles=case.profiles), case.now)
    return next((r for r in rs if r.node_claim == claim_obj["metadata"]["name"]), None)


def written(plan: planner.Plan, case: Case) -> tuple[dict, dict | None]:
    """The cluster after the plan's one write, as the API server applies it."""
    if plan.action == planner.DELETE_CLAIM:     # the termination finalizer holds it: deleting, not gone
        return {**case.claim, "metadata": {**case.claim["metadata"], "deletionTimestamp": stamp(case.now)}}, case.node
    if plan.action in (planner.UNTAINT, planner.RECORD):
        return case.claim, apply_json_patch(case.node, list(plan.node_ops))
    return case.claim, case.node


@pytest.mark.parametrize("name", CASES)
def test_status_shows_the_phase_the_controller_plans_on(name):
    case = CASES[name]
    nodes = [n for n in (case.node,) if n is not None] + list(case.extra_nodes)
    before = status_row(case, case.claim, nodes)
    plan = controller_plan(case, case.claim, nodes)
    claim_after, node_after = written(plan, case)
    nodes_after = [n for n in (node_after,) if n is not None] + list(case.extra_nodes)
    after = status_row(case, claim_after, nodes_after)
    got = (before.phase if before else None, plan.action, after.phase if after else None, plan.deadline)
    assert got == (case.before, case.action, case.after, case.outcome)

    if before is None:
        return
    # A phase with no decision left (no Node yet, going, decided), or a kept node not Warm, is planned nothing.
    if before.phase not in lifecycle.UNDECIDED_PHASES or before.phase is Phase.KEPT:
        assert (plan.action, plan.events) == (planner.NONE, ())
    # A Warm node is untainted, on the spot.
    if before.phase is Phase.WARM:
        assert plan.action == planner.UNTAINT and not plan.deadline
    # The deadline `status` counts down is the one the planner waits for, from the same start.
    if before.phase in lifecycle.DEADLINE_PHASES:
        assert before.deadline_left_s is not None
        if before.deadline_left_s > 0:
            assert plan.action == planner.NONE and plan.requeue_after == pytest.approx(before.deadline_left_s)
        else:
            assert plan.deadline or any(c.reason == Reason.KARPENTER_REPLACING for c in plan.conditions)
    else:
        assert before.deadline_left_s is None and not plan.deadline
    # Once written, a decision is not made again: the next plan on what was written does nothing.
    again = controller_plan(case, claim_after, nodes_after)
    assert again.action == planner.NONE and again.events == ()
