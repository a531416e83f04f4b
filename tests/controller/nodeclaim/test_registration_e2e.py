"""Nothing stranded: Karpenter's registration played as upstream does it (the stand-in's ``mark_registered``: the
NodeClaim's taints and startupTaints merged back into the Node, once, possibly held back by a registration hook),
around the real controller running as its own ServiceAccount (the RBAC it ships, a minted token), the node agent's
Warm report through the node's own kubelet identity, and the real kube-scheduler placing a pod that does not
tolerate the startup taint.

Each test fails on a controller that lifts the taint before registration or treats its recorded lift as the truth:
there the taint comes back at registration (or by hand) and nothing lifts it again.
"""

from __future__ import annotations

import json
import time

import pytest

from nodewarm.api.lifecycle import Phase
from nodewarm.api.names import STATE_ANNOTATION
from nodewarm.api.views import UNREGISTERED_TAINT
from nodewarm.bootstrap.nodestatus import report_warm
from nodewarm.controller.kube import NODECLAIMS, NODES, PODS
from nodewarm.status import cli as status_cli
from nodewarm.status.rows import rows
from nodewarm_dev.testenv.karpenter import KarpenterSim

from support.controller_fixtures import TAINT, events_for, installed, taint_keys, wait_for

pytestmark = pytest.mark.kube

NS = "default"


def _warm(kube, node: str) -> None:
    """The node agent reports Warm through its node's own identity."""
    report_warm(kube.api_client(kube.node_token(node)), node, True, "WeightsVerified", "1 GB verified",
                {"nodewarm.io/compile-cache": "cold"})


def _workload(k, name: str, node: str) -> None:
    """A pod for ``node`` that tolerates the GPU taint but not the startup taint: the scheduler binds it only once
    the startup taint (and karpenter.sh/unregistered) are gone."""
    k.create(PODS, {"metadata": {"name": name}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "100m"}}}]}}, NS)


def _bound_to(k, name: str) -> str:
    return k.get(PODS, name, NS)["spec"].get("nodeName") or ""


def _delete_pod(k, name: str) -> None:
    try:
        k.request("DELETE", PODS.path(name, NS), body={"gracePeriodSeconds": 0})
    except Exception:
        pass


def _stays(k, node: str, present: bool, seconds: float, also=lambda: None) -> None:
    """The startup taint stays on (``present``) or off ``node`` for ``seconds``; ``also`` runs on every look."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        also()
        assert (TAINT in taint_keys(k, node)) == present, f"{TAINT} {'lifted' if present else 'back'} on {node}"
        time.sleep(0.2)


def _row(admin, node: str):
    return next(r for r in rows(status_cli.observe(admin, node=node), time.time()) if r.node == node)


def _lifted_after_registration(sim: KarpenterSim, k, claim: str, node: str) -> float:
    """Karpenter registers the node; returns the seconds from its registration write to the taint's lift."""
    t0 = time.monotonic()
    sim.mark_registered(claim)
    wait_for(lambda: TAINT not in taint_keys(k, node), timeout_s=15, what="the taint lifted after registration")
    return time.monotonic() - t0


def test_an_early_warm_is_lifted_after_registration_and_stays_lifted(scheduling, kube, admin, k, controller_as_sa):
    sim, node, pod = KarpenterSim(admin), "node-5", "early-warm-workload"
    with installed(k, inject_ready=True) as inst:
        try:
            claim = sim.join(inst.pool, node).claim
            _workload(k, pod, node)
            _warm(kube, node)
            # The controller sees Warm within 0.1 s: it must not lift while Karpenter has not registered the node.
            _stays(k, node, True, 2.0)
            r = _row(admin, node)
            assert (r.phase, r.reason) == (Phase.REGISTERING, "WarmBeforeRegistration"), r
            assert not _bound_to(k, pod)

            delay = _lifted_after_registration(sim, k, claim, node)
            print(f"\nregistration to lift: {delay:.3f}s")
            _stays(k, node, False, 3.0)         # and nothing puts it back
            assert wait_for(lambda: _bound_to(k, pod), timeout_s=30, what="the pod bound") == node
            assert sim.sync_initialized(claim)
            n = k.get(NODES, node)
            assert n["metadata"]["labels"]["karpenter.sh/initialized"] == "true"
            assert UNREGISTERED_TAINT not in taint_keys(k, node)
            assert json.loads(n["metadata"]["annotations"][STATE_ANNOTATION])["decision"] == "Untainted"
            assert _row(admin, node).phase is Phase.SERVING
            reasons = [e["reason"] for e in events_for(k, "Node", node)]
            assert "Untainted" in reasons and "TaintReAdded" not in reasons, reasons
            assert controller_as_sa.metrics.taints_removed.labels(inst.pool)._value.get() == 1
            assert controller_as_sa.metrics.taints_readded.labels(inst.pool)._value.get() == 0
        finally:
            _delete_pod(k, pod)


def test_a_registration_held_30s_lifts_nothing_before_and_lifts_right_after(scheduling, kube, admin, k,
                                                                             controller_as_sa):
    sim, node = KarpenterSim(admin), "node-6"
    with installed(k, inject_ready=True) as inst:
        claim = sim.join(inst.pool, node).claim
        sim.hold_registration(claim, "capacity-reservation")
        sim.mark_registered(claim)               # the merge happens; the unregistered taint and Registered stay
        _warm(kube, node)
        # Karpenter requeues a pending hook and merges again on every pass; the taint stays on throughout.
        _stays(k, node, True, 30.0, also=lambda: sim.mark_registered(claim))
        assert UNREGISTERED_TAINT in taint_keys(k, node)
        r = _row(admin, node)
        assert (r.phase, r.reason) == (Phase.REGISTERING, "WarmBeforeRegistration") and \
            "RegistrationHookPending" in r.message, r
        reg = next(c for c in k.get(NODECLAIMS, claim)["status"]["conditions"] if c["type"] == "Registered")
        assert (reg["status"], reg["reason"], reg["message"]) == ("Unknown", "RegistrationHookPending",
                                                                  "capacity-reservation")

        sim.release_registration(claim)
        delay = _lifted_after_registration(sim, k, claim, node)
        print(f"\nheld registration, then registration to lift: {delay:.3f}s")
        _stays(k, node, False, 2.0, also=lambda: sim.mark_registered(claim))      # registers once: no second merge
        assert sim.sync_initialized(claim)


def test_a_taint_put_back_after_the_lift_is_lifted_again_and_told(kube, admin, k, controller_as_sa):
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        n = sim.scale_up(inst.pool, node_name="node-7")
        _warm(kube, n.node)
        wait_for(lambda: TAINT not in taint_keys(k, n.node), what="the first lift")
        first = json.loads(k.get(NODES, n.node)["metadata"]["annotations"][STATE_ANNOTATION])["decided"]
        time.sleep(1.1)             # the record's times are whole seconds: the second lift is recorded later
        # An operator (or a re-apply) puts the startup taint back on a serving node.
        k.json_patch(NODES, n.node, [{"op": "add", "path": "/spec/taints/-",
                                      "value": {"key": TAINT, "effect": "NoSchedule"}}])
        wait_for(lambda: TAINT not in taint_keys(k, n.node), timeout_s=15, what="the taint lifted again")
        state = json.loads(k.get(NODES, n.node)["metadata"]["annotations"][STATE_ANNOTATION])
        assert state["decision"] == "Untainted" and state["decided"] > first
        ev = wait_for(lambda: [e for e in events_for(k, "Node", n.node) if e["reason"] == "TaintReAdded"],
                      what="the TaintReAdded event")[0]
        assert ev["type"] == "Warning" and f"{TAINT} was back on the node" in ev["message"] and \
            "not by nodewarm" in ev["message"], ev
        assert controller_as_sa.metrics.taints_readded.labels(inst.pool)._value.get() == 1
        assert controller_as_sa.metrics.taints_removed.labels(inst.pool)._value.get() == 2
        assert sim.sync_initialized(n.claim)
