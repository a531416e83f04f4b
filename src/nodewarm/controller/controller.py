"""The controller: informers -> work queue -> workers running the pure plans, one guarded write each.

Run it in-process (demo, tests, bench)::

    c = Controller(api_client, ControllerOptions(...))
    c.run_until(stop_event)          # or c.start() ... c.stop()

Keys in the queue are ``claim/<NodeClaim>``, ``profile/<WarmProfile>`` and ``budget/<NodePool>`` (re-check
a paused replace budget). Every replica lists and watches (so a standby's caches are warm when it takes
over); only the Lease holder processes keys, each write bounded by the time its Lease still covers.
A ``--dry-run`` replica writes nothing, so it never takes the Lease: it audits on its own.
Deleting a WarmProfile (finalizer ``nodewarm.io/cleanup``) takes its startup taint out of the NodePool and off
the nodes still carrying it when that drifts no live NodeClaim (or spec.injection.onLive: drift allows it); else
the terminating profile keeps gating the pool until it can (``_clean_up``). userData/instanceStorePolicy stay in
place: removing them would drift (replace) every node of the class.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodewarm import logs
from nodewarm.api import lifecycle
from nodewarm.api.names import CLEANUP_FINALIZER
from nodewarm.api.timeutil import fmt_time_s, parse_time
from nodewarm.api.views import ClaimView, Condition, NodeView
from nodewarm.api.errors import NodewarmError
from nodewarm.api.warmprofile import WarmProfile
from nodewarm.profile import from_dict

from . import deviceplugins
from . import plan as planner
from .events import EventRecorder
from .inject import Injector
from .kube import (
    AUTOMODE_NODECLASSES, DAEMONSETS, EC2NODECLASSES, NODECLAIMS, NODEPOOLS, NODES, WARMPROFILES, Kube,
)
from .leader import LeaderConfig, LeaderElector
from .metrics import HttpEndpoints, Metrics, metrics_routes
from .reflector import Reflector, wait_synced
from .workqueue import WorkQueue

MAX_CONFLICT_RETRIES = 5
FINALIZER = CLEANUP_FINALIZER


class NotLeading(Exception):
    """This replica's Lease no longer covers a write: drop the work, the next leader re-enqueues it."""


@dataclass(frozen=True)
class ControllerOptions:
    dry_run: bool = False
    workers: int = 4
    leader_elect: bool = False
    lease_namespace: str = "nodewarm"
    lease_name: str = "nodewarm-controller"
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}")
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    metrics_port: int | None = None       # None: no endpoint; 0: any free port (tests)
    health_port: int | None = None
    bind_address: str = "0.0.0.0"
    profiles: tuple[WarmProfile, ...] = ()   # from --profile files, in addition to WarmProfile objects
    watch_profiles: bool = True
    watch_timeout_s: int = 300
    resync_s: float = 300.0
    instance_source: str = "offline"
    event_namespace: str = "default"
    list_page_size: int = 250              # objects per list page: bounds the memory of a (re)list
    replace_budget: int = 3                # onDeadline=replace: replacements per NodePool per window
    replace_window_s: float = 3600.0
    replace_backoff_s: float = 60.0        # wait after the k-th replacement: this x 2**(k-1), capped
    replace_backoff_max_s: float = 1800.0


@dataclass(frozen=True)
class ProfileView:
    """A WarmProfile object as cached: parsed, or the reason it could not be."""

    name: str
    uid: str
    resource_version: str
    generation: int
    created: float
    deleting: bool
    finalizers: tuple[str, ...]
    profile: WarmProfile | None
    error: str
    conditions: tuple[dict, ...]
    injected: dict                  # status.injected: what this profile last injected (pool, class, taint key)

    @classmethod
    def from_obj(cls, o: dict) -> "ProfileView":
        md = o["metadata"]
        doc = {"apiVersion": o.get("apiVersion"), "kind": o.get("kind"), "spec": o.get("spec"),
               "metadata": {k: v for k, v in md.items() if k in ("name", "labels", "annotations")}}
        try:
            p, err = from_dict(doc), ""
        except NodewarmError as e:
            p, err = None, e.one_line()
        status = o.get("status") or {}
        return cls(md["name"], md.get("uid", ""), md.get("resourceVersion", ""), md.get("generation", 0),
                   parse_time(md.get("creationTimestamp")) or 0.0, bool(md.get("deletionTimestamp")),
                   tuple(md.get("finalizers") or ()), p, err, tuple(status.get("conditions") or ()),
                   dict(status.get("injected") or {}))


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
        self.injector = Injector(self.kube, self.opt.dry_run, self.opt.instance_source)
        self.log = logs.get("controller")
        self._lock = threading.Lock()
        self._node_by_pid: dict[str, str] = {}
        self._claim_by_pid: dict[str, str] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._http: list[HttpEndpoints] = []
        self.is_leader = threading.Event()
        # (claim, action) in order, the latest few thousand: what tests and the demo read.
        self.decisions: deque[tuple[str, str]] = deque(maxlen=10000)
        self.replace_policy = planner.ReplacePolicy(self.opt.replace_budget, self.opt.replace_window_s,
                                                    self.opt.replace_backoff_s, self.opt.replace_backoff_max_s)
        self._replaced: dict[str, list[float]] = {}     # NodePool -> when we replaced its nodes (this term)

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

    # -- profiles ------------------------------------------------------------------------------------
    def all_profiles(self) -> list[WarmProfile]:
        """Static (--profile) first, then WarmProfile objects, oldest first: who binds a pool or class first."""
        out = list(self.opt.profiles)
        if self.profiles is not None:
            out += [v.profile for v in lifecycle.live(self.profiles.store.values()) if v.profile is not None]
        return out

    def held_profiles(self) -> list[WarmProfile]:
        """Deleted WarmProfiles whose clean-up waits (finalizer still on, see ``_clean_up``): until it finishes
        they keep gating their pool's new nodes, so none is left under a taint nobody lifts."""
        if self.profiles is None:
            return []
        return [v.profile for v in lifecycle.held(self.profiles.store.values()) if v.profile is not None]

    def profile_for_pool(self, pool: str) -> WarmProfile | None:
        """The live profile bound to ``pool``, else a deleted one still holding its taint there."""
        for p in self.all_profiles() + self.held_profiles():
            if p.nodes.node_pool == pool:
                return p
        return None

    def _owner_conflict(self, p: WarmProfile) -> Condition | None:
        """A NodePool or NodeClass belongs to the first profile that names it; a second one is refused."""
        for other in self.all_profiles():
            if other.name == p.name:
                return None
            if other.nodes.node_pool == p.nodes.node_pool:
                return Condition("Injected", "False", "NodePoolTaken",
                                 f"NodePool {p.nodes.node_pool} is already bound to WarmProfile {other.name}; "
                                 "one NodePool serves one profile: use a NodePool of its own")
            if other.nodes.node_class == p.nodes.node_class and other.nodes.mode == p.nodes.mode:
                return Condition("Injected", "False", "NodeClassTaken",
                                 f"NodeClass {p.nodes.node_class} is already bound to WarmProfile {other.name}; "
                                 "its user data names that profile: give this profile a NodeClass of its own")
        return None

    # -- informer handlers (cheap: index and enqueue) --------------------------------------------------
    def _on_claim(self, kind: str, old: ClaimView | None, new: ClaimView | None) -> None:
        with self._lock:
            if old is not None and old.provider_id and self._claim_by_pid.get(old.provider_id) == old.name:
                del self._claim_by_pid[old.provider_id]
            if kind != "DELETED" and new is not None and new.provider_id:
                self._claim_by_pid[new.provider_id] = new.name
        name = (new or old).name
        # A held clean-up finishes once removing the taint drifts nothing: re-check it as claims come and go.
        for p in self.held_profiles():
            if p.nodes.node_pool == (new or old).nodepool:
                self.queue.add(f"profile/{p.name}")
        if kind == "DELETED":
            self.queue.forget(f"claim/{name}")
            self.log.info("nodeclaim.deleted", nodeclaim=name)
            return
        self.queue.add(f"claim/{name}")

    def _on_node(self, kind: str, old: NodeView | None, new: NodeView | None) -> None:
        pid = (new or old).provider_id
        with self._lock:
            if old is not None and old.provider_id and self._node_by_pid.get(old.provider_id) == old.name:
                del self._node_by_pid[old.provider_id]
            if kind != "DELETED" and new is not None and new.provider_id:
                self._node_by_pid[new.provider_id] = new.name
            claim = self._claim_by_pid.get(pid) if pid else None
        if kind == "DELETED" and claim:
            # Nothing to undo: the record lived on the Node. The NodeClaim is Karpenter's to clean up.
            self.log.info("node.deleted", node=(old or new).name, nodeclaim=claim)
        self._count_served_cache_outcome(kind, old, new)
        if claim:
            self.queue.add(f"claim/{claim}")

    def _count_served_cache_outcome(self, kind: str, old: NodeView | None, new: NodeView | None) -> None:
        """hit|miss arrive after the taint is lifted, when the publisher proves them in serving: count each
        change to one once (a change, not a state: a restarted controller listing old nodes counts nothing)."""
        if kind != "MODIFIED" or old is None or new is None or not self.is_leader.is_set():
            return
        was, now = old.annotations.get(planner.CACHE_ANNOTATION), new.annotations.get(planner.CACHE_ANNOTATION)
        if now != was and now in ("hit", "miss"):
            self.metrics.cache.labels(new.nodepool, now).inc()
            self.log.info("compile_cache.proven", node=new.name, nodepool=new.nodepool, result=now)

    def _on_target(self, kind: str, old, new) -> None:
        name = (new or old)[0]
        for p in self.all_profiles() + self.held_profiles():
            if name in (p.nodes.node_pool, p.nodes.node_class):
                self.queue.add(f"profile/{p.name}")

    def _on_daemonset(self, kind: str, old, new) -> None:
        if any(v is not None and v.device_plugin for v in (old, new)):
            for p in self.all_profiles():
                self.queue.add(f"profile/{p.name}")

    def _on_profile(self, kind: str, old: ProfileView | None, new: ProfileView | None) -> None:
        v = new or old
        if kind != "DELETED":
            self.queue.add(f"profile/{v.name}")
        pools = {x.profile.nodes.node_pool for x in (old, new) if x is not None and x.profile is not None}
        self._enqueue_claims(lambda c: c.nodepool in pools)

    def _enqueue_claims(self, pred=lambda c: True) -> None:
        for name, c in list(self.claims.store.items()):
            if pred(c):
                self.queue.add(f"claim/{name}")

    def _enqueue_all(self) -> None:
        for p in self.all_profiles() + self.held_profiles():
            self.queue.add(f"profile/{p.name}")
        self._enqueue_claims()

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

    def _write_timeout(self) -> float | None:
        """A write must end while the Lease still covers it; without leader election, the client default."""
        if self.elector is None:
            return None
        left = self.elector.remaining_s()
        if left <= 0.05:
            raise NotLeading()
        return min(self.kube.timeout, left)

    # -- workers ---------------------------------------------------------------------------------------
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
                    self.reconcile_budget(name)
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

    def _node_for(self, claim: ClaimView) -> NodeView | None:
        with self._lock:
            node_name = self._node_by_pid.get(claim.provider_id) if claim.provider_id else None
        return self.nodes.store.get(node_name) if node_name else None

    def _read_live(self, claim: ClaimView, node: NodeView | None) -> tuple[ClaimView | None, NodeView | None]:
        """GET the NodeClaim and its Node from the API server (not the cache): deadline actions and
        retries after a conflict decide on what is there now."""
        timeout = self._write_timeout()
        try:
            live_claim = ClaimView.from_obj(self.kube.get(NODECLAIMS, claim.name, timeout=timeout))
        except ApiException as e:
            if e.status == 404:
                return None, None
            raise
        name = node.name if node is not None else None
        if name is None:
            cached = self._node_for(live_claim)
            name = cached.name if cached else None
        live_node = None
        if name is not None:
            try:
                live_node = NodeView.from_obj(self.kube.get(NODES, name, timeout=self._write_timeout()))
            except ApiException as e:
                if e.status != 404:
                    raise
        if live_node is not None and not lifecycle.paired(live_claim, live_node):
            live_node = None      # a namesake Node of another instance is not this claim's node
        return live_claim, live_node

    def reconcile_claim(self, name: str) -> planner.Plan | None:
        claim = self.claims.store.get(name)
        if claim is None:
            return None
        p = self.profile_for_pool(claim.nodepool)
        node = self._node_for(claim)
        if p is not None and node is not None and not node.has_taint(p.readiness.taint_key):
            p = self._gated_by_retired_key(p, node)
        live = False
        for _ in range(MAX_CONFLICT_RETRIES):
            plan = planner.plan_claim(claim, node, p, time.time())
            if plan.deadline and not live:
                # The cache can be a moment behind (a node that has just turned Warm): re-read, re-plan.
                claim, node = self._read_live(claim, node)
                live = True
                if claim is None:
                    return None
                continue
            if plan.action == planner.NONE:
                if plan.requeue_after is not None:
                    self.queue.add_after(f"claim/{name}", plan.requeue_after + 0.05)
                return plan
            if plan.action == planner.DELETE_CLAIM:
                gate = self._replace_gate(claim.nodepool, p, reserve=not self.opt.dry_run)
                if not gate.allowed:
                    self.log.info("decision.replace_paused", nodeclaim=name, nodepool=claim.nodepool,
                                  until=gate.until, reason=gate.condition.reason)
                    self.queue.add_after(f"claim/{name}", gate.until - time.time() + 0.05)
                    return planner.Plan(name, conditions=plan.conditions, requeue_after=gate.until - time.time())
            if self.opt.dry_run:
                self.log.info("decision.would", nodeclaim=name, node=node.name if node else None, action=plan.action,
                              reasons=[c.reason for c in plan.conditions])
                return plan
            try:
                self._execute(plan, claim, node)
                return plan
            except NotLeading:
                if plan.action == planner.DELETE_CLAIM:
                    self._unreserve(claim.nodepool)     # raised before anything was sent
                raise
            except ApiException as e:
                if plan.action == planner.DELETE_CLAIM:
                    self._unreserve(claim.nodepool)
                if e.status == 404:
                    self.log.info("decision.target_gone", nodeclaim=name, action=plan.action)
                    return None
                if e.status not in (409, 422):
                    raise
                # The object changed under us (taint list moved, a newer resourceVersion): re-read, re-plan.
                self.metrics.conflicts.labels("nodeclaims" if plan.action == planner.DELETE_CLAIM else "nodes").inc()
                self.log.info("decision.conflict", nodeclaim=name, node=node.name if node else None, status=e.status)
                claim, node = self._read_live(claim, node)
                live = True
                if claim is None:
                    return None
        raise RuntimeError(f"NodeClaim {name} or its node kept changing; giving up after {MAX_CONFLICT_RETRIES} tries")

    # -- replace budget ------------------------------------------------------------------------------
    def _replace_gate(self, pool: str, p, reserve: bool) -> planner.ReplaceGate:
        with self._lock:
            now = time.time()
            history = self._replaced.setdefault(pool, [])
            history[:] = [t for t in history if now - t < self.replace_policy.window_s]
            gate = planner.replace_gate(pool, tuple(history), now, self.replace_policy)
            if gate.allowed and reserve:
                history.append(now)
        self._budget_condition(p, gate)
        if gate.condition.status == "True":
            self.queue.add_after(f"budget/{pool}", gate.until - time.time() + 0.05)
        return gate

    def _unreserve(self, pool: str) -> None:
        with self._lock:
            if self._replaced.get(pool):
                self._replaced[pool].pop()

    def _budget_condition(self, p, gate: planner.ReplaceGate) -> None:
        view = self.profiles.store.get(p.name) if (p is not None and self.profiles is not None) else None
        old = next((c for c in view.conditions if c.get("type") == gate.condition.type), None) if view else None
        if old is None and gate.condition.status == "False":
            return     # never paused: no condition to clear
        self._set_profile_condition(view, gate.condition)

    def reconcile_budget(self, pool: str) -> planner.ReplaceGate:
        """A paused budget reopened (or is still paused): keep the WarmProfile's condition true to it."""
        gate = self._replace_gate(pool, self.profile_for_pool(pool), reserve=False)
        if gate.condition.status == "False":
            # The claims it held back were requeued for the same moment; nothing else to do here.
            self.log.info("replace_budget.reopened", nodepool=pool)
        return gate

    def _gated_by_retired_key(self, p: WarmProfile, node: NodeView) -> WarmProfile:
        """A node registered before a taintKey rename carries the old key: gate it by that key."""
        view = self.profiles.store.get(p.name) if self.profiles is not None else None
        retired = (view.injected.get("retiredTaintKeys") or ()) if view else ()
        key = lifecycle.gating_taint(p.readiness.taint_key, retired, node)
        return p if key == p.readiness.taint_key else replace(p, readiness=replace(p.readiness, taint_key=key))

    def _execute(self, plan: planner.Plan, claim: ClaimView, node: NodeView | None) -> None:
        timeout = self._write_timeout()
        if plan.action == planner.DELETE_CLAIM:
            # Exactly the NodeClaim we planned on: another uid or a newer resourceVersion gets 409 and a re-plan.
            self.kube.delete(NODECLAIMS, claim.name, uid=claim.uid, resource_version=claim.resource_version or None,
                             timeout=timeout)
        else:
            after = self.kube.json_patch(NODES, node.name, list(plan.node_ops), timeout=timeout)
            # Feed our own write into the cache so a re-queue before the watch event sees the record.
            self.nodes.store[node.name] = NodeView.from_obj(after)
        with self._lock:
            self.decisions.append((claim.name, plan.action))
        self.metrics.observe(claim.nodepool, plan.counters, plan.durations)
        node_ev = next((e for e in plan.events if e.kind == "Node"), None)
        claim_ev = next((e for e in plan.events if e.kind == "NodeClaim"), None)
        for ev in plan.events:
            self.events.emit(ev, claim_ev if ev is node_ev else node_ev)
        self.log.info("decision", nodeclaim=claim.name, node=node.name if node else None, action=plan.action,
                      nodepool=claim.nodepool, reasons={c.type: c.reason for c in plan.conditions},
                      durations={k: round(v, 3) for k, v in plan.durations})

    def reconcile_profile(self, name: str):
        static = {p.name: p for p in self.opt.profiles}
        view = self.profiles.store.get(name) if self.profiles is not None else None
        if view is not None and view.deleting:
            return self._clean_up(view)
        p = static.get(name) or (view.profile if view else None)
        if p is None:
            if view is not None and view.error:
                self._set_profile_condition(view, Condition("Injected", "False", "InvalidProfile", view.error))
            return None
        taken = self._owner_conflict(p)
        if taken is not None:
            self._profile_event(view, taken)
            self._set_profile_condition(view, taken)
            return None
        if view is not None and FINALIZER not in view.finalizers and not self.opt.dry_run:
            # Before the first injection: from then on a deletion waits for the clean-up.
            after = self.kube.merge_patch(WARMPROFILES, view.name, {"metadata": {
                "resourceVersion": view.resource_version, "finalizers": [*view.finalizers, FINALIZER]}})
            view = ProfileView.from_obj(after)
            self.profiles.store[view.name] = view
        result = self.injector.reconcile(p, (view.injected.get("taintKey") if view else None))
        for t in result.targets:
            if t.applied:
                self.metrics.injections.labels(t.kind, "applied").inc()
                self.events.emit(planner.EventSpec(t.kind, t.name, "", "NodewarmInjected",
                                                   f"WarmProfile {p.name} applied {', '.join(t.changed_fields)}"))
            elif t.changed_fields:
                self.metrics.injections.labels(t.kind, "audit").inc()
            else:
                self.metrics.injections.labels(t.kind, "uptodate").inc()
        if result.warning:
            self.metrics.injections.labels("WarmProfile", result.condition.reason).inc()
            self._profile_event(view, result.condition)
        self.log.info("inject", profile=p.name, reason=result.condition.reason, message=result.condition.message)
        injected = None
        if result.condition.status == "True":
            # A renamed taintKey: nodes registered with the old key are still gated by it (reconcile_claim).
            old = view.injected if view else {}
            retired = set(old.get("retiredTaintKeys") or ()) | ({old["taintKey"]} if old.get("taintKey") else set())
            injected = {"nodePool": p.nodes.node_pool, "nodeClass": p.nodes.node_class,
                        "taintKey": p.readiness.taint_key,
                        "retiredTaintKeys": sorted(retired - {p.readiness.taint_key})}
        self._set_profile_condition(view, result.condition, injected)
        self._check_device_plugins(p)
        return result

    def _check_device_plugins(self, p: WarmProfile) -> deviceplugins.Verdict | None:
        """Whether the device plugins that may run on the profile's nodes tolerate its startup taint: a
        condition on the WarmProfile, a Warning event when that changes, a metric, a log line."""
        if not self.daemonsets.synced.is_set():
            return None          # not listed (yet, or no RBAC for it): no verdict rather than a false one
        verdict = deviceplugins.check(list(self.daemonsets.store.values()), p)
        self.metrics.device_plugins_missing.labels(p.name).set(len(verdict.missing))
        view = self.profiles.store.get(p.name) if self.profiles is not None else None
        if verdict.missing:
            self.log.warning("device_plugins.missing_toleration", profile=p.name, daemonsets=list(verdict.missing),
                             taint=p.readiness.taint_key)
            self._profile_event(view, verdict.condition)
        self._set_profile_condition(view, verdict.condition)
        return verdict

    def _profile_event(self, view: ProfileView | None, cond: Condition) -> None:
        """A Warning event on the WarmProfile, once per new reason/message (the condition is the record)."""
        if view is None:
            return
        old = next((c for c in view.conditions if c.get("type") == cond.type), None)
        if old and (old.get("reason"), old.get("message")) == (cond.reason, cond.message):
            return
        self.events.emit(planner.EventSpec("WarmProfile", view.name, view.uid, cond.reason, cond.message, "Warning"))

    def _clean_up(self, view: ProfileView):
        """A deleted WarmProfile: its startup taint leaves the NodePool and the nodes still carrying it; then the
        finalizer goes. The taint is hashed into the NodePool (removing it drifts every live NodeClaim exactly as
        adding it did), so the injection guard decides: with live NodeClaims it would drift and spec.injection.onLive
        not ``drift``, the taint stays and so does the finalizer. The terminating profile then keeps gating the
        pool (agents still read it, the controller still lifts the taint once a node is Warm): no node is replaced
        and none is left stuck; condition Cleanup=False (WouldDrift) says how to finish and what it costs.
        The NodeClass's user data stays either way: removing it would replace every node, and an agent whose
        profile is gone only reports ProfileNotFound."""
        if FINALIZER not in view.finalizers or self.opt.dry_run:
            return None
        pool = view.injected.get("nodePool") or (view.profile.nodes.node_pool if view.profile else None)
        keys = {k for k in (view.injected.get("taintKey"), view.profile and view.profile.readiness.taint_key,
                            *(view.injected.get("retiredTaintKeys") or ())) if k}
        if pool and any(other.nodes.node_pool == pool for other in self.all_profiles()):
            keys -= {other.readiness.taint_key for other in self.all_profiles() if other.nodes.node_pool == pool}
        on_live = view.profile.injection.on_live if view.profile else "refuse"
        held = []
        for key in sorted(keys) if pool else ():
            try:
                done = self.injector.release(pool, key, on_live)
            except ApiException as e:
                if e.status == 404:
                    done = None
                elif e.status == 409:
                    from .inject import conflict_managers

                    managers, _ = conflict_managers(e)
                    self.events.emit(planner.EventSpec(
                        "WarmProfile", view.name, view.uid, "CleanupConflict",
                        f"startupTaint {key} in NodePool {pool} is owned by field manager {', '.join(managers)}; "
                        "remove it from that manager's copy", "Warning"))
                    done = None
                else:
                    raise
            if done is not None and not done.done:
                held.append(done)
                continue
            if done is not None and done.applied:
                cost = f"; {done.drifting} node(s) replaced (spec.injection.onLive: drift)" if done.drifting else ""
                self.events.emit(planner.EventSpec("NodePool", pool, "", "NodewarmReleased",
                                                   f"WarmProfile {view.name} deleted: removed startupTaint {key}{cost}"))
            lifted = self._lift_taint(pool, key)
            self.log.info("profile.cleaned", profile=view.name, nodepool=pool, taint=key, nodes_untainted=lifted)
        if held:
            cond = planner.cleanup_held(view.name, pool, [r.taint_key for r in held], max(r.drifting for r in held),
                                        view.profile)
            self.log.info("profile.cleanup_held", profile=view.name, nodepool=pool, nodeclaims=held[0].drifting)
            self._profile_event(view, cond)
            self._set_profile_condition(view, cond)
            return None
        ops = [{"op": "test", "path": "/metadata/finalizers", "value": list(view.finalizers)},
               {"op": "replace", "path": "/metadata/finalizers", "value": [f for f in view.finalizers if f != FINALIZER]}]
        try:
            self.kube.json_patch(WARMPROFILES, view.name, ops)
        except ApiException as e:
            if e.status != 404:
                raise
        return None

    def _lift_taint(self, pool: str, key: str) -> int:
        """Remove ``key`` from every node of ``pool`` still carrying it (guarded, like the gate's untaint)."""
        lifted = 0
        for node in list(self.nodes.store.values()):
            if node.nodepool != pool or not node.has_taint(key):
                continue
            for _ in range(MAX_CONFLICT_RETRIES):
                try:
                    self.kube.json_patch(NODES, node.name, planner.guarded_taint_removal(node, key))
                    lifted += 1
                    break
                except ApiException as e:
                    if e.status == 404:
                        break
                    if e.status not in (409, 422):
                        raise
                    node = NodeView.from_obj(self.kube.get(NODES, node.name))
                    if not node.has_taint(key):
                        break
        return lifted

    def _set_profile_condition(self, view: ProfileView | None, cond: Condition, injected: dict | None = None) -> None:
        """WarmProfile status is ours (our CRD): one condition per phase, written only when it changes,
        with the object's resourceVersion so a concurrent writer makes us re-read instead of clobbering."""
        if view is None or self.opt.dry_run:
            return
        old = next((c for c in view.conditions if c.get("type") == cond.type), None)
        same = old and (old.get("status"), old.get("reason"), old.get("message")) == (cond.status, cond.reason, cond.message)
        if same and (injected is None or injected == view.injected):
            return
        now = fmt_time_s(time.time())
        new = {"type": cond.type, "status": cond.status, "reason": cond.reason, "message": cond.message[:4096],
               "lastTransitionTime": old.get("lastTransitionTime", now) if old and old.get("status") == cond.status else now,
               "observedGeneration": view.generation}
        conds = [c for c in view.conditions if c.get("type") != cond.type] + [new]
        status: dict = {"conditions": conds}
        if injected is not None:
            status["injected"] = injected
        after = self.kube.merge_patch(WARMPROFILES, view.name, {"metadata": {"resourceVersion": view.resource_version},
                                                                "status": status}, sub="status")
        # The next condition write in this reconcile goes with this resourceVersion, not the stale one.
        if self.profiles is not None and after.get("metadata"):
            self.profiles.store[view.name] = ProfileView.from_obj(after)

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
            self._http.append(HttpEndpoints(self.opt.health_port, {
                "/healthz": lambda: (200, "text/plain", b"ok\n") if self.healthy() else (500, "text/plain", b"unhealthy\n"),
                "/readyz": lambda: (200, "text/plain", b"ok\n") if self.ready() else (503, "text/plain", b"caches not synced\n"),
            }, self.opt.bind_address).start())
        if self.opt.metrics_port is not None:
            self._http.append(HttpEndpoints(self.opt.metrics_port, metrics_routes(self.metrics), self.opt.bind_address).start())
        if self._http:
            self.log.info("controller.listening", health_port=self.health_port, metrics_port=self.metrics_port)
        for i in range(self.opt.workers):
            t = threading.Thread(target=self._worker, name=f"worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._run_after_sync, name="starter", daemon=True)
        t.start()
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
            for p in self.all_profiles():
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

