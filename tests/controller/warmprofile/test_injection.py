"""Injection that cannot start a drift storm or fight GitOps (Step 7), on the real API server with the upstream
Karpenter CRDs. "Would drift" is asserted with the fields Karpenter hashes (nodewarm/karpenter/drift.py, which cites
the upstream Hash() functions), never with a hard-coded answer."""

from __future__ import annotations

import copy

import pytest
from kubernetes.client.exceptions import ApiException

from support.controller_fixtures import (
    TAINT, cleanup_condition, condition, events_for, installed, running, taint_keys, wait_for, wait_reason,
)
from nodewarm.controller.kube import NODECLAIMS, NODEPOOLS, WARMPROFILES
from nodewarm.karpenter import drift
from nodewarm.nodeclasses.render import warmprofile_document
from nodewarm_dev.testenv.karpenter import KarpenterSim

pytestmark = pytest.mark.kube


def manager_of(obj: dict, field: str) -> set[str]:
    return {m["manager"] for m in obj["metadata"].get("managedFields") or ()
            if f"f:{field}" in str(m.get("fieldsV1", {}).get("f:spec", {}))}


def test_a_field_another_manager_owns_is_a_conflict_naming_it_never_taken(admin, k):
    # The user's NodeClass/NodePool came from their GitOps tool with their own userData and startupTaints.
    with installed(k, manager="argocd-controller") as inst:
        before = k.get(inst.nc_res, inst.node_class)
        with running(admin):
            cond = wait_reason(k, inst.name, "Conflict")
        assert cond["status"] == "False"
        assert "argocd-controller" in cond["message"] and "userData" in cond["message"]
        after = k.get(inst.nc_res, inst.node_class)
        assert after["spec"]["userData"] == before["spec"]["userData"]
        assert manager_of(after, "userData") == {"argocd-controller"}
        ev = [e for e in events_for(k, "WarmProfile", inst.name) if e["reason"] == "Conflict"]
        assert ev and ev[0]["type"] == "Warning"


def test_a_gitops_manifest_from_render_reapplied_by_its_manager_does_not_flap(admin, k):
    """The user commits `nodewarm render` output and Argo CD applies it: the controller finds nothing to do,
    and Argo CD re-applying the same manifest changes nothing either; no write, no drift, ever."""
    with installed(k, inject_ready=True, manager="argocd-controller") as inst:
        nc0, np0 = k.get(inst.nc_res, inst.node_class), k.get(NODEPOOLS, inst.pool)
        with running(admin) as c:
            wait_reason(k, inst.name, "UpToDate")
            from nodewarm.kubeapply import apply

            for _ in range(2):       # the GitOps tool's sync loop
                assert {a.action for a in apply(admin, [inst.nodeclass, inst.nodepool],
                                                field_manager="argocd-controller", force=False)} == {"unchanged"}
            c.queue.add(f"profile/{inst.name}")
            wait_for(lambda: c.metrics.injections.labels("NodePool", "uptodate")._value.get() >= 2,
                     what="a second reconcile")
            assert c.kube.writes[("ec2nodeclasses", "PATCH")] == c.kube.writes[("nodepools", "PATCH")] == 0
        nc1, np1 = k.get(inst.nc_res, inst.node_class), k.get(NODEPOOLS, inst.pool)
        assert nc1["metadata"]["resourceVersion"] == nc0["metadata"]["resourceVersion"]
        assert np1["metadata"]["resourceVersion"] == np0["metadata"]["resourceVersion"]
        assert drift.static_hash(nc1) == drift.static_hash(nc0) and drift.static_hash(np1) == drift.static_hash(np0)


def _second_pool(k, inst, name, node_class=None):
    pool = copy.deepcopy(inst.nodepool)
    pool["metadata"] = {"name": name}
    if node_class:
        pool["spec"]["template"]["spec"]["nodeClassRef"]["name"] = node_class
        nc = copy.deepcopy(inst.nodeclass)
        nc["metadata"] = {"name": node_class}
        k.create(inst.nc_res, nc)
    k.create(NODEPOOLS, pool)
    return name


def test_a_change_that_would_drift_live_nodeclaims_is_refused_with_the_count_then_allowed(admin, k):
    sim = KarpenterSim(admin)
    with installed(k, user_data=None, user_startup_taints=()) as inst:
        other = _second_pool(k, inst, f"{inst.pool}-b")
        unrelated = _second_pool(k, inst, f"{inst.pool}-c", node_class=f"{inst.node_class}-other")
        try:
            claims = [sim.create_nodeclaim(inst.pool)["metadata"]["name"] for _ in range(2)]
            claims.append(sim.create_nodeclaim(other)["metadata"]["name"])
            sim.create_nodeclaim(unrelated)                    # another class's pool: not counted
            before = k.get(inst.nc_res, inst.node_class)
            with running(admin):
                cond = wait_reason(k, inst.name, "WouldDrift")
            assert "would drift 3 live NodeClaim(s)" in cond["message"]
            assert inst.pool in cond["message"] and other in cond["message"]
            assert "spec.injection.onLive: drift" in cond["message"]
            assert k.get(inst.nc_res, inst.node_class)["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
            assert any(e["reason"] == "WouldDrift" and e["type"] == "Warning"
                       for e in events_for(k, "WarmProfile", inst.name))

            k.merge_patch(WARMPROFILES, inst.name, {"spec": {"injection": {"onLive": "drift"}}})
            with running(admin):
                wait_reason(k, inst.name, "UpToDate")
            after = k.get(inst.nc_res, inst.node_class)
            assert after["spec"]["instanceStorePolicy"] == "RAID0"
            # The refusal was right: what Karpenter hashes did change.
            assert drift.static_hash(after) != drift.static_hash(before)
        finally:
            for c in k.list(NODECLAIMS)["items"]:
                if (c["metadata"].get("labels") or {}).get("karpenter.sh/nodepool") in (other, unrelated):
                    k.delete(NODECLAIMS, c["metadata"]["name"])
            k.delete(NODEPOOLS, other)
            k.delete(NODEPOOLS, unrelated)
            k.delete(inst.nc_res, f"{inst.node_class}-other")


def test_verify_mode_reports_differences_and_writes_nothing(admin, k):
    with installed(k, user_data=None, user_startup_taints=(), spec__injection__mode="verify") as inst:
        before = k.get(inst.nc_res, inst.node_class)["metadata"]["resourceVersion"]
        with running(admin) as c:
            cond = wait_reason(k, inst.name, "Differs")
            assert sum(n for (res, verb), n in c.kube.writes.items() if res in ("ec2nodeclasses", "nodepools")) == 0
        assert "spec.instanceStorePolicy" in cond["message"] and "startupTaints" in cond["message"]
        assert k.get(inst.nc_res, inst.node_class)["metadata"]["resourceVersion"] == before
    with installed(k, inject_ready=True, spec__injection__mode="verify") as inst, running(admin):
        assert wait_reason(k, inst.name, "UpToDate")["status"] == "True"


def _drifted(sim, pool: str, k) -> list[str]:
    """The NodeClaims of ``pool`` the Karpenter stand-in finds drifted (hash stamps or requirements)."""
    return [c["metadata"]["name"] for c in k.list(NODECLAIMS)["items"]
            if (c["metadata"].get("labels") or {}).get("karpenter.sh/nodepool") == pool
            and not c["metadata"].get("deletionTimestamp") and sim.drifted(c["metadata"]["name"])]


def test_deleting_a_profile_with_live_nodeclaims_replaces_no_node_and_new_nodes_still_lift(kube, admin, k):
    """startupTaints is in Karpenter's NodePool hash: taking nodewarm's taint out while NodeClaims live drifts
    (replaces) them all. So the taint stays, the terminating profile keeps gating the pool (a new node still warms
    and is untainted), the condition says how to finish and what it costs, and the clean-up ends by itself once the
    pool has no NodeClaim left."""
    from nodewarm.bootstrap.nodestatus import report_warm

    sim = KarpenterSim(admin)
    with installed(k, user_data=None, user_startup_taints=()) as inst, running(admin):
        wait_reason(k, inst.name, "UpToDate")
        old = sim.scale_up(inst.pool, node_name="node-6")        # launched with nodewarm's taint in the pool
        assert _drifted(sim, inst.pool, k) == []
        k.delete(WARMPROFILES, inst.name)
        cond = wait_for(lambda: cleanup_condition(k, inst.name), what="the clean-up held, and why")
        assert (cond["status"], cond["reason"]) == ("False", "WouldDrift")
        for words in ("would drift 1 live NodeClaim(s)", "67 GB of weights pulled again (1 x 67 GB)",
                      "scale to zero", "spec.injection.onLive: drift"):
            assert words in cond["message"], cond["message"]
        assert any(e["reason"] == "WouldDrift" and e["type"] == "Warning" for e in events_for(k, "WarmProfile", inst.name))
        taints = k.get(NODEPOOLS, inst.pool)["spec"]["template"]["spec"]["startupTaints"]
        assert [t["key"] for t in taints] == [TAINT]               # kept: the pool's hash did not change
        assert _drifted(sim, inst.pool, k) == []                   # no node replaced

        # A node launched while the clean-up waits carries the taint; it warms and is untainted as before.
        new = sim.scale_up(inst.pool, node_name="node-5")
        report_warm(kube.api_client(kube.node_token("node-5")), "node-5", True, "WeightsVerified", "ok")
        wait_for(lambda: TAINT not in taint_keys(k, "node-5"), what="a new node of the held pool untainted")
        assert _drifted(sim, inst.pool, k) == []

        # The pool scales to zero: now the taint can go without replacing anything, and the profile goes with it.
        for n in (old, new):
            sim.delete_nodeclaim(n.claim)
            sim.finish_termination(n.claim)
        wait_for(lambda: not _exists(k, WARMPROFILES, inst.name), what="the clean-up finished")
        assert not k.get(NODEPOOLS, inst.pool)["spec"]["template"]["spec"].get("startupTaints")


def test_deleting_a_profile_with_onlive_drift_removes_the_taint_and_says_what_it_replaced(admin, k):
    sim = KarpenterSim(admin)
    with installed(k, user_data=None, user_startup_taints=(), spec__injection__onLive="drift") as inst, running(admin):
        wait_reason(k, inst.name, "UpToDate")
        n = sim.scale_up(inst.pool, node_name="node-6")
        k.delete(WARMPROFILES, inst.name)
        wait_for(lambda: not _exists(k, WARMPROFILES, inst.name), what="profile gone after its clean-up")
        assert all(t["key"] != TAINT for t in k.get(NODEPOOLS, inst.pool)["spec"]["template"]["spec"].get(
            "startupTaints") or ())
        assert TAINT not in taint_keys(k, "node-6")
        assert _drifted(sim, inst.pool, k) == [n.claim]           # the user asked: Karpenter replaces it
        ev = [e for e in events_for(k, "NodePool", inst.pool) if e["reason"] == "NodewarmReleased"]
        assert ev and "1 node(s) replaced" in ev[0]["message"]


def test_a_deleted_profiles_clean_up_waits_for_registration_so_no_node_keeps_its_taint(admin, k):
    """A NodeClaim keeps the startupTaints it was created with, and Karpenter's registration merges them into its
    Node: the clean-up lifts nothing before registration and holds its finalizer until the node has registered, then
    lifts the taint and goes. Lifting earlier would leave the node under a taint nobody lifts."""
    sim = KarpenterSim(admin)
    with installed(k, user_data=None, user_startup_taints=(), spec__injection__onLive="drift") as inst, running(admin):
        wait_reason(k, inst.name, "UpToDate")
        claim = sim.join(inst.pool, "node-4").claim
        k.delete(WARMPROFILES, inst.name)
        cond = wait_for(lambda: (c := cleanup_condition(k, inst.name)) and c["reason"] == "AwaitingRegistration" and c,
                        what="the clean-up waiting for registration")
        assert "node-4" in cond["message"] and claim in cond["message"]
        assert TAINT in taint_keys(k, "node-4")
        sim.mark_registered(claim)
        wait_for(lambda: not _exists(k, WARMPROFILES, inst.name), what="the clean-up finished after registration")
        assert TAINT not in taint_keys(k, "node-4")


def test_deleting_a_profile_of_a_pool_without_nodes_removes_its_taint_at_once(admin, k):
    with installed(k, user_data=None, user_startup_taints=()) as inst, running(admin):
        wait_reason(k, inst.name, "UpToDate")
        assert "nodewarm.io/cleanup" in k.get(WARMPROFILES, inst.name)["metadata"]["finalizers"]
        k.delete(WARMPROFILES, inst.name)
        wait_for(lambda: not _exists(k, WARMPROFILES, inst.name), what="profile gone after its clean-up")
        taints = k.get(NODEPOOLS, inst.pool)["spec"]["template"]["spec"].get("startupTaints") or []
        assert all(t["key"] != TAINT for t in taints)


def test_a_renamed_taint_key_replaces_the_old_one_and_old_nodes_still_lift(kube, admin, k):
    from nodewarm.bootstrap.nodestatus import report_warm

    sim = KarpenterSim(admin)
    # A renamed startup taint is a NodePool template change: it drifts live NodeClaims, so it needs onLive: drift.
    with installed(k, user_data=None, user_startup_taints=(), spec__injection__onLive="drift") as inst, running(admin):
        wait_reason(k, inst.name, "UpToDate")
        old = sim.scale_up(inst.pool, node_name="node-7")          # registered with the old key
        k.merge_patch(WARMPROFILES, inst.name, {"spec": {"readiness": {"taintKey": "example.com/warming"}}})
        wait_for(lambda: [t["key"] for t in k.get(NODEPOOLS, inst.pool)["spec"]["template"]["spec"]["startupTaints"]]
                 == ["example.com/warming"], what="the pool's startup taint renamed, not added")
        # The status is written after the pool (the record of what was injected follows the injection).
        wait_for(lambda: k.get(WARMPROFILES, inst.name)["status"]["injected"]["retiredTaintKeys"] == [TAINT],
                 what="the old key recorded as retired")
        report_warm(kube.api_client(kube.node_token("node-7")), "node-7", True, "WeightsVerified", "ok")
        wait_for(lambda: TAINT not in taint_keys(k, "node-7"), what="the old key lifted from a node that warmed")
        assert old.claim


def test_a_second_profile_on_a_bound_pool_or_class_is_refused(admin, k):
    with installed(k, user_data=None, user_startup_taints=()) as inst, running(admin):
        wait_reason(k, inst.name, "UpToDate")
        for suffix, changes, reason in (("pool", {"nodePool": inst.pool, "nodeClass": "elsewhere"}, "NodePoolTaken"),
                                        ("class", {"nodePool": "elsewhere", "nodeClass": inst.node_class},
                                         "NodeClassTaken")):
            doc = copy.deepcopy(inst.doc)
            doc["metadata"]["name"] = f"{inst.name}-{suffix}"
            doc["spec"]["nodes"].update(changes)
            from nodewarm import profile

            k.create(WARMPROFILES, warmprofile_document(profile.from_dict(doc)))
            try:
                cond = wait_reason(k, doc["metadata"]["name"], reason)
                assert inst.name in cond["message"]
                assert condition(k, inst.name)["reason"] == "UpToDate"      # the first binding is untouched
            finally:
                k.merge_patch(WARMPROFILES, doc["metadata"]["name"], {"metadata": {"finalizers": None}})
                k.delete(WARMPROFILES, doc["metadata"]["name"])


@pytest.mark.parametrize("change, reason", [
    (lambda nc, np: np["spec"]["template"]["spec"].update(taints=[{"key": TAINT, "effect": "NoSchedule"}]),
     "TaintKeyInUse"),
    (lambda nc, np: np["spec"]["template"]["spec"]["nodeClassRef"].update(name="someone-elses"), "NodeClassMismatch"),
    (lambda nc, np: nc["spec"].update(amiSelectorTerms=[{"alias": "al2@latest"}], amiFamily="AL2"), "UnsupportedAMIFamily"),
    (lambda nc, np: np["spec"]["template"]["spec"].update(requirements=[
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge", "p4d.24xlarge"]},
        {"key": "nodewarm.io/generation", "operator": "Exists"}]),
     None),
    # Without it Karpenter would launch no node for the vLLM pods (they select nodewarm.io/generation).
    (lambda nc, np: np["spec"]["template"]["spec"].update(requirements=[
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge", "p4d.24xlarge"]}]),
     "NoGenerationRequirement"),
    (lambda nc, np: np["spec"]["template"]["spec"].update(requirements=[
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge", "m5.large"]}]),
     "NoNVMe"),
    (lambda nc, np: np["spec"]["template"]["spec"].update(requirements=[
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]), "NoNVMe"),
])
def test_live_objects_nodewarm_must_not_inject_into_are_refused(admin, k, change, reason):
    with installed(k, user_data=None, user_startup_taints=()) as inst:
        nc, np = k.get(inst.nc_res, inst.node_class), k.get(NODEPOOLS, inst.pool)
        change(nc, np)
        k.replace(inst.nc_res, inst.node_class, nc)
        k.replace(NODEPOOLS, inst.pool, np)
        with running(admin):
            cond = wait_reason(k, inst.name, reason or "UpToDate")
        assert (cond["status"] == "True") == (reason is None), cond


def _exists(k, res, name) -> bool:
    try:
        k.get(res, name)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise
