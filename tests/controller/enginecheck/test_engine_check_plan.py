"""The engine check's plan (nodewarm/controller/enginecheck/plan.py) and what the NodeClaim phases make of its
outcome: pure, no servers."""

from __future__ import annotations

from functools import partial

import pytest

from nodewarm import profile
from nodewarm.api import enginecheck as contract
from nodewarm.api.decisions import EventReason
from nodewarm.api.views import ClaimView, NodeView
from nodewarm.controller.enginecheck import plan as ec
from nodewarm.controller.nodeclaim import plan as planner
from nodewarm.nodeclasses import enginecheck as render_ec
from support import builders
from support.builders import TAINT, v

T0 = 1_800_000_000.0
GPU = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
IMAGE = "registry.example/vllm-nodewarm:check"


def prof(**kw):
    return profile.from_dict(v(**{"metadata__name": "p1", "spec__readiness__engineCheck": {"enabled": True,
                                                                                         "image": IMAGE}, **kw}))


P = prof()
REQ = contract.Request("r1", "2027-01-15T08:00:00.000Z")


def node(ann: contract.Request | contract.Outcome | str | None = REQ, taints=(GPU, TAINT), **kw) -> NodeView:
    annotations = {}
    if ann is not None:
        annotations[contract.REQUEST_ANNOTATION] = ann if isinstance(ann, str) else ann.to_json()
    return NodeView.from_obj(builders.node("n1", uid="u-n1", created=T0, taints=taints, annotations=annotations, **kw))


def pod(request_id: str, node_name: str = "n1", deleting: bool = False) -> ec.CheckPod:
    return ec.CheckPod(contract.pod_name(P.name, node_name, request_id), P.serving.namespace, f"uid-{request_id}",
                       node_name, request_id, deleting)


plan = partial(ec.plan, "n1", p=P, taint_key=TAINT["key"])


def reasons(pl: ec.Plan) -> list[str]:
    return [e.reason for e in pl.events]


def test_a_request_on_a_tainted_node_creates_its_pod_once():
    pl = plan(node(), pods=[])
    assert pl.create == "r1" and pl.delete == ()
    assert reasons(pl) == [EventReason.ENGINE_CHECK_STARTED] and pl.counters == (("started", ""),)
    assert contract.pod_name(P.name, "n1", "r1") in pl.events[0].message
    # Its pod exists (any phase): nothing more to do. Another node's pods are not this node's.
    assert plan(node(), pods=[pod("r1"), pod("r0", node_name="n2")]) == ec.Plan("n1")


def test_a_newer_request_deletes_the_older_pod_and_creates_its_own():
    pl = plan(node(contract.Request("r2", "")), pods=[pod("r1")])
    assert pl.create == "r2" and [x.request_id for x in pl.delete] == ["r1"]
    assert reasons(pl) == [EventReason.ENGINE_CHECK_SUPERSEDED, EventReason.ENGINE_CHECK_STARTED]


def test_the_current_pod_still_terminating_is_not_created_again_until_it_is_gone():
    pl = plan(node(), pods=[pod("r1", deleting=True)])
    assert pl.create is None and pl.delete == () and pl.requeue_after == ec.TERMINATING_RECHECK_S


@pytest.mark.parametrize("state, reason, event, kind", [
    ("passed", contract.Reason.ENGINE_SERVED, EventReason.ENGINE_CHECK_PASSED, "Normal"),
    ("failed", contract.Reason.COMPILE_CACHE_NOT_LOADED, EventReason.ENGINE_CHECK_FAILED, "Warning")])
def test_an_outcome_deletes_the_pods_and_tells_what_the_node_reported(state, reason, event, kind):
    tail = tuple(f"line {i} " + "x" * 60 for i in range(40))
    out = contract.Outcome("r1", state, reason, "the restored bundle did not load", boot_s=41.25, first_token_s=0.5,
                           compile_cache="miss" if state == "failed" else "hit",
                           log_tail=tail if state == "failed" else ())
    pl = plan(node(out, taints=(GPU, TAINT) if state == "failed" else (GPU,)), pods=[pod("r1"), pod("r0")])
    assert pl.create is None and {x.request_id for x in pl.delete} == {"r1", "r0"}
    told = next(e for e in pl.events if e.reason == event)
    assert told.type == kind and told.kind == "Node" and told.name == "n1" and told.uid == "u-n1"
    assert len(told.message) <= ec.EVENT_MESSAGE_BUDGET
    assert (state, reason.value) in [(c, r) for c, r in pl.counters]
    if state == "passed":
        assert "41.2s" in told.message and "0.5s" in told.message and dict(pl.timings) == {"boot": 41.25,
                                                                                            "first_token": 0.5}
    else:
        # The reason, the message, and the engine's last lines: the very last one always, older ones as they fit.
        assert told.message.startswith("CompileCacheNotLoaded: the restored bundle did not load")
        assert told.message.endswith(tail[-1]) and tail[0] not in told.message and pl.timings == ()
    # Once its pods are gone, the outcome is told no more.
    assert plan(node(out), pods=[]) == ec.Plan("n1")


def test_odd_reasons_do_not_mint_metric_series():
    out = contract.Outcome("r1", "failed", "SomethingNew\n", "?")
    assert plan(node(out), pods=[pod("r1")]).counters == (("failed", "unknown"),)


@pytest.mark.parametrize("scene", ["taint gone", "no annotation", "unreadable", "node gone", "node deleting"])
def test_pods_no_longer_asked_for_are_deleted(scene):
    n = {"taint gone": node(taints=(GPU,)), "no annotation": node(None), "unreadable": node("{not json"),
         "node gone": None, "node deleting": NodeView.from_obj({**builders.node("n1"), "metadata": {
             **builders.node("n1")["metadata"], "deletionTimestamp": "2027-01-15T08:00:00Z"}})}[scene]
    pl = plan(n, pods=[pod("r1"), pod("r0", deleting=True)])
    assert pl.create is None and [x.request_id for x in pl.delete] == ["r1"]     # the terminating one is left be
    if n is None or n.deleting:
        assert pl.events == () and pl.counters == (("node_gone", ""),)
    else:
        assert reasons(pl) == [EventReason.ENGINE_CHECK_SUPERSEDED]


def test_the_bound_pod_is_the_template_on_this_node_owned_by_it():
    template = render_ec.pod_template(P)
    n = node()
    body = ec.bound_pod(template, P, n, "r1")
    md, spec = body["metadata"], body["spec"]
    assert md["name"] == contract.pod_name(P.name, "n1", "r1") and md["namespace"] == P.serving.namespace
    assert md["labels"] == contract.labels(P.name)
    assert md["annotations"] == {contract.REQUEST_ID_ANNOTATION: "r1", contract.NODE_ANNOTATION: "n1"}
    assert md["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u-n1"}]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    assert "nodeName" not in spec                           # the scheduler places it: GPUs accounted
    rest = {k: x for k, x in spec.items() if k != "affinity"}
    assert rest == template["template"]["spec"]             # otherwise exactly what was rendered
    assert "affinity" not in template["template"]["spec"]   # the template itself is not changed


# --- what the NodeClaim phases make of a failed check -----------------------------------------------------------

@pytest.mark.parametrize("on_deadline, action", [("untaint", planner.UNTAINT), ("replace", planner.DELETE_CLAIM),
                                                 ("keep", planner.RECORD)])
@pytest.mark.parametrize("reason", [r for r in contract.Reason if r != contract.Reason.ENGINE_SERVED])
def test_a_failed_check_waits_for_the_deadline_and_then_on_deadline_applies(reason, on_deadline, action):
    """Warm=False with an engine-check reason is a node that is not Warm: nothing happens before the deadline, and
    onDeadline applies at it as for any other failure."""
    p = prof(spec__readiness__onDeadline=on_deadline)
    claim = ClaimView.from_obj(builders.nodeclaim("c1", created=T0 - 70, launched=T0 - 60, registered=T0,
                                                  provider_id="aws:///z/i-1"))
    warm = builders.condition("nodewarm.io/Warm", "False", reason, T0 + 600, "vLLM did not serve")
    out = contract.Outcome("r1", "failed", reason, "vLLM did not serve")
    n = NodeView.from_obj(builders.node("n1", uid="u-n1", created=T0, provider_id="aws:///z/i-1", taints=(GPU, TAINT),
                                        warm=warm, annotations={contract.REQUEST_ANNOTATION: out.to_json()}))
    before = planner.plan_claim(claim, n, p, T0 + 601)
    assert before.action == planner.NONE and before.requeue_after == pytest.approx(p.readiness.deadline_s - 601)
    assert next(c for c in before.conditions if c.type == "Untainted").reason == reason
    after = planner.plan_claim(claim, n, p, T0 + p.readiness.deadline_s + 1)
    if reason == contract.Reason.MODEL_DOES_NOT_FIT and on_deadline == "replace":
        # A new node of the same types would not fit it either: kept, and said why (deadline.UNFIXABLE_REASONS).
        assert (after.action, after.deadline) == (planner.RECORD, "not_replaced")
        return
    assert after.action == action and after.deadline == on_deadline
