"""Pure planning and the work queue: no servers."""

from __future__ import annotations

import copy
import json
import threading

import pytest

from nodewarm import profile
from nodewarm.controller import plan as planner
from nodewarm.controller.model import (
    STATE_ANNOTATION, ClaimView, NodeView, WarmState, fmt_time, label_value, parse_time,
)
from nodewarm.controller.workqueue import WorkQueue
from profiles import v

T0 = 1_800_000_000.0
TAINT = {"key": "nodewarm.io/warming", "effect": "NoSchedule"}
GPU = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
OTHER = {"key": "example.com/other", "value": "x", "effect": "NoExecute"}


def prof(**kw):
    return profile.from_dict(v(**{"metadata__name": "p1", **kw}))


def claim_obj(registered: float | None = T0, deleting: bool = False) -> dict:
    conds = [{"type": "Launched", "status": "True", "lastTransitionTime": fmt_time(T0 - 60)}]
    if registered is not None:
        conds.append({"type": "Registered", "status": "True", "lastTransitionTime": fmt_time(registered)})
    md = {"name": "c1", "uid": "u-c1", "labels": {"karpenter.sh/nodepool": "gpu-p5"},
          "creationTimestamp": fmt_time(T0 - 70)}
    if deleting:
        md["deletionTimestamp"] = fmt_time(T0)
    return {"metadata": md, "spec": {"startupTaints": [TAINT]},
            "status": {"providerID": "aws:///z/i-1", "conditions": conds}}


def node_obj(taints=(GPU, TAINT, OTHER), warm: str | None = "True", annotations: dict | None = None) -> dict:
    conds = [{"type": "Ready", "status": "True"}]
    if warm is not None:
        conds.append({"type": "nodewarm.io/Warm", "status": warm, "reason": "WeightsVerified", "message": "ok",
                      "lastTransitionTime": fmt_time(T0 + 30)})
    md = {"name": "n1", "uid": "u-n1", "labels": {"karpenter.sh/nodepool": "gpu-p5"}, "creationTimestamp": fmt_time(T0)}
    if annotations is not None:
        md["annotations"] = annotations
    return {"metadata": md, "spec": {"providerID": "aws:///z/i-1", "taints": [dict(t) for t in taints]},
            "status": {"conditions": conds}}


def apply_json_patch(doc: dict, ops: list[dict]) -> dict:
    """Just enough RFC 6902 (test/add/remove) to check what the server would do with our ops."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, leaf = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = doc
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        key = int(leaf) if isinstance(target, list) else leaf
        if op["op"] == "test":
            assert target[key] == op["value"], f"test failed at {op['path']}"
        elif op["op"] == "remove":
            del target[key]
        elif op["op"] == "add":
            if isinstance(target, list):
                target.insert(key, op["value"])
            else:
                target[key] = op["value"]
    return doc


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
    assert plan(node_obj(), claim=claim_obj(deleting=True)).action == planner.NONE
    nodeless = plan(None)
    assert nodeless.action == planner.NONE and nodeless.conditions[0].reason == "NodeNotFound"
    assert plan(None, claim=claim_obj(registered=None)).conditions[0].reason == "NotRegistered"


def test_state_roundtrip_and_garbage():
    s = WarmState("p", "c", "Untainted", decided=fmt_time(T0))
    assert WarmState.from_json(s.to_json()) == s
    assert WarmState.from_json("{not json") is None and WarmState.from_json(json.dumps({"x": 1})) is None


def test_label_values_are_valid():
    assert label_value("Qwen/Qwen3 35B:fp8") == "Qwen-Qwen3-35B-fp8"
    assert len(label_value("x" * 100)) == 63
    assert planner.model_label(prof(spec__model__revision="r1")) == "qwen3-35b-r1"


def test_workqueue_dedupes_and_never_hands_one_key_to_two_workers():
    q = WorkQueue()
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    assert q.get(0.1) == "a"
    q.add("a")                       # re-added while processing: queued again only after done()
    assert q.get(0.1) == "b"
    assert q.get(0.05) is None
    q.done("a")
    assert q.get(0.1) == "a"


def test_workqueue_delays_and_backoff():
    q = WorkQueue(base_delay_s=0.05)
    assert q.retry("k") == pytest.approx(0.05)
    assert q.retry("k") == pytest.approx(0.1)
    q.forget("k")
    assert q.retry("k") == pytest.approx(0.05)
    got = []
    t = threading.Thread(target=lambda: got.append(q.get(2)))
    t.start()
    t.join(3)
    assert got == ["k"]
    q.add_after("later", 0.05)
    assert q.get(0.01) is None
    assert q.get(2) == "later"
    q.shutdown()
    assert q.get(5) is None
