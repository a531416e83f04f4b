"""The WarmProfile reconciler: inject its fields into its NodeClass and NodePool, check its device plugins, keep
its status; a deleted profile's clean-up (finalizer ``nodewarm.io/cleanup``).

Deleting a WarmProfile takes its startup taint out of the NodePool and off the nodes still carrying it when that
drifts no live NodeClaim (or spec.injection.onLive: drift allows it); else the terminating profile keeps gating the
pool until it can (``_clean_up``). userData/instanceStorePolicy stay in place: removing them would drift (replace)
every node of the class.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kubernetes.client.exceptions import ApiException

from nodewarm.api.names import CLEANUP_FINALIZER
from nodewarm.api.timeutil import fmt_time_s
from nodewarm.api.views import Condition, NodeView
from nodewarm.api.warmprofile import WarmProfile

from .. import deviceplugins
from ..events import EventSpec
from ..inject import Injector, conflict_managers
from ..kube import MAX_CONFLICT_RETRIES, NODES, WARMPROFILES
from ..nodepatch import guarded_taint_removal
from .cleanup import cleanup_held
from .view import ProfileView

if TYPE_CHECKING:
    from ..manager import Controller


class WarmProfileController:
    def __init__(self, mgr: "Controller"):
        self.mgr = mgr
        self.injector = Injector(mgr.kube, mgr.opt.dry_run, mgr.opt.instance_source)

    def _owner_conflict(self, p: WarmProfile) -> Condition | None:
        """A NodePool or NodeClass belongs to the first profile that names it; a second one is refused."""
        for other in self.mgr.profile_index.live():
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

    def reconcile(self, name: str):
        mgr = self.mgr
        view = mgr.profile_index.view(name)
        if view is not None and view.deleting:
            return self._clean_up(view)
        p = mgr.profile_index.static(name) or (view.profile if view else None)
        if p is None:
            if view is not None and view.error:
                self.write_condition(view, Condition("Injected", "False", "InvalidProfile", view.error))
            return None
        taken = self._owner_conflict(p)
        if taken is not None:
            self._profile_event(view, taken)
            self.write_condition(view, taken)
            return None
        if view is not None and CLEANUP_FINALIZER not in view.finalizers and not mgr.opt.dry_run:
            # Before the first injection: from then on a deletion waits for the clean-up.
            after = mgr.kube.merge_patch(WARMPROFILES, view.name, {"metadata": {
                "resourceVersion": view.resource_version, "finalizers": [*view.finalizers, CLEANUP_FINALIZER]}})
            view = ProfileView.from_obj(after)
            mgr.profile_index.remember(view)
        result = self.injector.reconcile(p, (view.injected.get("taintKey") if view else None))
        for t in result.targets:
            if t.applied:
                mgr.metrics.injections.labels(t.kind, "applied").inc()
                mgr.events.emit(EventSpec(t.kind, t.name, "", "NodewarmInjected",
                                          f"WarmProfile {p.name} applied {', '.join(t.changed_fields)}"))
            elif t.changed_fields:
                mgr.metrics.injections.labels(t.kind, "audit").inc()
            else:
                mgr.metrics.injections.labels(t.kind, "uptodate").inc()
        if result.warning:
            mgr.metrics.injections.labels("WarmProfile", result.condition.reason).inc()
            self._profile_event(view, result.condition)
        mgr.log.info("inject", profile=p.name, reason=result.condition.reason, message=result.condition.message)
        injected = None
        if result.condition.status == "True":
            # A renamed taintKey: nodes registered with the old key are still gated by it (reconcile_claim).
            old = view.injected if view else {}
            retired = set(old.get("retiredTaintKeys") or ()) | ({old["taintKey"]} if old.get("taintKey") else set())
            injected = {"nodePool": p.nodes.node_pool, "nodeClass": p.nodes.node_class,
                        "taintKey": p.readiness.taint_key,
                        "retiredTaintKeys": sorted(retired - {p.readiness.taint_key})}
        self.write_condition(view, result.condition, injected)
        self._check_device_plugins(p)
        return result

    def _check_device_plugins(self, p: WarmProfile) -> deviceplugins.Verdict | None:
        """Whether the device plugins that may run on the profile's nodes tolerate its startup taint: a
        condition on the WarmProfile, a Warning event when that changes, a metric, a log line."""
        mgr = self.mgr
        if not mgr.daemonsets.synced.is_set():
            return None          # not listed (yet, or no RBAC for it): no verdict rather than a false one
        verdict = deviceplugins.check(list(mgr.daemonsets.store.values()), p)
        mgr.metrics.device_plugins_missing.labels(p.name).set(len(verdict.missing))
        view = mgr.profile_index.view(p.name)
        if verdict.missing:
            mgr.log.warning("device_plugins.missing_toleration", profile=p.name, daemonsets=list(verdict.missing),
                            taint=p.readiness.taint_key)
            self._profile_event(view, verdict.condition)
        self.write_condition(view, verdict.condition)
        return verdict

    def _profile_event(self, view: ProfileView | None, cond: Condition) -> None:
        """A Warning event on the WarmProfile, once per new reason/message (the condition is the record)."""
        if view is None:
            return
        old = next((c for c in view.conditions if c.get("type") == cond.type), None)
        if old and (old.get("reason"), old.get("message")) == (cond.reason, cond.message):
            return
        self.mgr.events.emit(EventSpec("WarmProfile", view.name, view.uid, cond.reason, cond.message, "Warning"))

    def _clean_up(self, view: ProfileView):
        """A deleted WarmProfile: its startup taint leaves the NodePool and the nodes still carrying it; then the
        finalizer goes. The taint is hashed into the NodePool (removing it drifts every live NodeClaim exactly as
        adding it did), so the injection guard decides: with live NodeClaims it would drift and spec.injection.onLive
        not ``drift``, the taint stays and so does the finalizer. The terminating profile then keeps gating the
        pool (agents still read it, the controller still lifts the taint once a node is Warm): no node is replaced
        and none is left stuck; condition Cleanup=False (WouldDrift) says how to finish and what it costs.
        The NodeClass's user data stays either way: removing it would replace every node, and an agent whose
        profile is gone only reports ProfileNotFound."""
        mgr = self.mgr
        if CLEANUP_FINALIZER not in view.finalizers or mgr.opt.dry_run:
            return None
        pool = view.injected.get("nodePool") or (view.profile.nodes.node_pool if view.profile else None)
        keys = {k for k in (view.injected.get("taintKey"), view.profile and view.profile.readiness.taint_key,
                            *(view.injected.get("retiredTaintKeys") or ())) if k}
        if pool and any(other.nodes.node_pool == pool for other in mgr.profile_index.live()):
            keys -= {other.readiness.taint_key for other in mgr.profile_index.live() if other.nodes.node_pool == pool}
        on_live = view.profile.injection.on_live if view.profile else "refuse"
        held = []
        for key in sorted(keys) if pool else ():
            try:
                done = self.injector.release(pool, key, on_live)
            except ApiException as e:
                if e.status == 404:
                    done = None
                elif e.status == 409:
                    managers, _ = conflict_managers(e)
                    mgr.events.emit(EventSpec(
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
                mgr.events.emit(EventSpec("NodePool", pool, "", "NodewarmReleased",
                                          f"WarmProfile {view.name} deleted: removed startupTaint {key}{cost}"))
            lifted = self._lift_taint(pool, key)
            mgr.log.info("profile.cleaned", profile=view.name, nodepool=pool, taint=key, nodes_untainted=lifted)
        if held:
            cond = cleanup_held(view.name, pool, [r.taint_key for r in held], max(r.drifting for r in held),
                                        view.profile)
            mgr.log.info("profile.cleanup_held", profile=view.name, nodepool=pool, nodeclaims=held[0].drifting)
            self._profile_event(view, cond)
            self.write_condition(view, cond)
            return None
        ops = [{"op": "test", "path": "/metadata/finalizers", "value": list(view.finalizers)},
               {"op": "replace", "path": "/metadata/finalizers",
                "value": [f for f in view.finalizers if f != CLEANUP_FINALIZER]}]
        try:
            mgr.kube.json_patch(WARMPROFILES, view.name, ops)
        except ApiException as e:
            if e.status != 404:
                raise
        return None

    def _lift_taint(self, pool: str, key: str) -> int:
        """Remove ``key`` from every node of ``pool`` still carrying it (guarded, like the gate's untaint)."""
        kube = self.mgr.kube
        lifted = 0
        for node in list(self.mgr.nodes.store.values()):
            if node.nodepool != pool or not node.has_taint(key):
                continue
            for _ in range(MAX_CONFLICT_RETRIES):
                try:
                    kube.json_patch(NODES, node.name, guarded_taint_removal(node, key))
                    lifted += 1
                    break
                except ApiException as e:
                    if e.status == 404:
                        break
                    if e.status not in (409, 422):
                        raise
                    node = NodeView.from_obj(kube.get(NODES, node.name))
                    if not node.has_taint(key):
                        break
        return lifted

    def write_condition(self, view: ProfileView | None, cond: Condition, injected: dict | None = None) -> None:
        """WarmProfile status is ours (our CRD): one condition per phase, written only when it changes,
        with the object's resourceVersion so a concurrent writer makes us re-read instead of clobbering."""
        mgr = self.mgr
        if view is None or mgr.opt.dry_run:
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
        after = mgr.kube.merge_patch(WARMPROFILES, view.name, {"metadata": {"resourceVersion": view.resource_version},
                                                               "status": status}, sub="status")
        # The next condition write in this reconcile goes with this resourceVersion, not the stale one.
        if after.get("metadata"):
            mgr.profile_index.remember(ProfileView.from_obj(after))
