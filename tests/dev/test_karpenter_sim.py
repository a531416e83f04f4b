"""The Karpenter stand-in does what docs/karpenter.md ("Startup taints and the NodeClaim lifecycle") says Karpenter
does, and nothing more."""

from __future__ import annotations

import pytest

from nodewarm.controller.kube import EC2NODECLASSES, NODECLAIMS, NODEPOOLS, NODES, Kube
from nodewarm.karpenter import drifthash
from nodewarm_dev.testenv.karpenter import DEFAULT_IMAGE_ID, KarpenterSim

from support.controller_fixtures import installed

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


def _lift(k: Kube, node: str, key: str = "nodewarm.io/warming") -> None:
    taints = k.get(NODES, node)["spec"]["taints"]
    k.merge_patch(NODES, node, {"spec": {"taints": [t for t in taints if t["key"] != key]}})


def _keys(k: Kube, node: str) -> list[str]:
    return [t["key"] for t in k.get(NODES, node)["spec"].get("taints") or ()]


def test_registration_merges_the_nodeclaims_taints_back_once(kube):
    admin = kube.api_client()
    k, sim = Kube(admin), KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        joined = sim.join(inst.pool)
        claim, node = joined.claim, joined.node
        _lift(k, node)                                  # lifted before registration
        _lift(k, node, "nvidia.com/gpu")
        sim.mark_registered(claim)
        n = k.get(NODES, node)
        # Appended where missing, spec.taints before spec.startupTaints; karpenter.sh/unregistered gone.
        assert _keys(k, node) == ["nvidia.com/gpu", "nodewarm.io/warming"]
        assert n["metadata"]["labels"]["karpenter.sh/registered"] == "true"
        c = k.get(NODECLAIMS, claim)
        assert all(n["metadata"]["annotations"][a] == v for a, v in c["metadata"]["annotations"].items())
        # Registered once: a taint lifted now stays lifted, and Initialized follows.
        _lift(k, node)
        sim.mark_registered(claim)
        assert _keys(k, node) == ["nvidia.com/gpu"]
        assert sim.sync_initialized(claim)


def test_registration_leaves_taints_alone_on_a_do_not_sync_taints_node(kube):
    admin = kube.api_client()
    k, sim = Kube(admin), KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        joined = sim.join(inst.pool)
        claim, node = joined.claim, joined.node
        k.merge_patch(NODES, node, {"metadata": {"labels": {"karpenter.sh/do-not-sync-taints": "true"}}})
        _lift(k, node)
        sim.mark_registered(claim)
        assert _keys(k, node) == ["nvidia.com/gpu"]     # not merged back; the unregistered taint still removed


def test_a_registration_hook_holds_registration_but_not_the_merge(kube):
    admin = kube.api_client()
    k, sim = Kube(admin), KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        joined = sim.join(inst.pool)
        claim, node = joined.claim, joined.node
        sim.hold_registration(claim, "capacity-reservation")
        _lift(k, node)
        held = sim.mark_registered(claim)
        reg = next(x for x in held["status"]["conditions"] if x["type"] == "Registered")
        assert (reg["status"], reg["reason"], reg["message"]) == ("Unknown", "RegistrationHookPending",
                                                                  "capacity-reservation")
        assert "nodeName" not in held["status"]
        assert {"nodewarm.io/warming", "karpenter.sh/unregistered"} <= set(_keys(k, node))
        _lift(k, node)
        sim.mark_registered(claim)                      # every pass while held merges again
        assert "nodewarm.io/warming" in _keys(k, node)
        assert not sim.sync_initialized(claim)          # initialization waits for Registered=True
        sim.release_registration(claim)
        assert _conds(sim.mark_registered(claim))["Registered"] == "True"
        assert "karpenter.sh/unregistered" not in _keys(k, node)


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
        assert sim.drifted(n.claim) == "NodeClassDrift"        # upstream's reason string
        m = sim.scale_up(inst.pool)                    # launched after the change: carries the new hash
        assert sim.drifted(m.claim) is None
        k.merge_patch(NODEPOOLS, inst.pool, {"spec": {"template": {"spec": {"startupTaints": []}}}})
        assert sim.drifted(m.claim) == "NodePoolDrifted"


def test_the_stamped_hashes_are_karpenters_exact_values(kube):
    admin = kube.api_client()
    k, sim = Kube(admin), KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        n = sim.scale_up(inst.pool)
        pool, nc = k.get(NODEPOOLS, inst.pool), k.get(EC2NODECLASSES, inst.node_class)
        assert sim.ca_bundle                               # the local API server's CA, base64 as Karpenter has it
        want = {"karpenter.sh/nodepool-hash": drifthash.nodepool_hash(pool).value,
                "karpenter.sh/nodepool-hash-version": "v3",
                "karpenter.k8s.aws/ec2nodeclass-hash": drifthash.ec2nodeclass_hash(nc, sim.ca_bundle, "v5").value,
                "karpenter.k8s.aws/ec2nodeclass-hash-version": "v5"}
        claim_ann = k.get(NODECLAIMS, n.claim)["metadata"]["annotations"]
        assert {x: claim_ann[x] for x in want} == want
        assert {x: ({**pool["metadata"]["annotations"], **nc["metadata"]["annotations"]})[x] for x in want} == want
        # Writing a default explicitly is a change to Karpenter: detailedMonitoring absent -> false drifts.
        k.merge_patch(EC2NODECLASSES, inst.node_class, {"spec": {"detailedMonitoring": False}})
        assert sim.drifted(n.claim) == "NodeClassDrift"


def test_a_hash_version_change_restamps_the_nodeclaims_instead_of_drifting_them(kube):
    admin = kube.api_client()
    k, sim = Kube(admin), KarpenterSim(admin)                 # Karpenter v1.14: ec2nodeclass hash v5
    with installed(k, inject_ready=True) as inst:
        n, d = sim.scale_up(inst.pool), sim.scale_up(inst.pool)
        k.merge_patch(EC2NODECLASSES, inst.node_class, {"spec": {"tags": {"team": "ml"}}})
        assert sim.mark_drifted(d.claim) == "NodeClassDrift"
        k.merge_patch(EC2NODECLASSES, inst.node_class, {"spec": {"tags": None}})
        old = k.get(NODECLAIMS, d.claim)["metadata"]["annotations"]["karpenter.k8s.aws/ec2nodeclass-hash"]
        v6 = KarpenterSim(admin, ec2nodeclass_hash_version="v6")   # the upgrade to a v6 Karpenter
        assert v6.drifted(n.claim) is None
        nc = k.get(EC2NODECLASSES, inst.node_class)
        ann = k.get(NODECLAIMS, n.claim)["metadata"]["annotations"]
        assert ann["karpenter.k8s.aws/ec2nodeclass-hash-version"] == "v6"
        assert ann["karpenter.k8s.aws/ec2nodeclass-hash"] == drifthash.ec2nodeclass_hash(nc, v6.ca_bundle, "v6").value
        # A NodeClaim already Drifted keeps its old hash (it stays drifted) but takes the new version.
        dann = k.get(NODECLAIMS, d.claim)["metadata"]["annotations"]
        assert (dann["karpenter.k8s.aws/ec2nodeclass-hash"], dann["karpenter.k8s.aws/ec2nodeclass-hash-version"]) == (old, "v6")
        # The same for the NodePool hash: an older version on pool and claims is re-stamped, not drift.
        for name in (inst.pool,):
            k.merge_patch(NODEPOOLS, name, {"metadata": {"annotations": {"karpenter.sh/nodepool-hash": "1",
                                                                        "karpenter.sh/nodepool-hash-version": "v2"}}})
        k.merge_patch(NODECLAIMS, n.claim, {"metadata": {"annotations": {"karpenter.sh/nodepool-hash": "2",
                                                                         "karpenter.sh/nodepool-hash-version": "v2"}}})
        assert v6.drifted(n.claim) is None
        assert k.get(NODECLAIMS, n.claim)["metadata"]["annotations"]["karpenter.sh/nodepool-hash"] == \
            drifthash.nodepool_hash(k.get(NODEPOOLS, inst.pool)).value


@pytest.mark.parametrize("op,value,drifted", [("Gte", "8", False), ("Gte", "9", True), ("Lte", "8", False),
                                              ("Lte", "7", True), ("Gt", "7", False), ("Lt", "8", True)])
def test_requirement_drift_knows_gte_and_lte(kube, op, value, drifted):
    admin = kube.api_client()
    k, sim = Kube(admin), KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        n = sim.scale_up(inst.pool)
        k.merge_patch(NODECLAIMS, n.claim, {"metadata": {"labels": {"karpenter.k8s.aws/instance-gpu-count": "8"}}})
        reqs = k.get(NODEPOOLS, inst.pool)["spec"]["template"]["spec"]["requirements"]
        k.merge_patch(NODEPOOLS, inst.pool, {"spec": {"template": {"spec": {"requirements": reqs + [
            {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": op, "values": [value]}]}}}})
        assert sim.drifted(n.claim) == ("RequirementsDrifted" if drifted else None)


def test_an_ami_release_is_ami_drift(kube):
    admin = kube.api_client()
    k, sim = Kube(admin), KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        n = sim.scale_up(inst.pool)
        sim.resolve_amis(inst.node_class, [DEFAULT_IMAGE_ID])
        assert sim.drifted(n.claim) is None
        sim.resolve_amis(inst.node_class, ["ami-0newrelease000000"])      # al2023@latest moved on
        assert sim.drifted(n.claim) == "AMIDrift"


def _initialized(k: Kube, sim: KarpenterSim, pool: str):
    n = sim.scale_up(pool)
    taints = k.get(NODES, n.node)["spec"]["taints"]
    k.merge_patch(NODES, n.node, {"spec": {"taints": [t for t in taints if t["key"] != "nodewarm.io/warming"]}})
    assert sim.sync_initialized(n.claim)
    return n


def test_repair_is_a_budgeted_terminate_first_disruption(kube):
    admin = kube.api_client()
    k, sim = Kube(admin), KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        a, b, c = (_initialized(k, sim, inst.pool) for _ in range(3))
        sim.set_node_condition(a.node, "AcceleratedHardwareReady", "False", ago_s=11 * 60)
        sim.set_node_condition(b.node, "AcceleratedHardwareReady", "False", ago_s=12 * 60)
        sim.set_node_condition(c.node, "AcceleratedHardwareReady", "False", ago_s=5 * 60)   # within toleration
        assert sim.repair_candidates(inst.pool) == [b.claim, a.claim]
        # A budget for another reason does not hold repair back; one for every reason does. (A budget naming
        # reason Unhealthy needs v1.15's CRD: the v1.14 CRDs installed here refuse it, as they should.)
        k.merge_patch(NODEPOOLS, inst.pool, {"spec": {"disruption": {"budgets": [{"nodes": "0", "reasons": ["Drifted"]}]}}})
        assert sim.repair_room(inst.pool) >= 3               # no budget names this reason: unlimited
        k.merge_patch(NODEPOOLS, inst.pool, {"spec": {"disruption": {"budgets": [{"nodes": "0"}]}}})
        assert sim.repair(inst.pool) == []
        k.merge_patch(NODEPOOLS, inst.pool, {"spec": {"disruption": {"budgets": [{"nodes": "1"}]}}})
        before = {x["metadata"]["name"] for x in k.list(NODECLAIMS)["items"]}
        assert sim.repair(inst.pool) == [b.claim]              # one at a time: the budget
        assert sim.repair(inst.pool) == []                     # b is still terminating and uses the budget
        after = {x["metadata"]["name"] for x in k.list(NODECLAIMS)["items"]}
        assert after == before                                 # terminate-first: no replacement launched ahead
        sim.finish_termination(b.claim)
        assert sim.repair(inst.pool) == [a.claim]


def test_an_uninitialized_node_being_deleted_does_not_use_up_the_repair_budget(kube):
    # BuildDisruptionBudgetMapping counts initialized nodes only, for the total and for those being deleted: a warming
    # node nodewarm's deadline is replacing (never initialized: its startup taint is on) leaves repair's budget alone.
    admin = kube.api_client()
    k, sim = Kube(admin), KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        a = _initialized(k, sim, inst.pool)
        warming = sim.scale_up(inst.pool)
        sim.delete_nodeclaim(warming.claim)
        k.merge_patch(NODEPOOLS, inst.pool, {"spec": {"disruption": {"budgets": [{"nodes": "1"}]}}})
        sim.set_node_condition(a.node, "AcceleratedHardwareReady", "False", ago_s=11 * 60)
        assert sim.repair(inst.pool) == [a.claim]
