"""The engine check's reconciler: one key per node (``check/<profile>/<node>``), planned on the cached Node and the
live list of the profile's check pods (plan.py), carried out with creates and deletes in the serving namespace.

Pods are not watched (the controller may touch pods only where a profile's Role lets it, so there is no cluster-wide
informer): the Node's annotation changes are what bring a node here, and the plan is made on a fresh list each time.
The PodTemplate is read live at each create, so the pod runs what was last rendered and applied.
"""

from __future__ import annotations

from dataclasses import replace

from kubernetes.client.exceptions import ApiException

from nodewarm.api import enginecheck as contract
from nodewarm.api import lifecycle
from nodewarm.api.decisions import EventReason
from nodewarm.api.views import NodeView
from nodewarm.api.warmprofile import WarmProfile

from ..events import EventSpec
from ..kube import NODES, PODS, PODTEMPLATES, WARMPROFILES
from ..profiles import ProfileView, pools_of
from ..shared import Manager
from ..watch import Watch
from .plan import NOT_STARTED, STARTED, CheckPod, Plan, bound_pod, plan

KIND = "check"
# How soon a node whose pod could not be created (no PodTemplate, no Role) is looked at again: someone may apply
# what `nodewarm render` printed; the agent meanwhile times out to EngineCheckNotRun on its own.
NOT_STARTED_RECHECK_S = 30.0


def key(profile: str, node: str) -> str:
    return f"{KIND}/{profile}/{node}"


def asks(node: NodeView | None) -> bool:
    """Whether a Node carries the engine check's annotation (a request or its outcome): only those are keyed."""
    return node is not None and contract.REQUEST_ANNOTATION in node.annotations


class EngineCheckController:
    def __init__(self, mgr: Manager):
        self.mgr = mgr
        # (node, request id) already told that its pod could not be created: one Event each, not one per retry.
        self._told: set[tuple[str, str]] = set()

    # -- what brings a node here (the manager routes the events: watch.py) -------------------------------
    def watches(self) -> list[Watch]:
        return [Watch(NODES, lambda event, old, new: self._check_keys(old, new)),
                Watch(WARMPROFILES, self._nodes_in_pools)]

    def routes(self) -> dict:
        return {KIND: self.reconcile}

    def keys(self) -> list[str]:
        return [k for n in list(self.mgr.nodes.store.values()) for k in self._check_keys(None, n)]

    def _check_keys(self, old: NodeView | None, new: NodeView | None) -> list[str]:
        """A node that asks for (or answered) an engine check, of a profile that has it on: its check key. A deleted
        node's too, so its pods go with it."""
        v = next((x for x in (new, old) if asks(x)), None)
        if v is None:
            return []
        p = self.mgr.profile_index.for_pool(v.nodepool)
        return [key(p.name, v.name)] if p is not None and p.readiness.engine_check.enabled else []

    def _nodes_in_pools(self, event: str, old: ProfileView | None, new: ProfileView | None) -> list[str]:
        pools = pools_of(old, new)
        nodes = [n for n in list(self.mgr.nodes.store.values()) if n.nodepool in pools]
        return [k for n in nodes for k in self._check_keys(None, n)]

    def reconcile(self, name: str) -> Plan | None:
        mgr = self.mgr
        profile_name, node_name = name.split("/", 1)
        p = next((x for x in mgr.profile_index.live() + mgr.profile_index.held() if x.name == profile_name), None)
        if p is None or not p.readiness.engine_check.enabled:
            return None
        node = mgr.nodes.store.get(node_name)
        if node is not None and node.nodepool != p.nodes.node_pool:
            return None
        ns = p.serving.namespace
        try:
            pods = [CheckPod.from_obj(o) for o in
                    mgr.kube.list(PODS, ns, labelSelector=contract.label_selector(p.name)).get("items") or ()]
        except ApiException as e:
            if e.status != 403:
                raise
            if node is None:
                mgr.log.warning("engine_check.not_cleaned", node=node_name, profile=p.name, namespace=ns,
                                why="may not list pods there; the pods' ownerReference to the Node lets the garbage "
                                    "collector delete them")
                return None
            return self._not_started(p, node, None, f"the controller may not list pods in namespace {ns}: apply the "
                                     "Role and RoleBinding `nodewarm render` prints for spec.readiness.engineCheck")
        if node is None:
            self._told = {t for t in self._told if t[0] != node_name}
        taint = self._gating_taint(p, node)
        out = plan(node_name, node, p, taint, pods)
        if mgr.opt.dry_run:
            if out.create or out.delete:
                mgr.log.info("engine_check.would", node=node_name, create=out.create,
                             delete=[x.name for x in out.delete])
            return out
        for x in out.delete:
            try:
                mgr.kube.delete(PODS, x.name, x.namespace, uid=x.uid or None, timeout=mgr.write_timeout())
            except ApiException as e:
                if e.status not in (404, 409):      # gone already, or a namesake: either way not ours to delete
                    raise
        if out.create is not None and self._create(p, node, out.create) is not True:
            # AlreadyExists: an earlier pass created it, and told and counted it then; or it could not be created,
            # which _not_started told. The deletes above still are what they were.
            out = replace(out, events=tuple(e for e in out.events if e.reason != EventReason.ENGINE_CHECK_STARTED),
                          counters=tuple(c for c in out.counters if c[0] != STARTED))
        self._observe(p, out)
        for ev in out.events:
            mgr.events.emit(ev)
        if out.create or out.delete:
            mgr.log.info("engine_check", node=node_name, profile=p.name, create=out.create,
                         delete=[x.name for x in out.delete], outcomes=[c for c, _ in out.counters])
        if out.requeue_after is not None:
            mgr.queue.add_after(key(p.name, node_name), out.requeue_after)
        return out

    def _gating_taint(self, p: WarmProfile, node: NodeView | None) -> str:
        view = self.mgr.profile_index.view(p.name)
        retired = (view.injected.get("retiredTaintKeys") or ()) if view else ()
        return lifecycle.gating_taint(p.readiness.taint_key, retired, node)

    def _create(self, p: WarmProfile, node: NodeView, request_id: str) -> bool | None:
        """True: created; False: it existed already (success); None: could not (told, and looked at again)."""
        mgr, ns, tname = self.mgr, p.serving.namespace, contract.template_name(p.name)
        try:
            template = mgr.kube.get(PODTEMPLATES, tname, ns, timeout=mgr.write_timeout())
        except ApiException as e:
            if e.status == 404:
                return self._not_started(p, node, request_id, f"no PodTemplate {ns}/{tname}: apply what "
                                         "`nodewarm render` prints for this profile (spec.readiness.engineCheck)")
            if e.status == 403:
                return self._not_started(p, node, request_id, f"the controller may not read PodTemplate {ns}/{tname}: "
                                         "apply the Role and RoleBinding `nodewarm render` prints for "
                                         "spec.readiness.engineCheck (with --controller-namespace if it runs "
                                         "elsewhere than nodewarm)")
            raise
        try:
            mgr.kube.create(PODS, bound_pod(template, p, node, request_id), ns, timeout=mgr.write_timeout())
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            if e.status == 403:
                return self._not_started(p, node, request_id, f"the controller may not create pods in namespace {ns}"
                                         ": apply the Role and RoleBinding `nodewarm render` prints for "
                                         "spec.readiness.engineCheck")
            raise

    def _not_started(self, p: WarmProfile, node: NodeView, request_id: str | None, why: str) -> None:
        mgr = self.mgr
        told = (node.name, request_id or "")
        if told not in self._told:
            self._told.add(told)
            mgr.metrics.engine_checks.labels(p.nodes.node_pool, NOT_STARTED, "").inc()
            mgr.events.emit(EventSpec("Node", node.name, node.uid, EventReason.ENGINE_CHECK_NOT_STARTED,
                                      f"{why}; the node keeps waiting, and its agent reports "
                                      f"{contract.Reason.ENGINE_CHECK_NOT_RUN} when its wait ends", "Warning"))
        mgr.log.warning("engine_check.not_started", node=node.name, profile=p.name, why=why)
        mgr.queue.add_after(key(p.name, node.name), NOT_STARTED_RECHECK_S)
        return None

    def _observe(self, p: WarmProfile, out: Plan) -> None:
        m, pool = self.mgr.metrics, p.nodes.node_pool
        for outcome, reason in out.counters:
            m.engine_checks.labels(pool, outcome, reason).inc()
        for what, secs in out.timings:
            m.engine_seconds.labels(pool, what).observe(secs)
