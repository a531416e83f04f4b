"""The Karpenter stand-in does what karpenter-semantics.md §c says Karpenter does, and nothing more."""

from __future__ import annotations

import pytest

from nodewarm.controller.kube import EC2NODECLASSES, NODECLAIMS, NODEPOOLS, NODES, Kube
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

        assert claim["metadata"]["finalizers"] == ["karpenter.sh/termination"]
        launched = sim.launch(name)
        assert launched["status"]["providerID"].startswith("aws:///")
        # Karpenter's conditions start Unknown and go True; none is ever False on the way up.
        assert _conds(launched) == {"Launched": "True", "Registered": "Unknown", "Initialized": "Unknown"}
        node = sim.register_node(name)
        keys = [t["key"] for t in node["spec"]["taints"]]
        # NodeClaim taints + startupTaints + unregistered, plus not-ready added by the API server itself.
        assert set(keys) == {"nvidia.com/gpu", "nodewarm.io/warming", "karpenter.sh/unregistered",
                             "node.kubernetes.io/not-ready"}
        assert node["spec"]["providerID"] == launched["status"]["providerID"]

        sim.kubelet_ready(node["metadata"]["name"])
        registered = sim.mark_registered(name)
        assert _conds(registered) == {"Launched": "True", "Registered": "True", "Initialized": "Unknown"}
        assert registered["status"]["nodeName"] == node["metadata"]["name"]
        n = k.get(NODES, node["metadata"]["name"])
        assert n["metadata"]["labels"]["karpenter.sh/registered"] == "true"
        assert n["metadata"]["finalizers"] == ["karpenter.sh/termination"]
        assert n["metadata"]["ownerReferences"][0]["uid"] == claim["metadata"]["uid"]
        assert [t["key"] for t in n["spec"]["taints"]] == ["nvidia.com/gpu", "nodewarm.io/warming"]

        assert not sim.sync_initialized(name)       # startup taint still there
        init = next(c for c in k.get(NODECLAIMS, name)["status"]["conditions"] if c["type"] == "Initialized")
        assert (init["status"], init["reason"]) == ("Unknown", "StartupTaintsExist")
        assert "nodewarm.io/warming" in init["message"]
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


def test_deleting_waits_for_the_termination_finalizers(kube):
    admin = kube.api_client()
    k, sim = Kube(admin), KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        n = sim.scale_up(inst.pool)
        sim.delete_nodeclaim(n.claim)
        c = k.get(NODECLAIMS, n.claim)                 # still there: Karpenter has not terminated it yet
        assert c["metadata"]["deletionTimestamp"] and k.get(NODES, n.node)
        sim.finish_termination(n.claim)
        names = lambda res: {x["metadata"]["name"] for x in k.list(res)["items"]}  # noqa: E731
        assert n.claim not in names(NODECLAIMS) and n.node not in names(NODES)

        m = sim.scale_up(inst.pool)
        sim.delete_node(m.node)                        # a deleted Node takes its NodeClaim with it
        assert m.claim not in names(NODECLAIMS) and m.node not in names(NODES)


def test_drift_hashes_follow_the_hashed_fields_only(kube):
    admin = kube.api_client()
    k, sim = Kube(admin), KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        n = sim.scale_up(inst.pool)
        ann = k.get(NODECLAIMS, n.claim)["metadata"]["annotations"]
        assert ann["karpenter.sh/nodepool-hash"] == k.get(NODEPOOLS, inst.pool)["metadata"]["annotations"][
            "karpenter.sh/nodepool-hash"]
        assert ann["karpenter.k8s.aws/ec2nodeclass-hash"] and ann["karpenter.k8s.aws/ec2nodeclass-hash-version"]
        assert sim.drifted(n.claim) is None
        # requirements are not hashed (they drift by value, not by hash): no drift
        reqs = k.get(NODEPOOLS, inst.pool)["spec"]["template"]["spec"]["requirements"]
        k.merge_patch(NODEPOOLS, inst.pool, {"spec": {"template": {"spec": {"requirements": reqs + [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]}}}})
        assert sim.drifted(n.claim) is None
        k.merge_patch(EC2NODECLASSES, inst.node_class, {"spec": {"userData": "#!/bin/bash\necho changed\n"}})
        assert sim.drifted(n.claim) == "NodeClassDrifted"
        m = sim.scale_up(inst.pool)                    # launched after the change: carries the new hash
        assert sim.drifted(m.claim) is None
        k.merge_patch(NODEPOOLS, inst.pool, {"spec": {"template": {"spec": {"startupTaints": []}}}})
        assert sim.drifted(m.claim) == "NodePoolDrifted"
