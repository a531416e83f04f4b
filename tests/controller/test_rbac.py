"""The shipped RBAC is enough to run the controller and nothing more, on the RBAC-enforcing API server."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from nodewarm.bootstrap.nodestatus import report_warm
from nodewarm.controller import manifests
from nodewarm.controller.kube import (
    EVENTS, LEASES, NODECLAIMS, NODEPOOLS, NODES, WARMPROFILES, Kube, Resource,
)
from nodewarm_dev.testenv.karpenter import KarpenterSim

from support.rbac import KINDS
from support.controller_fixtures import TAINT, events_for, installed, running, taint_keys, uniq, wait_for

pytestmark = pytest.mark.kube

PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
SECRETS = Resource("", "v1", "secrets", "Secret", namespaced=True)


def test_manifests_are_least_privilege():
    rules = manifests.cluster_rules()
    for r in rules:
        assert "*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"]
        assert not {"secrets", "pods", "configmaps", "events", "leases"} & set(r["resources"])
    nodes = next(r for r in rules if r["resources"] == ["nodes"])
    assert set(nodes["verbs"]) == {"get", "list", "watch", "patch"}          # no update, no delete
    claims = next(r for r in rules if r["resources"] == ["nodeclaims"])
    assert "patch" not in claims["verbs"] and "update" not in claims["verbs"]
    docs = manifests.render("example.invalid/nodewarm:0.1.0", namespace="nw")
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Role"}
    assert roles["nodewarm-controller-leader"]["metadata"]["namespace"] == "nw"
    assert roles["nodewarm-controller-events"]["metadata"]["namespace"] == "default"
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 2 and "--leader-elect" in dep["spec"]["template"]["spec"]["containers"][0]["args"]


def test_controller_runs_as_its_service_account_and_is_refused_everything_else(kube):
    admin = kube.api_client()
    ak = Kube(admin)
    ns = uniq("nodewarm")
    sa_client = kube.api_client(kube.controller_token(ns))
    sa = Kube(sa_client)
    sim = KarpenterSim(admin)

    with installed(ak, user_data=None, user_startup_taints=()) as inst, \
            running(sa_client, leader_elect=True, lease_namespace=ns) as c:
        wait_for(lambda: c.is_leader.is_set(), what="leader via the Lease in its namespace")
        wait_for(lambda: ak.get(inst.nc_res, inst.node_class)["spec"].get("instanceStorePolicy") == "RAID0",
                 what="inject via server-side apply")
        wait_for(lambda: TAINT in [t["key"] for t in ak.get(NODEPOOLS, inst.pool)["spec"]["template"]["spec"]
                                    .get("startupTaints") or ()], what="startup taint injected")
        wait_for(lambda: (ak.get(WARMPROFILES, inst.name).get("status") or {}).get("conditions"),
                 what="WarmProfile status written")
        n = sim.scale_up(inst.pool)
        report_warm(admin, n.node, True, "WeightsVerified", "ok", {"nodewarm.io/compile-cache": "hit",
                                                                    "nodewarm.io/warm-generation": "4f2a9c1e0b7d3a65"})
        wait_for(lambda: TAINT not in taint_keys(ak, n.node), what="taint removed by the ServiceAccount")
        # ... and, in the same write, the generation label the vLLM pods select on.
        assert ak.get(NODES, n.node)["metadata"]["labels"]["nodewarm.io/generation"] == "4f2a9c1e0b7d3a65"
        wait_for(lambda: events_for(ak, "Node", n.node), what="event created by the ServiceAccount")
        assert c.metrics.reconcile_errors.labels("claim")._value.get() == 0

        forbidden = [
            lambda: sa.delete(PODS, "anything", "default"),
            lambda: sa.list(SECRETS, "default"),
            lambda: sa.get(SECRETS, "anything", ns),
            lambda: sa.create(LEASES, {"metadata": {"name": "x"}, "spec": {}}, "default"),
            lambda: sa.create(EVENTS, {"metadata": {"generateName": "x."}, "involvedObject": {"kind": "Node", "name": "x"}},
                              "kube-system"),
            lambda: sa.delete(NODES, n.node),
            lambda: sa.replace(NODES, n.node, ak.get(NODES, n.node)),
            lambda: sa.merge_patch(NODECLAIMS, n.claim, {"metadata": {"labels": {"x": "y"}}}),
            lambda: sa.create(NODEPOOLS, {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "x"}}),
            lambda: sa.replace(WARMPROFILES, inst.name, ak.get(WARMPROFILES, inst.name)),   # patch (finalizer) only
            lambda: sa.delete(WARMPROFILES, inst.name),
            lambda: sa.list(KINDS["ClusterRole"]),
        ]
        for i, call in enumerate(forbidden):
            with pytest.raises(ApiException) as e:
                call()
            assert e.value.status == 403, f"call #{i} got {e.value.status}, not 403"


