"""The Karpenter stand-in does what karpenter-semantics.md §c says Karpenter does, and nothing more."""

from __future__ import annotations

import pytest

from nodewarm.controller.kube import NODECLAIMS, NODEPOOLS, NODES, Kube
from nodewarm.testenv.karpenter import KarpenterSim

from controller_fixtures import installed

pytestmark = pytest.mark.kube


def _conds(obj: dict) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or ()}


def test_scale_up_follows_the_nodeclaim_lifecycle(kube):
    admin = kube.api_client()
    k, sim = Kube(admin), KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        pool_spec = k.get(NODEPOOLS, inst.pool)["spec"]["template"]["spec"]
        claim = sim.create_nodeclaim(inst.pool)
        name = claim["metadata"]["name"]
        assert claim["spec"]["startupTaints"] == pool_spec["startupTaints"]
        assert claim["spec"]["taints"] == pool_spec["taints"]
        assert claim["spec"]["nodeClassRef"] == pool_spec["nodeClassRef"]
        assert claim["metadata"]["labels"]["karpenter.sh/nodepool"] == inst.pool
        assert _conds(claim) == {}

        launched = sim.launch(name)
        assert launched["status"]["providerID"].startswith("aws:///") and _conds(launched) == {"Launched": "True"}
        node = sim.register_node(name)
        keys = [t["key"] for t in node["spec"]["taints"]]
        # NodeClaim taints + startupTaints + unregistered, plus not-ready added by the API server itself.
        assert set(keys) == {"nvidia.com/gpu", "nodewarm.io/warming", "karpenter.sh/unregistered",
                             "node.kubernetes.io/not-ready"}
        assert node["spec"]["providerID"] == launched["status"]["providerID"]

        sim.kubelet_ready(node["metadata"]["name"])
        registered = sim.mark_registered(name)
        assert _conds(registered) == {"Launched": "True", "Registered": "True"}
        assert registered["status"]["nodeName"] == node["metadata"]["name"]
        n = k.get(NODES, node["metadata"]["name"])
        assert n["metadata"]["labels"]["karpenter.sh/registered"] == "true"
        assert [t["key"] for t in n["spec"]["taints"]] == ["nvidia.com/gpu", "nodewarm.io/warming"]

        assert not sim.sync_initialized(name)       # startup taint still there
        init = next(c for c in k.get(NODECLAIMS, name)["status"]["conditions"] if c["type"] == "Initialized")
        assert (init["status"], init["reason"]) == ("False", "StartupTaintsExist")
        k.json_patch(NODES, n["metadata"]["name"], [{"op": "remove", "path": "/spec/taints/1"}])
        assert sim.sync_initialized(name)
        assert k.get(NODES, n["metadata"]["name"])["metadata"]["labels"]["karpenter.sh/initialized"] == "true"


def test_nodes_are_linked_by_provider_id_only(kube):
    admin = kube.api_client()
    k, sim = Kube(admin), KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        claim = sim.create_nodeclaim(inst.pool)["metadata"]["name"]
        sim.launch(claim)
        # A node named like the claim but with another providerID is not its node.
        k.create(NODES, {"metadata": {"name": claim, "labels": {"karpenter.sh/nodepool": inst.pool}},
                         "spec": {"providerID": "aws:///us-west-2a/i-other"}})
        with pytest.raises(LookupError, match="NodeNotFound"):
            sim.mark_registered(claim)
