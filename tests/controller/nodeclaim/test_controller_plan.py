"""The NodeClaim's pure planning (nodeclaim/): no servers."""

from __future__ import annotations

import copy
import json

import pytest

from nodewarm import profile
from nodewarm.controller.nodeclaim import budget, deadline, untaint
from nodewarm.controller.nodeclaim import plan as planner
from nodewarm.api.names import STATE_ANNOTATION
from nodewarm.api.timeutil import fmt_time, parse_time
from nodewarm.api.views import ClaimView, NodeView, WarmState
from support.builders import TAINT, v
from support.claimscene import GPU, OTHER, T0, claim_obj, node_obj
from support.jsonpatch import apply_json_patch


def prof(**kw):
    return profile.from_dict(v(**{"metadata__name": "p1", **kw}))


def plan(node=None, claim=None, p=None, now=T0 + 31):
    c = ClaimView.from_obj(claim or claim_obj())
    n = NodeView.from_obj(node) if node is not None else None
    return planner.plan_claim(c, n, p if p is not None else prof(), now)


def test_warm_node_plan_removes_only_the_readiness_taint_and_records_in_one_patch():
    node = node_obj(annotations={"nodewarm.io/compile-cache": "miss", "nodewarm.io/compile-cache-reason": "no key"})
    pl = plan(node)
    assert pl.action == planner.UNTAINT
    after = apply_json_patch(node, list(pl.node_ops))
    assert after["spec"]["taints"] == [GPU, OTHER]
    labels = after["metadata"]["labels"]
    assert labels["nodewarm.io/warm"] == "true" and labels["nodewarm.io/compile-cache"] == "miss"
    assert labels["karpenter.sh/nodepool"] == "gpu-p5"
    state = WarmState.from_json(after["metadata"]["annotations"][STATE_ANNOTATION])
    assert state.decision == "Untainted" and state.node_claim == "c1"
    assert parse_time(state.warm) == T0 + 30
    assert {e.kind for e in pl.events} == {"Node", "NodeClaim"} and all(e.reason == "Untainted" for e in pl.events)
    assert "compile cache miss (no key)" in pl.events[0].message
    assert dict(pl.durations)["warm_to_untaint"] == pytest.approx(1.0)
    assert dict(pl.durations)["launch_to_register"] == pytest.approx(60.0)


@pytest.mark.parametrize("reported, label", [("restored", "unknown"), ("cold", "cold"), ("hit", "hit"), ("miss", "miss"),
                                              ("surprise", "unknown")])
def test_compile_cache_outcome_label_takes_only_known_values(reported, label):
    after = apply_json_patch(node := node_obj(annotations={"nodewarm.io/compile-cache": reported}),
                             list(plan(node).node_ops))
    assert after["metadata"]["labels"]["nodewarm.io/compile-cache"] == label


@pytest.mark.parametrize("recorded, label", [("4f2a9c1e0b7d3a65", "4f2a9c1e0b7d3a65"), ("not-a-generation", None),
                                              (None, None)])
def test_the_generation_the_agent_warmed_is_labelled_in_the_write_that_lifts_the_taint(recorded, label):
    """One node event that makes the vLLM pods fit (label and taint together): no failed scheduling try, and no
    back-off, between them. An odd annotation labels nothing."""
    ann = {"nodewarm.io/warm-generation": recorded} if recorded else {}
    node = node_obj(annotations=ann)
    pl = plan(node)
    after = apply_json_patch(node, list(pl.node_ops))
    assert after["spec"]["taints"] == [GPU, OTHER]
    assert after["metadata"]["labels"].get("nodewarm.io/generation") == label


def test_a_deadline_untaint_labels_the_profiles_generation_and_marks_the_node_cold():
    """onDeadline=untaint must let the vLLM pods land (they select the profile's generation label): the label
    of the profile, never a generation the agent recorded (it did not finish), with the cold marks beside it in
    the same write, and an Event that says what happens: the pod streams from S3."""
    from nodewarm.api.generation import generation

    node = node_obj(warm="False", annotations={"nodewarm.io/warm-generation": "4f2a9c1e0b7d3a65"})
    pl = plan(node, now=T0 + 21 * 60)
    assert pl.action == planner.UNTAINT and pl.deadline == "untaint"
    after = apply_json_patch(node, list(pl.node_ops))
    labels = after["metadata"]["labels"]
    assert labels["nodewarm.io/generation"] == generation(prof()) != "4f2a9c1e0b7d3a65"
    assert (labels["nodewarm.io/warm"], labels["nodewarm.io/compile-cache"]) == ("cold", "cold")
    assert after["spec"]["taints"] == [GPU, OTHER]
    ev = next(e for e in pl.events if e.kind == "Node")
    # What the pod's start script will do (nodeclasses.servestart): no identity that reads S3 here, so it waits.
    assert ev.reason == "WarmDeadlineUntaint" and "waits for the agent's copy" in ev.message
    assert generation(prof()) in ev.message and "will load the model cold" not in ev.message
    streaming = prof(spec__compileCache__verifyKey="A" * 43 + "=", spec__aws__identity="podIdentity",
                     spec__aws__clusterName="c", spec__aws__publisherRoleArn="arn:aws:iam::111122223333:role/pub",
                     spec__compileCache__publisher={"image": "registry.example/vllm-nodewarm:1", "signingKeySecret": "k"})
    ev = next(e for e in plan(node, p=streaming, now=T0 + 21 * 60).events if e.kind == "Node")
    assert "streams the model from S3 (cold" in ev.message


def test_the_guard_refuses_a_changed_taint_list():
    node = node_obj()
    pl = plan(node)
    moved = node_obj(taints=(OTHER, GPU, TAINT))
    with pytest.raises(AssertionError, match="test failed"):
        apply_json_patch(moved, list(pl.node_ops))


def test_duplicate_entries_of_our_key_all_go_highest_index_first():
    node = node_obj(taints=(TAINT, GPU, {**TAINT, "effect": "NoExecute"}))
    after = apply_json_patch(node, list(plan(node).node_ops))
    assert after["spec"]["taints"] == [GPU]


def test_node_without_annotations_or_labels_gets_whole_maps():
    node = node_obj()
    node["metadata"].pop("labels")
    node["metadata"].pop("annotations")
    after = apply_json_patch(node, list(plan(node).node_ops))
    assert STATE_ANNOTATION in after["metadata"]["annotations"] and after["metadata"]["labels"]["nodewarm.io/warm"] == "true"


def test_not_warm_yet_requeues_at_the_deadline():
    pl = plan(node_obj(warm=None), now=T0 + 100)
    assert pl.action == planner.NONE and pl.requeue_after == pytest.approx(20 * 60 - 100)
    assert [c.reason for c in pl.conditions] == ["NodeFound", "Warming", "WithinDeadline"]
    failed = plan(node_obj(warm="False"), now=T0 + 100)
    assert failed.action == planner.NONE and failed.conditions[1].reason == "WeightsVerified"


@pytest.mark.parametrize("on_deadline,action,taint_left,reason", [
    ("untaint", planner.UNTAINT, False, "WarmDeadlineUntaint"),
    ("replace", planner.DELETE_CLAIM, True, "WarmDeadlineReplace"),
    ("keep", planner.RECORD, True, "WarmDeadlineKeep"),
])
def test_deadline_actions(on_deadline, action, taint_left, reason):
    node = node_obj(warm=None)
    pl = plan(node, p=prof(spec__readiness__onDeadline=on_deadline, spec__readiness__deadline="5m"), now=T0 + 301)
    assert pl.action == action and {e.reason for e in pl.events} == {reason}
    assert all(e.type == "Warning" for e in pl.events)
    after = apply_json_patch(node, list(pl.node_ops))
    assert (TAINT in after["spec"]["taints"]) is taint_left
    if on_deadline == "untaint":
        assert after["metadata"]["labels"]["nodewarm.io/warm"] == "cold"


def test_recorded_or_already_untainted_nodes_are_left_alone():
    done = apply_json_patch(node_obj(), list(plan(node_obj()).node_ops))
    assert plan(done).action == planner.NONE
    kept = apply_json_patch(node_obj(warm=None), list(plan(node_obj(warm=None), p=prof(spec__readiness__onDeadline="keep"),
                                                            now=T0 + 3600).node_ops))
    # A record stops a second "keep" event after a restart, even though the taint is still there.
    assert plan(kept, p=prof(spec__readiness__onDeadline="keep"), now=T0 + 7200).action == planner.NONE
    assert plan(node_obj(taints=(GPU,))).action == planner.NONE


def test_unbound_deleting_or_nodeless_claims_do_nothing():
    c = ClaimView.from_obj(claim_obj())
    assert planner.plan_claim(c, NodeView.from_obj(node_obj()), None, T0).action == planner.NONE
    assert plan(node_obj(), claim=claim_obj(deleting=T0)).action == planner.NONE
    nodeless = plan(None)
    assert nodeless.action == planner.NONE and nodeless.conditions[0].reason == "NodeNotFound"
    assert plan(None, claim=claim_obj(registered=None)).conditions[0].reason == "NotRegistered"


def test_label_values_are_valid():
    assert untaint.label_value("Qwen/Qwen3 35B:fp8") == "Qwen-Qwen3-35B-fp8"
    assert len(untaint.label_value("x" * 100)) == 63
    assert untaint.model_label(prof(spec__model__revision="r1")) == "qwen3-35b-r1"


# -- deadline actions: guards, keep that still lifts, replace that is never pointless ----------------------

def test_deadline_plans_carry_uid_and_resource_version_guards_the_warm_path_only_uid():
    node = node_obj(warm=None)
    node["metadata"]["resourceVersion"] = "41"
    pl = plan(node, p=prof(spec__readiness__onDeadline="untaint", spec__readiness__deadline="5m"), now=T0 + 301)
    assert pl.deadline == "untaint"
    assert pl.node_ops[:2] == ({"op": "test", "path": "/metadata/uid", "value": "u-n1"},
                               {"op": "test", "path": "/metadata/resourceVersion", "value": "41"})
    moved = copy.deepcopy(node)
    moved["metadata"]["resourceVersion"] = "42"          # anything happened to the node since the live read
    with pytest.raises(AssertionError, match="test failed"):
        apply_json_patch(moved, list(pl.node_ops))
    warm = node_obj()
    warm["metadata"]["resourceVersion"] = "41"
    ops = plan(warm).node_ops
    assert ops[0] == {"op": "test", "path": "/metadata/uid", "value": "u-n1"}
    assert not any(o["path"] == "/metadata/resourceVersion" for o in ops)   # cache-driven: heartbeats must not conflict


def test_keep_does_not_end_handling_a_late_warm_still_lifts_the_taint():
    keep = prof(spec__readiness__onDeadline="keep", spec__readiness__deadline="5m")
    kept = apply_json_patch(node_obj(warm=None), list(plan(node_obj(warm=None), p=keep, now=T0 + 301).node_ops))
    assert WarmState.from_json(kept["metadata"]["annotations"][STATE_ANNOTATION]).decision == "DeadlineKeep"
    still = plan(kept, p=keep, now=T0 + 400)
    assert still.action == planner.NONE and still.requeue_after is None    # no second keep event; waits for the node
    late = copy.deepcopy(kept)
    late["status"]["conditions"].append({"type": "nodewarm.io/Warm", "status": "True", "reason": "WeightsVerified",
                                         "message": "ok", "lastTransitionTime": fmt_time(T0 + 500)})
    pl = plan(late, p=keep, now=T0 + 501)
    assert pl.action == planner.UNTAINT and pl.deadline == ""
    after = apply_json_patch(late, list(pl.node_ops))
    assert TAINT not in after["spec"]["taints"]
    assert WarmState.from_json(after["metadata"]["annotations"][STATE_ANNOTATION]).decision == "Untainted"
    assert "after its deadline" in pl.events[0].message
    assert plan(after, p=keep, now=T0 + 600).action == planner.NONE     # and that is the end of it


@pytest.mark.parametrize("reason", sorted(deadline.UNFIXABLE_REASONS))
def test_replace_is_not_tried_for_failures_a_new_node_would_repeat(reason):
    node = node_obj(warm="False")
    node["status"]["conditions"][-1]["reason"] = reason
    pl = plan(node, p=prof(spec__readiness__onDeadline="replace", spec__readiness__deadline="5m"), now=T0 + 301)
    assert pl.action == planner.RECORD and pl.deadline == "not_replaced"
    assert {e.reason for e in pl.events} == {"WarmDeadlineNotReplaced"} and reason in pl.events[0].message
    after = apply_json_patch(node, list(pl.node_ops))
    assert TAINT in after["spec"]["taints"]


def test_replace_for_a_failure_a_new_node_may_not_repeat():
    node = node_obj(warm="False")
    node["status"]["conditions"][-1]["reason"] = "S3Unavailable"
    pl = plan(node, p=prof(spec__readiness__onDeadline="replace", spec__readiness__deadline="5m"), now=T0 + 301)
    assert pl.action == planner.DELETE_CLAIM and pl.deadline == "replace"


def test_replace_budget_backs_off_exponentially_and_opens_when_spent():
    pol = budget.ReplacePolicy(budget=3, window_s=3600, backoff_base_s=60, backoff_max_s=1800)
    g = budget.replace_gate("pool", (), T0, pol)
    assert g.allowed and g.condition.status == "False"
    g = budget.replace_gate("pool", (T0,), T0 + 30, pol)                 # 1 used: wait 60 s after it
    assert not g.allowed and g.until == T0 + 60 and g.condition.status == "False"
    assert budget.replace_gate("pool", (T0,), T0 + 61, pol).allowed
    g = budget.replace_gate("pool", (T0, T0 + 61), T0 + 100, pol)        # 2 used: wait 120 s
    assert not g.allowed and g.until == T0 + 61 + 120
    g = budget.replace_gate("pool", (T0, T0 + 61, T0 + 300), T0 + 400, pol)    # 3 used in the last hour: open
    assert not g.allowed and g.until == T0 + 3600
    assert (g.condition.type, g.condition.status, g.condition.reason) == ("ReplacementsPaused", "True", "BudgetExhausted")
    assert "pool" in g.condition.message
    assert budget.replace_gate("pool", (T0, T0 + 61, T0 + 300), T0 + 3601 + 300, pol).allowed   # all aged out
    off = budget.replace_gate("pool", (), T0, budget.ReplacePolicy(budget=0))   # --replace-budget 0: never
    assert not off.allowed and off.condition.status == "True"


def test_register_to_warm_is_timed_by_the_agents_sub_second_warm_report():
    # The agent stamps its timeline annotation when it reports Warm; the condition's transition time has whole
    # seconds only (T0 + 30 in node_obj). The phase metric takes the agent's stamp.
    timeline = json.dumps({"weights_done": fmt_time(T0 + 29.5), "warm_reported": fmt_time(T0 + 29.75)})
    pl = plan(node_obj(annotations={"nodewarm.io/timeline": timeline}))
    assert dict(pl.durations)["register_to_warm"] == pytest.approx(29.75, abs=1e-3)   # registered at T0


@pytest.mark.parametrize("mark", ["condition", "annotation", "taint"])
def test_a_deadline_replace_never_deletes_a_nodeclaim_karpenter_is_already_replacing(mark):
    """Karpenter's repair (v1.15: a budgeted voluntary disruption, reason Unhealthy) or drift marks the NodeClaim
    (DisruptionReason=True), or repair stamps the termination time, or the node carries karpenter.sh/disrupted:
    a delete of ours would start a second replacement for one node."""
    node, claim = node_obj(warm="False"), claim_obj()
    node["status"]["conditions"][-1]["reason"] = "S3Unavailable"
    if mark == "condition":
        claim["status"]["conditions"].append({"type": "DisruptionReason", "status": "True", "reason": "Unhealthy",
                                              "lastTransitionTime": fmt_time(T0 + 200)})
    elif mark == "annotation":
        claim["metadata"]["annotations"] = {"karpenter.sh/nodeclaim-termination-timestamp": "2027-01-15T10:00:00Z"}
    else:
        node["spec"]["taints"].append({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"})
    replace_ = prof(spec__readiness__onDeadline="replace", spec__readiness__deadline="5m")
    pl = plan(node, claim=claim, p=replace_, now=T0 + 301)
    assert pl.action == planner.NONE and not pl.events and pl.requeue_after == deadline.KARPENTER_RECHECK_S
    held = pl.conditions[-1]
    assert (held.type, held.reason) == ("Replacement", "KarpenterReplacing")
    # Karpenter gives up (its mark goes): the deadline acts again, once.
    assert plan(node_obj(warm="False", taints=(GPU, TAINT)), claim=claim_obj(), p=replace_,
                now=T0 + 301).action == planner.DELETE_CLAIM


UNREG = {"key": "karpenter.sh/unregistered", "effect": "NoExecute"}


@pytest.mark.parametrize("claim, taints", [
    (claim_obj(registered=None), (GPU, TAINT, UNREG)),         # the Node still carries karpenter.sh/unregistered
    (claim_obj(registered=None), (GPU, TAINT)),                # registration wrote the Node, not yet the NodeClaim
    (claim_obj(), (GPU, TAINT, UNREG)),                        # a NodeClaim Registered, its Node still unregistered
])
def test_a_warm_node_is_not_lifted_before_karpenter_registers_it(claim, taints):
    pl = plan(node_obj(taints=taints), claim=claim, now=T0 + 3600)    # past the deadline's length too
    assert (pl.action, pl.node_ops, pl.events, pl.requeue_after) == (planner.NONE, (), (), None)


def _lifted_then_retainted(registered_at_lift: float) -> dict:
    """n1 lifted by nodewarm at T0 + 31 (its record says when it believed the node registered), the taint back."""
    lifted = apply_json_patch(node_obj(), list(plan(node_obj()).node_ops))
    state = json.loads(lifted["metadata"]["annotations"][STATE_ANNOTATION])
    state["registered"] = fmt_time(registered_at_lift)
    lifted["metadata"]["annotations"][STATE_ANNOTATION] = json.dumps(state)
    lifted["spec"]["taints"] = lifted["spec"]["taints"] + [dict(TAINT)]
    return lifted


@pytest.mark.parametrize("registered_at_lift, who", [
    (T0, "not by nodewarm"),                         # lifted after registration: someone else put it back
    (T0 - 5, "Karpenter's registration merges"),     # an older controller lifted before registration (the Node's birth)
])
def test_a_taint_put_back_after_a_lift_is_lifted_again_told_and_counted_not_timed(registered_at_lift, who):
    node = _lifted_then_retainted(registered_at_lift)
    pl = plan(node, now=T0 + 600)
    assert pl.action == planner.UNTAINT
    after = apply_json_patch(node, list(pl.node_ops))
    assert after["spec"]["taints"] == [GPU, OTHER]
    assert WarmState.from_json(after["metadata"]["annotations"][STATE_ANNOTATION]).decided == fmt_time(T0 + 600)
    assert {e.reason for e in pl.events} == {"TaintReAdded"} and all(e.type == "Warning" for e in pl.events)
    assert f"{TAINT['key']} was back on the node" in pl.events[0].message and who in pl.events[0].message
    assert set(pl.counters) == {("taints_removed", ""), ("taints_readded", "")} and pl.durations == ()
    assert plan(after, now=T0 + 601).action == planner.NONE
