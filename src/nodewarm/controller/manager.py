"""The manager: informers -> work queue -> workers, under leader election, with health and metrics endpoints.

The reconcilers live apart, by resource and then by phase, as Karpenter's pkg/controllers/nodeclaim/lifecycle
does: nodeclaim/ (track, lift the taint on Warm, the warm deadline, the replace budget), warmprofile/ (inject,
device plugins, clean-up, the status conditions), enginecheck/ and modellabels/. Each declares what it watches, the
keys it reconciles and every key it owns (watch.py); this module keeps the caches, routes each cached kind's events to
the watches declared for it, and decides when the reconcilers run.

Run it in-process (demo, tests, bench)::

    c = Controller(api_client, ControllerOptions(...))
    c.run_until(stop_event)          # or c.start() ... c.stop()

Keys in the queue are ``<prefix>/<name>``, the prefix naming the reconciler: ``claim/<NodeClaim>`` and
``budget/<NodePool>`` (re-check a paused replace budget), ``profile/<WarmProfile>``, ``check/<WarmProfile>/<Node>``
(a node's engine check) and ``models/<Node>`` (the model labels of a profile's Node). Every replica lists and watches
(so a standby's caches are warm when it takes over); only the Lease holder processes keys, each write bounded by the
time its Lease still covers.
A ``--dry-run`` replica writes nothing, so it never takes the Lease: it audits on its own.
"""

from __future__ import annotations

import os
import threading
from collections import deque

from kubernetes import client

from nodewarm import logs
from nodewarm.api.errors import NodewarmError
from nodewarm.api.views import ClaimView, NodeView

from .enginecheck.controller import EngineCheckController
from .events import EventRecorder
from .kube import (AUTOMODE_NODECLASSES, DAEMONSETS, EC2NODECLASSES, NODECLAIMS, NODEPOOLS, NODES, WARMPROFILES, Kube,
                   Resource)
from .leader import LeaderConfig, LeaderElector, NotLeading
from .metrics import HttpEndpoints, Metrics, health_routes, metrics_routes
from .modellabels.controller import ModelLabelController
from .nodeclaim.controller import NodeClaimController
from .options import ControllerOptions
from .pairing import ProviderIndex
from .profiles import ProfileIndex, ProfileView
from .reflector import Handler, Reflector, wait_synced
from .warmprofile.deviceplugins import DaemonSetView, daemonset_key
from .warmprofile.controller import WarmProfileController
from .watch import Router
from .workqueue import WorkQueue


def _generation_view(o: dict) -> tuple[str, int]:
    # NodePools and NodeClasses matter only as "changed" (warmprofile/ re-checks the profiles bound to them).
    return (o["metadata"]["name"], o["metadata"].get("generation", 0))


class Controller:
    def __init__(self, api_client: client.ApiClient, options: ControllerOptions | None = None):
        self.opt = options or ControllerOptions()
        self.kube = Kube(api_client, retries=False)
        self.metrics = Metrics()
        self.kube.on_write = lambda res, verb: self.metrics.writes.labels(res, verb).inc()
        self.queue = WorkQueue()
        self.events = EventRecorder(self.kube, self.opt.event_namespace, instance=self.opt.identity)
        self.log = logs.get("controller")
        self.pairs = ProviderIndex()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._starter: threading.Thread | None = None
        self._http: list[HttpEndpoints] = []
        self.is_leader = threading.Event()
        # (claim, action) in order, the latest few thousand: what tests and the demo read.
        self.decisions: deque[tuple[str, str]] = deque(maxlen=10000)

        # The caches, each kind projected as it arrives; each one's events go to the watches declared for its kind.
        self.claims = self._cache(NODECLAIMS, ClaimView.from_obj, index=self.pairs.claim_changed)
        self.nodes = self._cache(NODES, NodeView.from_obj, index=self.pairs.node_changed)
        self.nodepools = self._cache(NODEPOOLS, _generation_view)
        self.ec2nodeclasses = self._cache(EC2NODECLASSES, _generation_view)
        self.automode_nodeclasses = self._cache(AUTOMODE_NODECLASSES, _generation_view)
        self.reflectors = [self.claims, self.nodes, self.nodepools, self.ec2nodeclasses, self.automode_nodeclasses]
        self.profiles: Reflector | None = None
        if self.opt.watch_profiles:
            self.profiles = self._cache(WARMPROFILES, ProfileView.from_obj)
            self.reflectors.append(self.profiles)
        # Only what the decisions need gates acting: the DaemonSets feed a diagnosis (deviceplugins.py), and a
        # controller whose RBAC lacks them (an older install) must still lift taints.
        self.required = list(self.reflectors)
        self.daemonsets = self._cache(DAEMONSETS, DaemonSetView.from_obj, key_fn=daemonset_key)
        self.reflectors.append(self.daemonsets)
        self.elector = None
        if self.opt.leader_elect and self.opt.dry_run:
            self.log.info("leader.skipped", why="--dry-run writes nothing, so it never takes the Lease")
        elif self.opt.leader_elect:
            self.elector = LeaderElector(self.kube, LeaderConfig(
                self.opt.lease_namespace, self.opt.lease_name, self.opt.identity, self.opt.lease_duration_s,
                self.opt.renew_deadline_s, self.opt.retry_period_s), self._became_leader, self._lost_leadership)
        self.profile_index = ProfileIndex(self.opt.profiles, self.profiles)
        self.warmprofile = WarmProfileController(self)
        self.nodeclaim = NodeClaimController(self, self.warmprofile.write_status)
        self.enginecheck = EngineCheckController(self)
        self.modellabels = ModelLabelController(self)
        # In this order each event's watches run, and a new leader enqueues each one's keys.
        self.router = Router((self.warmprofile, self.nodeclaim, self.enginecheck, self.modellabels), self.queue.add)

    def _cache(self, res: Resource, view_fn, index: Handler | None = None, key_fn=None) -> Reflector:
        def on_event(kind: str, old, new) -> None:
            if index is not None:
                index(kind, old, new)       # the pairing first: the watches read it
            self.router.route(res, kind, old, new)
        return Reflector(self.kube, res, view_fn, on_event, self.opt.watch_timeout_s,
                         page_size=self.opt.list_page_size, key_fn=key_fn)

    # -- what the reconcilers read -------------------------------------------------------------------
    def node_for(self, claim: ClaimView) -> NodeView | None:
        node_name = self.pairs.node_name(claim)
        return self.nodes.store.get(node_name) if node_name else None

    def claim_for(self, node: NodeView) -> str | None:
        return self.pairs.claim_name(node)

    def write_timeout(self) -> float | None:
        """A write must end while the Lease still covers it; without leader election, the client default."""
        if self.elector is None:
            return None
        left = self.elector.remaining_s()
        if left <= 0.05:
            raise NotLeading()
        return min(self.kube.timeout, left)

    # -- leadership ------------------------------------------------------------------------------------
    def _enqueue_all(self) -> None:
        for key in self.router.all_keys():
            self.queue.add(key)

    def _became_leader(self) -> None:
        self.is_leader.set()
        self.metrics.leader.set(1)
        self._enqueue_all()

    def _lost_leadership(self) -> None:
        self.is_leader.clear()
        self.metrics.leader.set(0)

    def _acting(self) -> bool:
        """Leader now, with Lease time left (the elector's flag alone could lag a stalled renew)."""
        return self.is_leader.is_set() and (self.elector is None or self.elector.leading())

    # -- workers ---------------------------------------------------------------------------------------
    def reconcile_claim(self, name: str):
        return self.nodeclaim.reconcile(name)

    def reconcile_profile(self, name: str):
        return self.warmprofile.reconcile(name)

    def _worker(self) -> None:
        while not self._stop.is_set():
            key = self.queue.get(timeout_s=0.5)
            if key is None:
                continue
            try:
                if not self._acting():
                    continue     # a new leader re-enqueues everything; nothing is lost by dropping it here
                kind, name = key.split("/", 1)
                self.router.routes[kind](name)
                self.queue.forget(key)
            except NotLeading:
                self.log.info("reconcile.dropped", key=key, why="lease no longer covers a write")
            except Exception as e:
                self.metrics.reconcile_errors.labels(key.split("/", 1)[0]).inc()
                delay = self.queue.retry(key)
                self.log.warning("reconcile.failed", key=key, error=str(e)[:300], retry_in_s=round(delay, 3))
            finally:
                self.queue.done(key)
                self.metrics.queue_depth.set(len(self.queue))

    # -- lifecycle -------------------------------------------------------------------------------------
    def healthy(self) -> bool:
        return not self._stop.is_set() and all(r.alive() for r in self.reflectors) and \
            all(t.is_alive() for t in self._threads) and (self.elector is None or self.elector.alive())

    def ready(self) -> bool:
        return all(r.synced.is_set() for r in self.required)

    def start(self) -> "Controller":
        self.log.info("controller.start", identity=self.opt.identity, dry_run=self.opt.dry_run,
                      leader_elect=self.opt.leader_elect, workers=self.opt.workers, pid=os.getpid())
        self.events.start()
        for r in self.reflectors:
            r.start()
        if self.opt.health_port is not None:
            self._http.append(HttpEndpoints(self.opt.health_port, health_routes(self.healthy, self.ready),
                                            self.opt.bind_address).start())
        if self.opt.metrics_port is not None:
            self._http.append(HttpEndpoints(self.opt.metrics_port, metrics_routes(self.metrics), self.opt.bind_address).start())
        if self._http:
            self.log.info("controller.listening", health_port=self.health_port, metrics_port=self.metrics_port)
        for i in range(self.opt.workers):
            t = threading.Thread(target=self._worker, name=f"worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        self._starter = threading.Thread(target=self._run_after_sync, name="starter", daemon=True)
        self._starter.start()
        return self

    def _run_after_sync(self) -> None:
        # Acting before the caches are full would mistake "not listed yet" for "absent".
        while not self._stop.is_set() and not wait_synced(self.required, 1.0):
            pass
        if self._stop.is_set():
            return
        self.log.info("caches.synced", nodeclaims=len(self.claims.store), nodes=len(self.nodes.store))
        if self.elector is not None:
            self.elector.start()
        else:
            self._became_leader()
        while not self._stop.wait(self.opt.resync_s):
            if self.is_leader.is_set():
                self._enqueue_all()

    @property
    def health_port(self) -> int | None:
        return self._http[0].port if self.opt.health_port is not None else None

    @property
    def metrics_port(self) -> int | None:
        return self._http[-1].port if self.opt.metrics_port is not None else None

    def stop(self) -> None:
        self._stop.set()
        # The starter first: it may be between "caches synced" and starting the elector (or, without one, acting as
        # leader). Nothing of a stopped replica may run on after this returns. It sees the stop within a second.
        if self._starter is not None:
            self._starter.join(5)
        if self.elector is not None:
            self.elector.stop()           # steps down: workers stop acting now
        self.queue.shutdown()
        for r in self.reflectors:
            r.stop()
        for t in self._threads:
            t.join(5)
        self.events.stop()
        # Hand over at once, but only when no worker can still be writing: else the Lease just expires.
        if self.elector is not None and not any(t.is_alive() for t in self._threads):
            self.elector.release()
        for h in self._http:
            h.stop()
        for r in self.reflectors:
            r.join(2)
        self.log.info("controller.stop", identity=self.opt.identity)

    def run_until(self, stop: threading.Event) -> None:
        self.start()
        try:
            stop.wait()
        finally:
            self.stop()

    def run_once(self, sync_timeout_s: float = 60) -> dict:
        """One pass over everything, synchronously (``--once``; with ``dry_run`` it is an audit)."""
        self.events.start()
        for r in self.reflectors:
            r.start()
        try:
            if not wait_synced(self.reflectors, sync_timeout_s):
                raise NodewarmError(f"caches did not sync within {sync_timeout_s:.0f}s; check the API server "
                                    "and the credentials' list/watch permissions", "CacheSyncTimeout")
            self.daemonsets.synced.wait(min(5.0, sync_timeout_s))    # a diagnosis only: not worth failing for
            self.is_leader.set()
            out: dict = {"dryRun": self.opt.dry_run, "profiles": {}, "nodeClaims": {}}
            for p in self.profile_index.live():
                r = self.reconcile_profile(p.name)
                if r is not None:
                    out["profiles"][p.name] = {
                        "condition": r.condition.to_dict(),
                        "targets": [{"kind": t.kind, "name": t.name, "changedFields": list(t.changed_fields),
                                     "applied": t.applied} for t in r.targets]}
            for name in sorted(self.claims.store):
                plan = self.reconcile_claim(name)
                if plan is not None and plan.conditions:
                    out["nodeClaims"][name] = {"action": plan.action,
                                               "conditions": [c.to_dict() for c in plan.conditions]}
            return out
        finally:
            self._stop.set()
            for r in self.reflectors:
                r.stop()
            self.events.stop()

    def wait_synced(self, timeout_s: float = 30) -> bool:
        return wait_synced(self.required, timeout_s)
