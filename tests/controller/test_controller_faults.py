"""Faults the controller must survive, on the real API server: broken watches, 410 Gone, conflicts on
the taint patch, a kill -9 between phases, objects vanishing mid-warm, and two replicas."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from nodewarm.bootstrap.nodestatus import report_warm
from nodewarm.controller.kube import LEASES, NODES, Resource
from nodewarm.controller.manager import Controller
from nodewarm.api.names import STATE_ANNOTATION
from nodewarm.api.timeutil import parse_time
from nodewarm_dev.testenv.karpenter import KarpenterSim

from support.controller_fixtures import (
    TAINT, client_for, events_for, installed, options, running, taint_keys, uniq, wait_for,
)
from support.kubefaults import KubeFaults
from support import paths

pytestmark = pytest.mark.kube
REPO = paths.REPO


@pytest.fixture
def proxy(kube):
    p = KubeFaults(kube.server, kube.ca_file)
    yield p
    p.stop()


def warm(kube, admin, node: str) -> None:
    report_warm(admin, node, True, "WeightsVerified", "ok", {"nodewarm.io/compile-cache": "miss"})


def test_watch_dropped_mid_stream_resumes_from_last_resource_version(kube, admin, k, proxy):
    sim = KarpenterSim(admin)
    proxy.drop_watch("/api/v1/nodes?", after_events=1)
    with installed(k, inject_ready=True) as inst, running(client_for(proxy.endpoint, kube.admin_token)) as c:
        n = sim.scale_up(inst.pool)      # the node's first event is delivered, then the stream is cut
        warm(kube, admin, n.node)
        wait_for(lambda: TAINT not in taint_keys(k, n.node), what="taint removed after the watch was cut")
        assert ("drop", ) == tuple({kind for kind, _ in proxy.injected})
        assert c.nodes.watch_starts >= 2 and c.nodes.lists == 1   # resumed, not re-listed


def test_410_gone_relists_and_keeps_working(kube, admin, k, proxy):
    sim = KarpenterSim(admin)
    proxy.gone_watch("/apis/karpenter.sh/v1/nodeclaims?")
    with installed(k, inject_ready=True) as inst, running(client_for(proxy.endpoint, kube.admin_token)) as c:
        wait_for(lambda: c.claims.lists >= 2, what="re-list after 410")
        n = sim.scale_up(inst.pool)
        warm(kube, admin, n.node)
        wait_for(lambda: TAINT not in taint_keys(k, n.node), what="taint removed after a 410 re-list")
        assert proxy.injected and proxy.injected[0][0] == "gone"


def test_409_on_the_taint_patch_is_retried(kube, admin, k, proxy):
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst, running(client_for(proxy.endpoint, kube.admin_token)) as c:
        n = sim.scale_up(inst.pool)
        proxy.conflict_patch(f"/api/v1/nodes/{n.node}")
        warm(kube, admin, n.node)
        wait_for(lambda: TAINT not in taint_keys(k, n.node), what="taint removed after a 409")
        wait_for(lambda: c.decisions, what="decision recorded")
        assert proxy.injected == [("conflict", f"/api/v1/nodes/{n.node}")]
        assert c.metrics.conflicts.labels("nodes")._value.get() == 1
        assert c.decisions.count((n.claim, "untaint")) == 1


def test_stale_cache_guarded_patch_never_touches_the_new_taint(kube, admin, k):
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst, running(admin, workers=0) as c:
        n = sim.scale_up(inst.pool)
        warm(kube, admin, n.node)
        wait_for(lambda: (x := c.nodes.store.get(n.node)) and x.warm and x.warm.status == "True", what="warm in cache")
        c.nodes.stop()                   # freeze the cache: the controller now acts on a stale view
        late = {"key": "example.com/late", "effect": "NoSchedule"}
        k.json_patch(NODES, n.node, [{"op": "add", "path": "/spec/taints/0", "value": late}])
        plan = c.reconcile_claim(n.claim)
        assert plan.action == "untaint"
        assert taint_keys(k, n.node) == ["example.com/late", "nvidia.com/gpu"]
        assert c.metrics.conflicts.labels("nodes")._value.get() == 1


def _controller_proc(kubeconfig: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "nodewarm.cli", "controller", "--kubeconfig", str(kubeconfig), "--workers", "1",
         "--metrics-port", "-1", "--health-port", "-1", "--watch-timeout-seconds", "20"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(log, "wb"), env=dict(os.environ))


def _decisions(log: Path) -> list[dict]:
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    return [x for x in lines if x.get("event") == "decision"]


def test_killed_between_phases_restarts_from_cluster_state_and_does_nothing_twice(kube, admin, k, tmp_path):
    sim = KarpenterSim(admin)
    kcfg = kube.write_kubeconfig(tmp_path / "kubeconfig")
    with installed(k, inject_ready=True) as inst:
        a = sim.scale_up(inst.pool)
        warm(kube, admin, a.node)
        first = _controller_proc(kcfg, tmp_path / "c1.log")
        try:
            wait_for(lambda: TAINT not in taint_keys(k, a.node), timeout_s=30, what="A untainted by controller 1")
            b = sim.scale_up(inst.pool)                   # B: registered, tracked, not Warm yet
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
        a_rv = k.get(NODES, a.node)["metadata"]["resourceVersion"]
        a_events = len(events_for(k, "Node", a.node))
        warm(kube, admin, b.node)                          # B turns Warm while no controller runs

        second = _controller_proc(kcfg, tmp_path / "c2.log")
        try:
            # One worker, FIFO: A (listed first) is reconciled before B, so B done => A was looked at.
            wait_for(lambda: TAINT not in taint_keys(k, b.node), timeout_s=30, what="B untainted by controller 2")
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(15)
        assert k.get(NODES, a.node)["metadata"]["resourceVersion"] == a_rv
        assert len(events_for(k, "Node", a.node)) == a_events == 1
        assert [d["nodeclaim"] for d in _decisions(tmp_path / "c2.log")] == [b.claim]
        assert json.loads(k.get(NODES, b.node)["metadata"]["annotations"][STATE_ANNOTATION])["decision"] == "Untainted"


def test_node_deleted_while_warming_is_left_alone(kube, admin, k):
    sim = KarpenterSim(admin)
    # The deadline must not pass before the deletion is seen (a loaded machine can take a second or two
    # to register and delete), and must pass afterwards: nothing is left to untaint or replace.
    with installed(k, inject_ready=True, deadline="1m") as inst, running(admin) as c:
        n = sim.scale_up(inst.pool, registered_ago_s=56)
        sim.delete_node(n.node)
        wait_for(lambda: n.node not in c.nodes.store, what="node deletion seen")
        time.sleep(4.5)
        later = sim.scale_up(inst.pool)
        warm(kube, admin, later.node)
        wait_for(lambda: later.claim in {cl for cl, _ in c.decisions}, what="next node still handled")
        assert n.claim not in {cl for cl, _ in c.decisions}
        assert c.metrics.reconcile_errors.labels("claim")._value.get() == 0
        assert c.healthy()


def test_nodeclaim_deleted_means_its_node_is_never_untainted(kube, admin, k):
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst, running(admin) as c:
        orphan = sim.scale_up(inst.pool)
        sim.delete_nodeclaim(orphan.claim)                 # Karpenter is terminating it (finalizer still on)
        wait_for(lambda: c.claims.store[orphan.claim].deleting, what="claim deletion seen")
        warm(kube, admin, orphan.node)
        sentinel = sim.scale_up(inst.pool)
        warm(kube, admin, sentinel.node)                   # node events arrive in order: orphan's came first
        wait_for(lambda: TAINT not in taint_keys(k, sentinel.node), what="sentinel untainted")
        wait_for(lambda: c.decisions, what="decision recorded")
        assert TAINT in taint_keys(k, orphan.node)
        assert [cl for cl, _ in c.decisions] == [sentinel.claim]


def test_two_controllers_one_acts_and_the_standby_takes_over(kube, admin, k):
    ns = uniq("nw-lease")
    k.create(Resource("", "v1", "namespaces", "Namespace"), {"metadata": {"name": ns}})
    sim = KarpenterSim(admin)
    opts = dict(leader_elect=True, lease_namespace=ns)
    with installed(k, inject_ready=True) as inst, running(admin, identity="one", **opts) as one, \
            running(admin, identity="two", **opts) as two:
        leader = wait_for(lambda: one if one.is_leader.is_set() else two if two.is_leader.is_set() else None,
                          what="a leader")
        standby = two if leader is one else one
        n1 = sim.scale_up(inst.pool)
        warm(kube, admin, n1.node)
        wait_for(lambda: TAINT not in taint_keys(k, n1.node), what="first node untainted")
        wait_for(lambda: leader.decisions, what="decision recorded")
        assert list(leader.decisions) == [(n1.claim, "untaint")] and list(standby.decisions) == []
        assert not standby.is_leader.is_set()
        lease = k.get(LEASES, "nodewarm-controller", ns)
        assert lease["spec"]["holderIdentity"] == leader.opt.identity

        leader.stop()                                      # releases the Lease: the standby takes over at once
        wait_for(lambda: standby.is_leader.is_set(), timeout_s=10, what="standby takes over")
        n2 = sim.scale_up(inst.pool)
        warm(kube, admin, n2.node)
        wait_for(lambda: TAINT not in taint_keys(k, n2.node), what="second node untainted by the new leader")
        wait_for(lambda: standby.decisions, what="decision recorded")
        assert list(standby.decisions) == [(n2.claim, "untaint")]
        assert k.get(LEASES, "nodewarm-controller", ns)["spec"]["holderIdentity"] == standby.opt.identity



def _new_namespace(k) -> str:
    ns = uniq("nw-lease")
    k.create(Resource("", "v1", "namespaces", "Namespace"), {"metadata": {"name": ns}})
    return ns


def test_a_stalled_leader_stops_acting_before_the_standby_takes_over_after_expiry(kube, admin, k, proxy):
    sim = KarpenterSim(admin)
    ns = _new_namespace(k)
    opts = dict(leader_elect=True, lease_namespace=ns, lease_duration_s=3, renew_deadline_s=2, retry_period_s=0.4)
    with installed(k, inject_ready=True) as inst, \
            running(client_for(proxy.endpoint, kube.admin_token), identity="one", **opts) as one:
        wait_for(lambda: one.is_leader.is_set(), what="one leads")
        with running(admin, identity="two", **opts) as two:
            time.sleep(1.0)
            assert not two.is_leader.is_set()
            proxy.stall(True)                      # one's API calls now hang: its renews never arrive
            time.sleep(0.2)
            last_renew = parse_time(k.get(LEASES, "nodewarm-controller", ns)["spec"]["renewTime"])
            n = sim.scale_up(inst.pool)
            warm(kube, admin, n.node)              # a node turns Warm while the leader is cut off
            wait_for(lambda: two.is_leader.is_set(), timeout_s=20, what="two takes over")
            wait_for(lambda: TAINT not in taint_keys(k, n.node), what="the new leader lifts the taint")
            lease = k.get(LEASES, "nodewarm-controller", ns)["spec"]
            assert lease["holderIdentity"] == "two"
            # Only after expiry: the Lease sat unrenewed for a whole leaseDuration before two took it.
            assert parse_time(lease["acquireTime"]) - last_renew >= opts["lease_duration_s"]
            # The stalled one had stopped acting, and its election loop had noticed (its renew calls time
            # out before the renew deadline), before two started.
            term_one, term_two = one.elector.terms[-1], two.elector.terms[-1]
            assert term_one.stopped_at is not None and term_one.noticed_at is not None
            assert term_one.stopped_at <= term_one.noticed_at <= term_two.acquired_at
            assert not one._acting() and not one.is_leader.is_set()
            assert (n.claim, "untaint") in two.decisions and n.claim not in {c for c, _ in one.decisions}
            proxy.stall(False)


class _HeldAt:
    """A controller's logger that holds the thread logging ``event`` until ``release`` is set (at most 3 s): the
    moment between two of that thread's steps, made long."""

    def __init__(self, log, event: str):
        self.log, self.event = log, event
        self.entered, self.release = threading.Event(), threading.Event()

    def info(self, event, **kw):
        if event == self.event:
            self.entered.set()
            self.release.wait(3)
        return self.log.info(event, **kw)

    def __getattr__(self, name):
        return getattr(self.log, name)


def test_stop_returns_only_after_the_thread_that_starts_leader_election(kube, admin, k):
    """The starter thread (caches synced -> start the elector) may be between its two steps when stop() comes: stop()
    waits for it, so nothing of a stopped replica runs on: no log line, no elector started, no leadership taken
    without one, after stop() returned."""
    ns = _new_namespace(k)
    c = Controller(admin, options(identity="stopping", leader_elect=True, lease_namespace=ns))
    c.log = held = _HeldAt(c.log, "caches.synced")
    before = set(threading.enumerate())
    c.start()
    assert held.entered.wait(20), "the caches did not sync"
    c.stop()
    left = [t.name for t in set(threading.enumerate()) - before if t.name in ("starter", "leader-election")]
    held.release.set()
    assert not left, f"still running after stop() returned: {left}"
    assert not c.is_leader.is_set()


def test_dry_run_never_takes_the_lease(kube, admin, k):
    ns = _new_namespace(k)
    with installed(k, inject_ready=True), \
            running(admin, identity="audit", dry_run=True, leader_elect=True, lease_namespace=ns) as audit:
        time.sleep(1.0)
        assert audit.elector is None
        with pytest.raises(ApiException) as e:
            k.get(LEASES, "nodewarm-controller", ns)
        assert e.value.status == 404
        with running(admin, identity="real", leader_elect=True, lease_namespace=ns) as real:
            wait_for(lambda: real.is_leader.is_set(), what="the real replica leads")
            assert k.get(LEASES, "nodewarm-controller", ns)["spec"]["holderIdentity"] == "real"


def test_lists_are_paginated_and_an_expired_continue_token_restarts_the_list(kube, admin, k, proxy, fresh_node):
    names = [uniq("page") for _ in range(7)]
    for name in names:
        fresh_node(name, [])
    proxy.gone_continue("/api/v1/nodes?")
    with running(client_for(proxy.endpoint, kube.admin_token), list_page_size=3, workers=0) as c:
        assert set(names) <= set(c.nodes.store)
        assert ("gone_continue", ) == tuple({kind for kind, _ in proxy.injected})
        total = len(c.nodes.store)
        # page 1, a 410 on page 2, then the whole list again in pages of 3
        assert c.nodes.pages >= 1 + -(-total // 3) and c.nodes.lists == 1
