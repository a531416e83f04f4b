"""The model-label reconciler: one key per Node of a profile (``models/<Node>``), planned on the cached Node (plan.py)
and written in one JSON patch conditional on its resourceVersion; a write that meets a changed Node re-reads it and
plans again, at most MAX_CONFLICT_RETRIES times. Every change is an Event on the Node and a count in
nodewarm_model_labels_total, once the write succeeded.
"""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException

from nodewarm.api import lifecycle
from nodewarm.api.views import NodeView
from nodewarm.api.warmprofile import WarmProfile

from ..kube import MAX_CONFLICT_RETRIES, NODES, WARMPROFILES
from ..profiles import ProfileView
from ..shared import Manager
from ..watch import Watch, deleted, not_deleted
from .plan import NO_CAPACITY, Plan, change_event, no_capacity_event, plan

KIND = "models"


def key(node: str) -> str:
    return f"{KIND}/{node}"


class ModelLabelController:
    def __init__(self, mgr: Manager):
        self.mgr = mgr
        # node -> {model: the NoCapacity message told}: one Event per message, not one per reconcile. A new leader
        # starts empty and tells each failure once more.
        self._told: dict[str, dict[str, str]] = {}

    def profile_of(self, node: NodeView | None) -> WarmProfile | None:
        """The profile the node's nodewarm.io/profile label names, if this controller manages it."""
        if node is None or not node.profile:
            return None
        index = self.mgr.profile_index
        return next((p for p in index.live() + index.held() if p.name == node.profile), None)

    def forget(self, node: str) -> None:
        self._told.pop(node, None)

    # -- what brings a node here (the manager routes the events: watch.py) -------------------------------
    def watches(self) -> list[Watch]:
        return [
            Watch(NODES, on_event=lambda event, old, new: self.forget((old or new).name), predicate=deleted),
            Watch(NODES, lambda event, old, new: self._node_key(new), predicate=not_deleted),
            Watch(WARMPROFILES, self._nodes_of_profile),      # spec.models changed: labels to set or remove
        ]

    def routes(self) -> dict:
        return {KIND: self.reconcile}

    def keys(self) -> list[str]:
        return [k for n in list(self.mgr.nodes.store.values()) for k in self._node_key(n)]

    def _node_key(self, node: NodeView) -> list[str]:
        return [key(node.name)] if self.profile_of(node) is not None else []

    def _nodes_of_profile(self, event: str, old: ProfileView | None, new: ProfileView | None) -> list[str]:
        name = (new or old).name
        return [key(n.name) for n in list(self.mgr.nodes.store.values()) if n.profile == name]

    def reconcile(self, name: str) -> Plan | None:
        mgr = self.mgr
        node = mgr.nodes.store.get(name)
        p = self.profile_of(node)
        if p is None or node.deleting:
            return None
        for _ in range(MAX_CONFLICT_RETRIES):
            out = plan(p, node, self._taint(p, node), self._told.get(name, {}))
            if not out.ops:
                break
            if mgr.opt.dry_run:
                mgr.log.info("model_labels.would", node=name, profile=p.name,
                             changes={c.key: c.value for c in out.changes})
                return out
            try:
                after = mgr.kube.json_patch(NODES, name, list(out.ops), timeout=mgr.write_timeout())
            except ApiException as e:
                if e.status == 404:
                    return None
                if e.status not in (409, 422):
                    raise
                mgr.metrics.conflicts.labels("nodes").inc()
                mgr.log.info("model_labels.conflict", node=name, status=e.status)
                try:
                    node = NodeView.from_obj(mgr.kube.get(NODES, name, timeout=mgr.write_timeout()))
                except ApiException as e2:
                    if e2.status == 404:
                        return None
                    raise
                continue
            # Our own write, into the cache: a re-queue before the watch event must not plan it again.
            mgr.nodes.store[name] = NodeView.from_obj(after)
            break
        else:
            raise RuntimeError(f"Node {name} kept changing; giving up on its model labels after "
                               f"{MAX_CONFLICT_RETRIES} tries")
        if not mgr.opt.dry_run:
            self._tell(p, node, out)
        return out

    def _taint(self, p: WarmProfile, node: NodeView) -> str:
        view = self.mgr.profile_index.view(p.name)
        retired = (view.injected.get("retiredTaintKeys") or ()) if view else ()
        return lifecycle.gating_taint(p.readiness.taint_key, retired, node)

    def _tell(self, p: WarmProfile, node: NodeView, out: Plan) -> None:
        mgr = self.mgr
        for c in out.changes:
            mgr.events.emit(change_event(node, c))
            mgr.metrics.model_labels.labels(p.name, c.action).inc()
        for model in out.told:
            mgr.events.emit(no_capacity_event(node, model, out.no_capacity[model]))
            mgr.metrics.model_labels.labels(p.name, NO_CAPACITY).inc()
        if out.no_capacity:
            self._told[node.name] = dict(out.no_capacity)
        else:
            self._told.pop(node.name, None)
        if out.changes or out.told:
            mgr.log.info("model_labels", node=node.name, profile=p.name,
                         changes={c.key: c.value for c in out.changes}, no_capacity=list(out.told),
                         deferred=[c.key for c in out.deferred])
