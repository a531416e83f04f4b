"""The controller against the real local kube-apiserver with the upstream Karpenter CRDs, with the
Karpenter stand-in playing Karpenter and the node agent reporting through its own kubelet identity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from kubernetes.client.exceptions import ApiException

from nodewarm.api import generation
from nodewarm.bootstrap.nodestatus import report_warm
from nodewarm.controller.kube import NODECLAIMS, NODEPOOLS, NODES, WARMPROFILES
from nodewarm.controller.manager import Controller
from nodewarm.api.names import STATE_ANNOTATION
from nodewarm_dev.testenv.karpenter import KarpenterSim

from support.controller_fixtures import TAINT, events_for, installed, options, running, taint_keys, wait_for
from support import paths

pytestmark = pytest.mark.kube
REPO = paths.REPO


def _owned_by(obj: dict, manager: str) -> set[str]:
    fields = set()
    for m in obj["metadata"].get("managedFields") or ():
        if m["manager"] == manager:
            fields |= set(_paths(m.get("fieldsV1") or {}))
    return fields


def _paths(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for key, sub in tree.items():
        if key == ".":
            continue
        name = prefix + "." + key[2:] if key.startswith("f:") else prefix + key
        out.append(name)
        out += _paths(sub, name)
    return out


def test_inject_converges_once_and_owns_only_its_fields(admin, k):
    # Objects nobody else set these fields on (no user data, no startup taints), and no live NodeClaim:
    # nothing to conflict with, nothing to drift.
    with installed(k, user_data=None, user_startup_taints=()) as inst:
        with running(admin):
            wait_for(lambda: (k.get(WARMPROFILES, inst.name).get("status") or {}).get("conditions"),
                     what="Injected condition on the WarmProfile")
            nc = k.get(inst.nc_res, inst.node_class)
            np = k.get(NODEPOOLS, inst.pool)
        cond = k.get(WARMPROFILES, inst.name)["status"]["conditions"][0]
        assert (cond["type"], cond["status"], cond["reason"]) == ("Injected", "True", "UpToDate"), cond
        assert nc["spec"]["instanceStorePolicy"] == "RAID0"
        assert "nodewarm-userdata-part" in nc["spec"]["userData"]
        assert np["spec"]["template"]["spec"]["startupTaints"] == [{"key": TAINT, "effect": "NoSchedule"}]
        owned = _owned_by(nc, "nodewarm")
        assert {".spec.instanceStorePolicy", ".spec.userData"} <= owned
        assert not any(p.startswith((".spec.role", ".spec.subnetSelectorTerms", ".spec.amiSelectorTerms")) for p in owned)
        assert k.get(WARMPROFILES, inst.name)["status"]["injected"] == {
            "nodePool": inst.pool, "nodeClass": inst.node_class, "taintKey": TAINT, "retiredTaintKeys": []}
        assert events_for(k, "EC2NodeClass", inst.node_class), "no event for the applied NodeClass"
        rv_nc, rv_np = nc["metadata"]["resourceVersion"], np["metadata"]["resourceVersion"]

        # A second controller (a restart) finds nothing to change: no write, so no drift.
        with running(admin) as c2:
            wait_for(lambda: c2.metrics.injections.labels("EC2NodeClass", "uptodate")._value.get() >= 1,
                     what="second controller to reconcile the profile")
            assert c2.kube.writes[("ec2nodeclasses", "PATCH")] == 0
            assert c2.kube.writes[("nodepools", "PATCH")] == 0
        assert k.get(inst.nc_res, inst.node_class)["metadata"]["resourceVersion"] == rv_nc
        assert k.get(NODEPOOLS, inst.pool)["metadata"]["resourceVersion"] == rv_np


def test_audit_mode_reports_and_writes_nothing(admin, k):
    with installed(k) as inst:
        before = k.get(inst.nc_res, inst.node_class)["metadata"]["resourceVersion"]
        c = Controller(admin, options(dry_run=True))
        summary = c.run_once()
        mine = summary["profiles"][inst.name]
        assert mine["condition"]["reason"] == "AuditOnly"
        changed = {t["kind"]: set(t["changedFields"]) for t in mine["targets"]}
        assert changed["EC2NodeClass"] == {"spec.instanceStorePolicy", "spec.userData"}
        assert changed["NodePool"] == {"spec.template.spec.startupTaints"}
        assert not any(t["applied"] for t in mine["targets"])
        assert sum(c.kube.writes.values()) == 0
        assert k.get(inst.nc_res, inst.node_class)["metadata"]["resourceVersion"] == before
        assert "status" not in k.get(WARMPROFILES, inst.name)


def test_cli_once_dry_run_prints_the_audit_as_json(kube, k, tmp_path):
    kcfg = kube.write_kubeconfig(tmp_path / "kubeconfig")
    with installed(k) as inst:
        before = k.get(inst.nc_res, inst.node_class)["metadata"]["resourceVersion"]
        out = subprocess.run([sys.executable, "-m", "nodewarm.cli", "controller", "--kubeconfig", str(kcfg),
                              "--dry-run", "--once"], capture_output=True, text=True, timeout=60, check=True,
                             env=dict(os.environ), cwd=REPO)
        summary = json.loads(out.stdout)
        assert summary["dryRun"] is True
        assert summary["profiles"][inst.name]["condition"]["reason"] == "AuditOnly"
        assert k.get(inst.nc_res, inst.node_class)["metadata"]["resourceVersion"] == before


def test_cli_without_credentials_says_how_to_fix(tmp_path):
    out = subprocess.run([sys.executable, "-m", "nodewarm.cli", "controller", "--kubeconfig", str(tmp_path / "none"),
                          "--once"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "KUBERNETES_SERVICE_HOST": ""}, cwd=REPO)
    assert out.returncode == 1 and "NoCredentials" in out.stderr and "--kubeconfig" in out.stderr


def test_semantically_invalid_profile_is_reported_and_nothing_is_applied(admin, k):
    with installed(k) as inst:
        before = k.get(inst.nc_res, inst.node_class)["metadata"]["resourceVersion"]
        # Valid for the CRD schema, impossible on the hardware: p5.48xlarge has 8 GPUs.
        k.merge_patch(WARMPROFILES, inst.name, {"spec": {"serving": {"tensorParallelSize": 3}}})
        with running(admin):
            cond = wait_for(lambda: ((k.get(WARMPROFILES, inst.name).get("status") or {}).get("conditions") or [None])[0],
                            what="Injected condition")
        assert (cond["status"], cond["reason"]) == ("False", "InvalidProfile")
        assert "tensorParallelSize" in cond["message"]
        assert k.get(inst.nc_res, inst.node_class)["metadata"]["resourceVersion"] == before


def test_automode_nodeclass_gets_ephemeral_storage_below_nvme(admin, k):
    with installed(k, mode="automode", user_data=None, user_startup_taints=()) as inst:
        with running(admin):
            nc = wait_for(lambda: (x := k.get(inst.nc_res, inst.node_class))["spec"].get("ephemeralStorage") and x,
                          what="ephemeralStorage on the Auto Mode NodeClass")
        size = nc["spec"]["ephemeralStorage"]["size"]
        assert size.endswith(("G", "Gi")) and int(size.rstrip("Gi")) < 30400   # p5.48xlarge NVMe is 30400 GB
        assert nc["spec"]["role"] == inst.profile.nodes.role                    # the user's fields untouched


def test_warm_node_is_untainted_labelled_recorded_and_initialized(kube, admin, k):
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst, running(admin) as c:
        n = sim.scale_up(inst.pool, node_name="node-2")
        k.json_patch(NODES, "node-2", [{"op": "add", "path": "/spec/taints/-",
                                        "value": {"key": "example.com/other", "value": "x", "effect": "NoSchedule"}}])
        assert TAINT in taint_keys(k, "node-2")
        assert not sim.sync_initialized(n.claim)          # Karpenter holds Initialized while the startup taint is on

        report_warm(kube.api_client(kube.node_token("node-2")), "node-2", True, "WeightsVerified", "67 GB verified",
                    {"nodewarm.io/compile-cache": "hit", "nodewarm.io/compile-cache-reason": "key abc found"})
        wait_for(lambda: TAINT not in taint_keys(k, "node-2"), what="readiness taint removed")
        wait_for(lambda: c.decisions, what="decision recorded")
        node = k.get(NODES, "node-2")
        assert [t["key"] for t in node["spec"]["taints"]] == ["nvidia.com/gpu", "example.com/other"]
        labels = node["metadata"]["labels"]
        assert labels["nodewarm.io/warm"] == "true" and labels["nodewarm.io/compile-cache"] == "hit"
        assert labels["nodewarm.io/model"] == "qwen3-35b" and labels["nodewarm.io/profile"] == inst.name
        state = json.loads(node["metadata"]["annotations"][STATE_ANNOTATION])
        assert state["decision"] == "Untainted" and state["nodeClaim"] == n.claim
        assert {c["type"]: c["reason"] for c in state["conditions"]} == {"Tracked": "NodeFound",
                                                                          "Untainted": "WarmConditionTrue"}
        assert sim.sync_initialized(n.claim)
        assert k.get(NODES, "node-2")["metadata"]["labels"]["karpenter.sh/initialized"] == "true"
        wait_for(lambda: events_for(k, "Node", "node-2") and events_for(k, "NodeClaim", n.claim), what="events")
        ev = events_for(k, "Node", "node-2")[0]
        assert ev["reason"] == "Untainted" and "compile cache hit" in ev["message"]
        assert ev["related"]["name"] == n.claim
        assert c.metrics.taints_removed.labels(inst.pool)._value.get() == 1
        assert c.metrics.cache.labels(inst.pool, "hit")._value.get() == 1
        assert c.kube.writes[("nodes", "PATCH")] == 1      # one guarded patch: taint, labels and record together
        assert k.get(NODECLAIMS, n.claim)["status"]["nodeName"] == "node-2"


@pytest.mark.parametrize("action", ["untaint", "replace", "keep"])
def test_deadline_actions(admin, k, action):
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True, deadline="1m", on_deadline=action) as inst, running(admin) as c:
        n = sim.scale_up(inst.pool, registered_ago_s=59)      # the minute is up a second from now
        if action == "untaint":
            wait_for(lambda: TAINT not in taint_keys(k, n.node), what="cold untaint")
            node = k.get(NODES, n.node)
            assert node["metadata"]["labels"]["nodewarm.io/warm"] == "cold"
            # ... and the profile's generation label in the same write, so the vLLM pods (which select it) land
            # and stream the model from S3.
            assert node["metadata"]["labels"]["nodewarm.io/generation"] == generation.generation(inst.profile)
            assert json.loads(node["metadata"]["annotations"][STATE_ANNOTATION])["decision"] == "DeadlineUntaint"
        elif action == "replace":
            wait_for(lambda: k.get(NODECLAIMS, n.claim)["metadata"].get("deletionTimestamp"), what="NodeClaim deleted")
            assert TAINT in taint_keys(k, n.node)        # the node goes away with its claim; never untainted
            sim.finish_termination(n.claim)
        else:
            wait_for(lambda: STATE_ANNOTATION in (k.get(NODES, n.node)["metadata"].get("annotations") or {}),
                     what="keep decision recorded")
            assert TAINT in taint_keys(k, n.node)
        wait_for(lambda: c.decisions, what="decision recorded")
        reason = {"untaint": "WarmDeadlineUntaint", "replace": "WarmDeadlineReplace", "keep": "WarmDeadlineKeep"}[action]
        wait_for(lambda: [e for e in events_for(k, "NodeClaim", n.claim) if e["reason"] == reason], what="deadline event")
        assert c.metrics.deadlines.labels(inst.pool, action)._value.get() == 1
        assert c.decisions.count((n.claim, {"untaint": "untaint", "replace": "delete_claim", "keep": "record"}[action])) == 1


def _warm(kube, admin, node: str, ok: bool = True, reason: str = "WeightsVerified") -> None:
    report_warm(admin, node, ok, reason, "ok" if ok else "failed", {"nodewarm.io/compile-cache": "miss"})


def test_keep_then_a_late_warm_still_lifts_the_taint(kube, admin, k):
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True, deadline="1m", on_deadline="keep") as inst, running(admin) as c:
        n = sim.scale_up(inst.pool, registered_ago_s=120)
        wait_for(lambda: (n.claim, "record") in c.decisions, what="keep decision")
        assert TAINT in taint_keys(k, n.node)
        _warm(kube, admin, n.node)                    # the weights arrive late
        wait_for(lambda: TAINT not in taint_keys(k, n.node), what="late Warm lifts the taint")
        state = json.loads(k.get(NODES, n.node)["metadata"]["annotations"][STATE_ANNOTATION])
        assert state["decision"] == "Untainted"
        assert c.decisions.count((n.claim, "record")) == 1 and c.decisions.count((n.claim, "untaint")) == 1


def test_a_node_that_just_turned_warm_is_untainted_never_replaced(kube, admin, k):
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True, deadline="1m", on_deadline="replace") as inst, \
            running(admin, workers=0) as c:
        n = sim.scale_up(inst.pool, registered_ago_s=120)
        wait_for(lambda: n.claim in c.claims.store and c.node_for(c.claims.store[n.claim]), what="claim and node cached")
        c.nodes.stop()                                # the cache falls behind: it never sees the Warm report
        _warm(kube, admin, n.node)
        plan = c.reconcile_claim(n.claim)             # the cached view says "past the deadline, replace"
        assert plan.action == "untaint"
        assert not k.get(NODECLAIMS, n.claim)["metadata"].get("deletionTimestamp")
        assert TAINT not in taint_keys(k, n.node)
        assert c.kube.writes[("nodeclaims", "DELETE")] == 0


def test_replace_budget_per_nodepool_pauses_and_says_so(kube, admin, k):
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True, deadline="1m", on_deadline="replace") as inst, \
            running(admin, replace_budget=1) as c:
        a = sim.scale_up(inst.pool, registered_ago_s=120)
        b = sim.scale_up(inst.pool, registered_ago_s=120)
        cond = wait_for(lambda: next((x for x in (k.get(WARMPROFILES, inst.name).get("status") or {}).get("conditions")
                                      or () if x["type"] == "ReplacementsPaused"), None), what="ReplacementsPaused")
        assert (cond["status"], cond["reason"]) == ("True", "BudgetExhausted") and inst.pool in cond["message"]
        deleting = [x for x in (a.claim, b.claim) if k.get(NODECLAIMS, x)["metadata"].get("deletionTimestamp")]
        assert len(deleting) == 1
        assert c.metrics.deadlines.labels(inst.pool, "replace")._value.get() == 1
        kept = ({a.claim, b.claim} - set(deleting)).pop()
        assert TAINT in taint_keys(k, a.node if kept == a.claim else b.node)


def test_replace_is_not_tried_when_a_new_node_would_fail_the_same_way(kube, admin, k):
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True, deadline="1m", on_deadline="replace") as inst, running(admin) as c:
        n = sim.scale_up(inst.pool, registered_ago_s=30)
        _warm(kube, admin, n.node, ok=False, reason="NotInstanceStore")
        wait_for(lambda: (n.claim, "record") in c.decisions, timeout_s=45, what="not-replaced decision")
        assert not k.get(NODECLAIMS, n.claim)["metadata"].get("deletionTimestamp")
        wait_for(lambda: [e for e in events_for(k, "NodeClaim", n.claim) if e["reason"] == "WarmDeadlineNotReplaced"],
                 what="event")
        assert c.metrics.deadlines.labels(inst.pool, "not_replaced")._value.get() == 1


def test_the_server_enforces_the_preconditions_deadline_writes_carry(admin, k):
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        n = sim.scale_up(inst.pool)
        claim = k.get(NODECLAIMS, n.claim)
        node = k.get(NODES, n.node)
        k.merge_patch(NODECLAIMS, n.claim, {"metadata": {"labels": {"example.com/touched": "1"}}})
        k.merge_patch(NODES, n.node, {"metadata": {"labels": {"example.com/touched": "1"}}})
        with pytest.raises(ApiException) as e:
            k.delete(NODECLAIMS, n.claim, uid=claim["metadata"]["uid"], resource_version=claim["metadata"]["resourceVersion"])
        assert e.value.status == 409
        assert not k.get(NODECLAIMS, n.claim)["metadata"].get("deletionTimestamp")
        guard = [{"op": "test", "path": "/metadata/resourceVersion", "value": node["metadata"]["resourceVersion"]},
                 {"op": "add", "path": "/metadata/labels/example.com~1late", "value": "1"}]
        with pytest.raises(ApiException) as e:
            k.json_patch(NODES, n.node, guard)
        assert e.value.status in (409, 422)
        assert "example.com/late" not in k.get(NODES, n.node)["metadata"]["labels"]


def test_events_are_rate_limited_and_the_excess_dropped_on_stop(k):
    from nodewarm.controller.events import EventRecorder
    from nodewarm.controller.events import EventSpec

    name = f"ratelimited-{os.getpid()}"
    rec = EventRecorder(k, qps=0.001, burst=3)        # three at once, the next one in ~17 minutes
    rec.start()
    for i in range(5):
        rec.emit(EventSpec("Node", name, "", "Test", f"event {i}"))
    wait_for(lambda: rec.sent == 3, what="the burst sent")
    time.sleep(0.3)
    assert rec.sent == 3 and len(events_for(k, "Node", name)) == 3
    rec.stop(flush_timeout_s=0.2)
    assert rec.dropped == 2 and rec.sent == 3


def test_compile_cache_hit_proven_in_serving_is_counted_once_never_a_restore(kube, admin, k):
    """The agent restores (no outcome yet); the publisher proves hit after the taint is lifted; the
    controller's nodewarm_compile_cache_total counts that hit once, and the restore itself never."""
    from nodewarm.bootstrap.nodestatus import report_compile_cache

    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst, running(admin) as c:
        n = sim.scale_up(inst.pool, node_name="node-1")
        node_api = kube.api_client(kube.node_token("node-1"))
        report_warm(node_api, "node-1", True, "WeightsVerified", "ok", {"nodewarm.io/compile-cache-reason": "Restored"})
        wait_for(lambda: TAINT not in taint_keys(k, "node-1"), what="taint lifted")
        counted = lambda result: c.metrics.cache.labels(inst.pool, result)._value.get()  # noqa: E731
        assert [counted(r) for r in ("hit", "miss", "cold", "unknown")] == [0, 0, 0, 0]
        report_compile_cache(node_api, "node-1", "hit", "NoNewCompile")
        wait_for(lambda: counted("hit") == 1, what="the proven hit counted")
        report_compile_cache(node_api, "node-1", "hit", "NoNewCompile")      # the same outcome again
        import time
        time.sleep(1.0)
        assert counted("hit") == 1 and counted("miss") == 0
        assert n.claim
