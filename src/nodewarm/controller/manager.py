"""The manager: informers -> work queue -> workers, under leader election, with health and metrics endpoints.

The reconcilers live apart, by resource and then by phase, as Karpenter's pkg/controllers/nodeclaim/lifecycle
does: nodeclaim/ (track, lift the taint on Warm, the warm deadline, the replace budget) and warmprofile/ (inject,
device plugins, clean-up, the status conditions). This module only decides when they run and what they read.

Run it in-process (demo, tests, bench)::

    c = Controller(api_client, ControllerOptions(...))
    c.run_until(stop_event)          # or c.start() ... c.stop()

Keys in the queue are ``claim/<NodeClaim>``, ``profile/<WarmProfile>``, ``budget/<NodePool>`` (re-check
a paused replace budget), ``check/<WarmProfile>/<Node>`` (a node's engine check, enginecheck/) and ``models/<Node>``
(the model labels of a profile's Node, modellabels/). Every replica
lists and watches (so a standby's caches are warm when it takes over); only the Lease holder processes keys, each
write bounded by the time its Lease still covers.
A ``--dry-run`` replica writes nothing, so it never takes the Lease: it audits on its own.

(A little over 300 lines: the handlers that turn watch events into keys stay beside the queue and the workers that
drain it, so the path from an event to a reconcile reads in one place.)
"""

from __future__ import annotations

import os
import threading
from collections import deque

from kubernetes import client

from nodewarm import logs
from nodewarm.api.errors import NodewarmError
from nodewarm.api.names import CACHE_ANNOTATION
from nodewarm.api.views import ClaimView, NodeView

from .enginecheck import controller as enginecheck
from .events import EventRecorder
from .kube import AUTOMODE_NODECLASSES, DAEMONSETS, EC2NODECLASSES, NODECLAIMS, NODEPOOLS, NODES, WARMPROFILES, Kube
from .leader import LeaderConfig, LeaderElector, NotLeading
from .metrics import HttpEndpoints, Metrics, health_routes, metrics_routes
from .modellabels import controller as modellabels
from .nodeclaim.controller import NodeClaimController
from .options import ControllerOptions
from .pairing import ProviderIndex
from .reflector import Reflector, wait_synced
from .warmprofile import deviceplugins, peerkeys
from .warmprofile.controller import WarmProfileController
from .profiles import ProfileIndex, ProfileView
from .workqueue import WorkQueue


def _generation_view(o: dict) -> tuple[str, int]:
    # NodePools and NodeClasses matter only as "changed -> re-check the profiles bound to them".
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

        w, page = self.opt.watch_timeout_s, self.opt.list_page_size
        self.claims = Reflector(self.kube, NODECLAIMS, ClaimView.from_obj, self._on_claim, w, page_size=page)
        self.nodes = Reflector(self.kube, NODES, NodeView.from_obj, self._on_node, w, page_size=page)
        self.nodepools = Reflector(self.kube, NODEPOOLS, _generation_view, self._on_target, w, page_size=page)
        self.ec2nodeclasses = Reflector(self.kube, EC2NODECLASSES, _generation_view, self._on_target, w, page_size=page)
        self.automode_nodeclasses = Reflector(self.kube, AUTOMODE_NODECLASSES, _generation_view, self._on_target, w,
                                              page_size=page)
        self.reflectors = [self.claims, self.nodes, self.nodepools, self.ec2nodeclasses, self.automode_nodeclasses]
        self.profiles: Reflector | None = None
        if self.opt.watch_profiles:
            self.profiles = Reflector(self.kube, WARMPROFILES, ProfileView.from_obj, self._on_profile, w,
                                      page_size=page)
            self.reflectors.append(self.profiles)
        # Only what the decisions need gates acting: the DaemonSets feed a diagnosis (deviceplugins.py), and a
        # controller whose RBAC lacks them (an older install) must still lift taints.
        self.required = list(self.reflectors)
        self.daemonsets = Reflector(self.kube, DAEMONSETS, deviceplugins.DaemonSetView.from_obj, self._on_daemonset,
                                    w, page_size=page, key_fn=deviceplugins.daemonset_key)
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
        self.enginecheck = enginecheck.EngineCheckController(self)
        self.modellabels = modellabels.ModelLabelController(self)

    # -- what the reconcilers read -------------------------------------------------------------------
    def node_for(self, claim: ClaimView) -> NodeView | None:
        node_name = self.pairs.node_name(claim)
        return self.nodes.store.get(node_name) if node_name else None

    def write_timeout(self) -> float | None:
        """A write must end while the Lease still covers it; without leader election, the client default."""
        if self.elector is None:
            return None
        left = self.elector.remaining_s()
        if left <= 0.05:
            raise NotLeading()
        return min(self.kube.timeout, left)

    # -- informer handlers (cheap: index and enqueue) --------------------------------------------------
    def _on_claim(self, kind: str, old: ClaimView | None, new: ClaimView | None) -> None:
        self.pairs.claim_changed(kind, old, new)
        name = (new or old).name
        # A held clean-up finishes once removing the taint drifts nothing: re-check it as claims come and go.
        for p in self.profile_index.held():
            if p.nodes.node_pool == (new or old).nodepool:
                self.queue.add(f"profile/{p.name}")
        if kind == "DELETED":
            self.queue.forget(f"claim/{name}")
            self.log.info("nodeclaim.deleted", nodeclaim=name)
            return
        self.queue.add(f"claim/{name}")

    def _on_node(self, kind: str, old: NodeView | None, new: NodeView | None) -> None:
        claim = self.pairs.node_changed(kind, old, new)
        if kind == "DELETED" and claim:
            # Nothing to undo: the record lived on the Node. The NodeClaim is Karpenter's to clean up.
            self.log.info("node.deleted", node=(old or new).name, nodeclaim=claim)
        self._count_served_cache_outcome(kind, old, new)
        if claim:
            self.queue.add(f"claim/{claim}")
        self._enqueue_check(old, new)
        self._enqueue_peers(kind, old, new)
        if kind == "DELETED":
            self.modellabels.forget((old or new).name)
        elif self.modellabels.profile_of(new) is not None:
            self.queue.add(modellabels.key(new.name))

    def _enqueue_peers(self, kind: str, old: NodeView | None, new: NodeView | None) -> None:
        """A node joining or leaving a profile: the profile's key bindings (warmprofile/peerkeys.py). Only then:
        a node's status and annotations change all the time and say nothing about who may read the key."""
        if kind == "MODIFIED" and old is not None and new is not None and old.profile == new.profile:
            return
        for name in {v.profile for v in (old, new) if v is not None and v.profile}:
            view = self.profile_index.view(name)
            p = self.profile_index.static(name) or (view.profile if view else None)
            if (p is not None and p.weights.peers.enabled) or peerkeys.had_peers(view):
                self.queue.add(f"profile/{name}")

    def _enqueue_check(self, old: NodeView | None, new: NodeView | None) -> None:
        """A node that asks for (or answered) an engine check, of a profile that has it on: its check key. A deleted
        node's too, so its pods go with it."""
        v = next((x for x in (new, old) if enginecheck.asks(x)), None)
        if v is None:
            return
        p = self.profile_index.for_pool(v.nodepool)
        if p is not None and p.readiness.engine_check.enabled:
            self.queue.add(enginecheck.key(p.name, v.name))

    def _count_served_cache_outcome(self, kind: str, old: NodeView | None, new: NodeView | None) -> None:
        """hit|miss arrive after the taint is lifted, when the publisher proves them in serving: count each
        change to one once (a change, not a state: a restarted controller listing old nodes counts nothing)."""
        if kind != "MODIFIED" or old is None or new is None or not self.is_leader.is_set():
            return
        was, now = old.annotations.get(CACHE_ANNOTATION), new.annotations.get(CACHE_ANNOTATION)
        if now != was and now in ("hit", "miss"):
            self.metrics.cache.labels(new.nodepool, now).inc()
            self.log.info("compile_cache.proven", node=new.name, nodepool=new.nodepool, result=now)

    def _on_target(self, kind: str, old, new) -> None:
        name = (new or old)[0]
        for p in self.profile_index.live() + self.profile_index.held():
            if name in (p.nodes.node_pool, p.nodes.node_class):
                self.queue.add(f"profile/{p.name}")

    def _on_daemonset(self, kind: str, old, new) -> None:
        if any(v is not None and v.device_plugin for v in (old, new)):
            for p in self.profile_index.live():
                self.queue.add(f"profile/{p.name}")

    def _on_profile(self, kind: str, old: ProfileView | None, new: ProfileView | None) -> None:
        v = new or old
        if kind != "DELETED":
            self.queue.add(f"profile/{v.name}")
        pools = {x.profile.nodes.node_pool for x in (old, new) if x is not None and x.profile is not None}
        self._enqueue_claims(lambda c: c.nodepool in pools)
        for n in list(self.nodes.store.values()):
            if n.nodepool in pools:
                self._enqueue_check(None, n)
            if n.profile == v.name:
                self.queue.add(modellabels.key(n.name))     # spec.models changed: labels to set or remove

    def _enqueue_claims(self, pred=lambda c: True) -> None:
        for name, c in list(self.claims.store.items()):
            if pred(c):
                self.queue.add(f"claim/{name}")

    def _enqueue_all(self) -> None:
        for p in self.profile_index.live() + self.profile_index.held():
            self.queue.add(f"profile/{p.name}")
        self._enqueue_claims()
        for n in list(self.nodes.store.values()):
            self._enqueue_check(None, n)
            if self.modellabels.profile_of(n) is not None:
                self.queue.add(modellabels.key(n.name))

    # -- leadership ------------------------------------------------------------------------------------
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
                if kind == "claim":
                    self.reconcile_claim(name)
                elif kind == "budget":
                    self.nodeclaim.reconcile_budget(name)
                elif kind == enginecheck.KIND:
                    self.enginecheck.reconcile(name)
                elif kind == modellabels.KIND:
                    self.modellabels.reconcile(name)
                else:
                    self.reconcile_profile(name)
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
