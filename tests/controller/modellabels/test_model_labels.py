"""Many models per node (#33), the controller's side: the label of each further model (spec.models) on the profile's
Nodes, from what the node agent reports in nodewarm.io/models. The plan (pure), then on the RBAC-enforcing API server:
the controller as its own ServiceAccount with the RBAC it ships, each node reporting with its own kubelet token."""

from __future__ import annotations

import time
from functools import partial

import pytest
from kubernetes.client.exceptions import ApiException

from nodewarm import profile
from nodewarm.api import models
from nodewarm.api.models import HeldModel
from nodewarm.api.names import MODEL_LABEL_PREFIX, MODELS_ANNOTATION, PROFILE_LABEL
from nodewarm.api.views import ClaimView, NodeView
from nodewarm.bootstrap.nodestatus import report_progress, report_warm
from nodewarm.controller.kube import NODES, WARMPROFILES, Kube
from nodewarm.controller.modellabels import plan as ml
from nodewarm.controller.nodeclaim import plan as planner
from nodewarm_dev.testenv.karpenter import KarpenterSim

from support import builders
from support.builders import TAINT, v
from support.controller_fixtures import client_for, events_for, installed, running, taint_keys, uniq, wait_for
from support.jsonpatch import apply_json_patch
from support.kubefaults import KubeFaults
from support.modelviews import model_labels

T0 = 1_800_000_000.0
MODELS = [{"name": "small", "uri": "s3://models-bucket/small/", "sizeGB": 10},
          {"name": "tiny", "uri": "s3://models-bucket/tiny/", "sizeGB": 5}]
SMALL, TINY = f"{MODEL_LABEL_PREFIX}p1-small", f"{MODEL_LABEL_PREFIX}p1-tiny"


def prof(entries=MODELS):
    return profile.from_dict(v(metadata__name="p1", spec__models=entries))


def node_obj(held=(), labels=None, taints=(), **kw) -> dict:
    o = builders.node("n1", uid="u-n1", created=T0, taints=taints, labels=labels, provider_id="aws:///z/i-1",
                      annotations={MODELS_ANNOTATION: models.encode(list(held))} if held else None, **kw)
    o["metadata"]["resourceVersion"] = "7"
    return o


def warm(name, gen, **kw) -> HeldModel:
    return HeldModel(name, models.WARM, generation=gen, **kw)


def planned(obj, p=None, told=None, taint=TAINT["key"]):
    return ml.plan(p or prof(), NodeView.from_obj(obj), taint, told or {})


# -- the plan (pure) -------------------------------------------------------------------------------------------------

def test_models_reported_warm_are_labelled_in_one_patch_guarded_by_the_nodes_resource_version():
    obj = node_obj([warm("p1-small", "g1"), warm("p1-tiny", "g2"), HeldModel("p1", models.WARM, generation="g0")])
    out = planned(obj)
    assert [(c.key, c.value, c.action) for c in out.changes] == [(SMALL, "g1", ml.LABEL), (TINY, "g2", ml.LABEL)]
    assert out.ops[:2] == ({"op": "test", "path": "/metadata/uid", "value": "u-n1"},
                           {"op": "test", "path": "/metadata/resourceVersion", "value": "7"})
    after = apply_json_patch(obj, list(out.ops))
    assert {k: v for k, v in after["metadata"]["labels"].items() if k.startswith(MODEL_LABEL_PREFIX)} == {
        SMALL: "g1", TINY: "g2"}      # the first model keeps nodewarm.io/generation, not a model label
    with pytest.raises(AssertionError):     # a Node changed since it was read: the server refuses the patch
        apply_json_patch({**obj, "metadata": {**obj["metadata"], "resourceVersion": "8"}}, list(out.ops))
    ev = ml.change_event(NodeView.from_obj(obj), out.changes[0])
    assert ev.reason == ml.MODEL_LABELED and "p1-small" in ev.message and "g1" in ev.message and "warm" in ev.message
    # Applied, nothing is left to do.
    assert planned(after).ops == ()


def test_a_new_generation_switches_the_label_and_a_roll_in_flight_keeps_the_old_one():
    labels = {SMALL: "g1"}
    rolling = planned(node_obj([warm("p1-small", "g1", pending="g9")], labels))
    assert rolling.changes == ()
    out = planned(node_obj([warm("p1-small", "g9")], labels))
    assert [(c.key, c.value, c.was, c.action) for c in out.changes] == [(SMALL, "g9", "g1", ml.SWITCH)]


@pytest.mark.parametrize("held, p, why", [
    ([HeldModel("p1-small", models.EVICTING, generation="g1")], MODELS, "evicts"),
    ([HeldModel("p1-small", models.FAILED, reason="LoadCheckFailed", message="bad header")], MODELS, "bad header"),
    ([HeldModel("p1-small", models.PULLING)], MODELS, "pulling"),
    ([], MODELS, "no longer reports"),
    ([warm("p1-small", "g1")], MODELS[1:], "no longer in WarmProfile p1"),
])
def test_a_model_not_warm_or_not_in_the_profile_loses_its_label(held, p, why):
    obj = node_obj(held, {SMALL: "g1", "models.nodewarm.io/other-x": "g5"})
    out = planned(obj, prof(p))
    assert [(c.key, c.value, c.action) for c in out.changes] == [(SMALL, None, ml.UNLABEL)]
    assert why in out.changes[0].why
    after = apply_json_patch(obj, list(out.ops))
    assert SMALL not in after["metadata"]["labels"]
    assert after["metadata"]["labels"]["models.nodewarm.io/other-x"] == "g5"     # another profile's: not touched
    assert ml.change_event(NodeView.from_obj(obj), out.changes[0]).reason == ml.MODEL_UNLABELED


def test_under_the_startup_taint_labels_are_only_removed_and_the_lift_sets_them():
    obj = node_obj([warm("p1-small", "g1"), HeldModel("p1-tiny", models.EVICTING, generation="g2")],
                   {TINY: "g2"}, taints=(TAINT,))
    out = planned(obj)
    assert [(c.key, c.value) for c in out.changes] == [(TINY, None)]
    assert [(c.key, c.value) for c in out.deferred] == [(SMALL, "g1")]
    assert not any(op["op"] == "add" for op in out.ops)
    # The untaint write (the NodeClaim reconciler's one patch) sets it as it lifts the taint, and tells it.
    claim = ClaimView.from_obj(builders.nodeclaim("c1", created=T0 - 70, launched=T0 - 60, registered=T0,
                                                  provider_id="aws:///z/i-1"))
    node = node_obj([warm("p1-small", "g1")], taints=(TAINT,), warm="True", warm_at=T0 + 30)
    pl = planner.plan_claim(claim, NodeView.from_obj(node), prof(), T0 + 31)
    assert pl.action == planner.UNTAINT
    after = apply_json_patch(node, list(pl.node_ops))
    assert after["spec"]["taints"] == [] and after["metadata"]["labels"][SMALL] == "g1"
    assert TINY not in after["metadata"]["labels"]
    told = [e for e in pl.events if e.reason == ml.MODEL_LABELED]
    assert len(told) == 1 and f"as {TAINT['key']} was removed" in told[0].message
    assert ("model_labels", ml.LABEL) in pl.counters and pl.profile == "p1"


def test_no_capacity_is_told_once_per_message():
    fail = partial(HeldModel, "p1-tiny", models.FAILED, reason=models.NO_CAPACITY)
    first = planned(node_obj([fail(message="needs 5 GB, 2 GB free")]))
    assert first.told == ("p1-tiny",) and first.ops == ()
    again = planned(node_obj([fail(message="needs 5 GB, 2 GB free")]), told=first.no_capacity)
    assert again.told == ()
    changed = planned(node_obj([fail(message="needs 5 GB, 3 GB free")]), told=first.no_capacity)
    assert changed.told == ("p1-tiny",)
    other = planned(node_obj([HeldModel("p1-tiny", models.FAILED, reason="S3AccessDenied", message="x")]))
    assert other.told == () and other.no_capacity == {}
    ev = ml.no_capacity_event(NodeView.from_obj(node_obj([fail(message="m1")])), "p1-tiny", "m1")
    assert (ev.reason, ev.type) == (ml.MODEL_NO_CAPACITY, "Warning") and "m1" in ev.message


# -- on the RBAC-enforcing API server --------------------------------------------------------------------------------

@pytest.fixture()
def as_controller(kube):
    """The controller's ServiceAccount with exactly the RBAC it ships. Yields (admin Kube, the SA's token)."""
    ak = Kube(kube.api_client())
    ctl = uniq("nodewarm")
    yield ak, kube.controller_token(ctl)


def _fresh(k: Kube, name: str, labels: dict) -> None:
    try:
        k.delete(NODES, name)
    except ApiException as e:
        if e.status != 404:
            raise
    wait_for(lambda: _absent(k, name), what=f"old Node {name} gone")
    k.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})


def _absent(k: Kube, name: str) -> bool:
    try:
        k.get(NODES, name)
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def _report(kube, node: str, *held: HeldModel) -> None:
    """What the node agent writes: its models, through nodes/status, with the node's own identity."""
    report_progress(kube.api_client(kube.node_token(node)), node, {MODELS_ANNOTATION: models.encode(list(held))})


def _reasons(k: Kube, node: str) -> list[str]:
    return [e["reason"] for e in events_for(k, "Node", node)]


@pytest.mark.kube
def test_labels_follow_the_nodes_report_and_the_profile(kube, as_controller):
    ak, token = as_controller
    node = "node-3"
    with installed(ak, user_data=None, user_startup_taints=(), spec__models=MODELS) as inst:
        small, tiny = (f"{MODEL_LABEL_PREFIX}{inst.name}-{m}" for m in ("small", "tiny"))
        vs, vt = f"{inst.name}-small", f"{inst.name}-tiny"
        _fresh(ak, node, {PROFILE_LABEL: inst.name})
        try:
            with running(client_for(kube.server, token, kube.ca_file)) as c:
                _report(kube, node, warm(vs, "g1"), warm(vt, "g2"))
                wait_for(lambda: model_labels(ak, node) == {small: "g1", tiny: "g2"}, what="both models labelled")
                wait_for(lambda: _reasons(ak, node).count(ml.MODEL_LABELED) == 2, what="two ModelLabeled events")

                _report(kube, node, warm(vs, "g3"), warm(vt, "g2"))
                wait_for(lambda: model_labels(ak, node) == {small: "g3", tiny: "g2"}, what="small switched to g3")

                # The eviction handshake: the agent says evicting and waits for the label to go.
                _report(kube, node, warm(vs, "g3"), HeldModel(vt, models.EVICTING, generation="g2"))
                wait_for(lambda: model_labels(ak, node) == {small: "g3"}, what="tiny's label removed")
                wait_for(lambda: ml.MODEL_UNLABELED in _reasons(ak, node), what="a ModelUnlabeled event")

                ak.merge_patch(WARMPROFILES, inst.name, {"spec": {"models": MODELS[1:]}})
                wait_for(lambda: model_labels(ak, node) == {}, what="small's label gone with it from the profile")

                # NoCapacity: one Warning Event per message, however often the node writes it.
                fail = partial(HeldModel, vt, models.FAILED, reason=models.NO_CAPACITY)
                _report(kube, node, fail(message="needs 5 GB, 2 GB free"))
                wait_for(lambda: _reasons(ak, node).count(ml.MODEL_NO_CAPACITY) == 1, what="a ModelNoCapacity event")
                _report(kube, node, fail(message="needs 5 GB, 2 GB free", last_used="2027-01-01T00:00:00Z"))
                wait_for(lambda: c.nodes.store[node].annotations[MODELS_ANNOTATION].find("2027") > 0,
                         what="the new report in the cache")
                c.modellabels.reconcile(node)
                _report(kube, node, fail(message="needs 5 GB, 3 GB free"))
                wait_for(lambda: _reasons(ak, node).count(ml.MODEL_NO_CAPACITY) == 2, what="the changed message told")
                time.sleep(0.5)     # the event recorder posts in the background: nothing more comes
                assert _reasons(ak, node).count(ml.MODEL_NO_CAPACITY) == 2

                count = lambda action: c.metrics.model_labels.labels(inst.name, action)._value.get()  # noqa: E731
                assert (count(ml.LABEL), count(ml.SWITCH), count(ml.UNLABEL), count(ml.NO_CAPACITY)) == (2, 1, 2, 2)
                assert c.metrics.reconcile_errors.labels("models")._value.get() == 0
        finally:
            _absent(ak, node) or ak.delete(NODES, node)


@pytest.mark.kube
def test_a_tainted_node_gets_its_model_labels_only_in_the_write_that_lifts_the_taint(kube, as_controller):
    ak, token = as_controller
    node = "node-4"
    if not _absent(ak, node):
        ak.delete(NODES, node)
        wait_for(lambda: _absent(ak, node), what=f"old Node {node} gone")
    with installed(ak, inject_ready=True, spec__models=MODELS) as inst:
        small = f"{MODEL_LABEL_PREFIX}{inst.name}-small"
        sim = KarpenterSim(kube.api_client())
        with running(client_for(kube.server, token, kube.ca_file)) as c:
            n = sim.scale_up(inst.pool, node_name=node)
            assert TAINT["key"] in taint_keys(ak, node)
            _report(kube, node, warm(f"{inst.name}-small", "g1"))
            wait_for(lambda: MODELS_ANNOTATION in c.nodes.store[node].annotations, what="the report in the cache")
            c.modellabels.reconcile(node)
            assert model_labels(ak, node) == {} and c.kube.writes[("nodes", "PATCH")] == 0

            report_warm(kube.api_client(kube.node_token(node)), node, True, "WeightsVerified", "ok")
            wait_for(lambda: TAINT["key"] not in taint_keys(ak, node), what="taint lifted")
            assert model_labels(ak, node) == {small: "g1"}
            c.modellabels.reconcile(node)
            assert c.kube.writes[("nodes", "PATCH")] == 1       # the lift alone: nothing written besides it
            assert c.decisions.count((n.claim, "untaint")) == 1
            wait_for(lambda: ml.MODEL_LABELED in _reasons(ak, node), what="the ModelLabeled event")
            assert c.metrics.model_labels.labels(inst.name, ml.LABEL)._value.get() == 1


@pytest.mark.kube
def test_a_conflict_on_the_label_patch_is_retried(kube, as_controller):
    ak, token = as_controller
    node = "node-3"
    proxy = KubeFaults(kube.server, kube.ca_file)
    try:
        with installed(ak, user_data=None, user_startup_taints=(), spec__models=MODELS) as inst:
            _fresh(ak, node, {PROFILE_LABEL: inst.name})
            try:
                with running(client_for(proxy.endpoint, token)) as c:
                    proxy.conflict_patch(f"/api/v1/nodes/{node}")
                    _report(kube, node, warm(f"{inst.name}-small", "g1"))
                    wait_for(lambda: model_labels(ak, node) == {f"{MODEL_LABEL_PREFIX}{inst.name}-small": "g1"},
                             what="labelled after a 409")
                    assert proxy.injected == [("conflict", f"/api/v1/nodes/{node}")]
                    assert c.metrics.conflicts.labels("nodes")._value.get() == 1
                    wait_for(lambda: c.metrics.model_labels.labels(inst.name, ml.LABEL)._value.get() == 1,
                             what="the label counted once, after the retried write")
                    assert c.metrics.reconcile_errors.labels("models")._value.get() == 0
            finally:
                _absent(ak, node) or ak.delete(NODES, node)
    finally:
        proxy.stop()
