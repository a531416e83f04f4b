"""The WarmProfile reconciler: its phases run in order, Karpenter's way, and the parent writes the profile once.

  inject         -> Injected               (inject.py: its fields into its NodeClass and NodePool)
  device plugins -> DevicePluginsTolerate  (deviceplugins.py: can the GPU's device plugin start on a warming node)
  peers          -> Peers                  (peerkeys.py: the peer key Secret, rotated, readable by the profile's nodes)
  cleanup        -> Cleanup                (cleanup.py: a deleted profile's taint out of its pool, its peer key, then
                                            the finalizer)

Each phase returns a Step (conditions.py): its condition, its events, and what goes with them (status.injected, the
finalizer's removal). The reconciler emits the events and writes the WarmProfile once: its status with every
condition that changed (guarded by the resourceVersion), or the clean-up's finalizer removal. A write that meets a
changed object fails (409) and the work queue retries the key. The finalizer itself goes on before the first
injection, so that from then on a deletion waits for the clean-up. The NodeClaim reconciler's replace budget writes
its ReplacementsPaused condition through ``write_status`` too.
"""

from __future__ import annotations

import time
from typing import Sequence

from kubernetes.client.exceptions import ApiException

from nodewarm.api.names import CLEANUP_FINALIZER
from nodewarm.api.views import Condition

from ..kube import AUTOMODE_NODECLASSES, DAEMONSETS, EC2NODECLASSES, NODECLAIMS, NODEPOOLS, NODES, WARMPROFILES
from ..profiles import ProfileView
from ..shared import Manager
from ..watch import Watch, not_deleted
from . import cleanup, conditions, deviceplugins, inject, peerkeys
from .conditions import Step

KIND = "profile"


def key(profile: str) -> str:
    return f"{KIND}/{profile}"


def _joins_or_leaves(event: str, old, new) -> bool:
    """A node joining or leaving a profile. Only then: a node's status and annotations change all the time and say
    nothing about who may read the key."""
    return not (event == "MODIFIED" and old is not None and new is not None and old.profile == new.profile)


def _device_plugin(event: str, old, new) -> bool:
    return any(v is not None and v.device_plugin for v in (old, new))


class WarmProfileController:
    def __init__(self, mgr: Manager):
        self.mgr = mgr
        self.injector = inject.Injector(mgr.kube, mgr.opt.dry_run, mgr.opt.instance_source)
        self.clock = time.time                          # the peer key's rotation reads it (tests move it)
        self._rotation_due: dict[str, float] = {}       # profile -> when its key rotation is queued for

    # -- what brings a profile here (the manager routes the events: watch.py) ---------------------------
    def watches(self) -> list[Watch]:
        return [
            # A held clean-up finishes once removing the taint drifts nothing: re-check it as claims come and go.
            Watch(NODECLAIMS, self._held_in_pool),
            # The profile's key bindings (peerkeys.py) follow who its nodes are.
            Watch(NODES, self._peer_profiles, predicate=_joins_or_leaves),
            # NodePools and NodeClasses matter only as "changed -> re-check the profiles bound to them".
            *(Watch(kind, self._bound_to) for kind in (NODEPOOLS, EC2NODECLASSES, AUTOMODE_NODECLASSES)),
            # A device plugin's scheduling may have changed for any live profile (deviceplugins.py).
            Watch(DAEMONSETS, self._live, predicate=_device_plugin),
            Watch(WARMPROFILES, lambda event, old, new: [key((new or old).name)], predicate=not_deleted),
        ]

    def routes(self) -> dict:
        return {KIND: self.reconcile}

    def keys(self) -> list[str]:
        return [key(p.name) for p in self._known()]

    def _known(self) -> list:
        index = self.mgr.profile_index
        return index.live() + index.held()

    def _live(self, event: str, old, new) -> list[str]:
        return [key(p.name) for p in self.mgr.profile_index.live()]

    def _held_in_pool(self, event: str, old, new) -> list[str]:
        return [key(p.name) for p in self.mgr.profile_index.held() if p.nodes.node_pool == (new or old).nodepool]

    def _peer_profiles(self, event: str, old, new) -> list[str]:
        out = []
        for name in {v.profile for v in (old, new) if v is not None and v.profile}:
            view = self.mgr.profile_index.view(name)
            p = self.mgr.profile_index.static(name) or (view.profile if view else None)
            if (p is not None and p.weights.peers.enabled) or peerkeys.had_peers(view):
                out.append(key(name))
        return out

    def _bound_to(self, event: str, old, new) -> list[str]:
        name = (new or old)[0]          # the manager caches NodePools and NodeClasses as (name, generation)
        return [key(p.name) for p in self._known() if name in (p.nodes.node_pool, p.nodes.node_class)]

    def reconcile(self, name: str) -> inject.InjectResult | None:
        mgr = self.mgr
        view = mgr.profile_index.view(name)
        if view is not None and view.deleting:
            self._write(view, [cleanup.reconcile(mgr, self.injector, view)])
            return None
        p = mgr.profile_index.static(name) or (view.profile if view else None)
        refused = inject.refused(view, p, mgr.profile_index.live())
        if refused is not None:
            self._write(view, [refused])
            return None
        view = self._add_finalizer(view)
        injection, result = inject.reconcile(mgr, self.injector, view, p)
        plugins = deviceplugins.reconcile(mgr, view, p)
        peers = self._peers(view, p)
        self._write(view, [injection] + [s for s in (plugins, peers) if s is not None])
        return result

    def _peers(self, view: ProfileView | None, p) -> Step | None:
        """The peers phase, and the profile queued again for when its key falls due (once per due time: every
        reconcile adding its own delayed key would pile up in the queue's heap over a rotation interval)."""
        now = self.clock()
        step, rotate_in_s = peerkeys.reconcile(self.mgr, view, p, now)
        if rotate_in_s is None:
            self._rotation_due.pop(p.name, None)
        elif self._rotation_due.get(p.name) != now + rotate_in_s:
            self._rotation_due[p.name] = now + rotate_in_s
            self.mgr.queue.add_after(key(p.name), rotate_in_s)
        return step

    def _add_finalizer(self, view: ProfileView | None) -> ProfileView | None:
        """Before the first injection: from then on a deletion waits for the clean-up."""
        mgr = self.mgr
        if view is None or CLEANUP_FINALIZER in view.finalizers or mgr.opt.dry_run:
            return view
        after = mgr.kube.merge_patch(WARMPROFILES, view.name, {"metadata": {
            "resourceVersion": view.resource_version, "finalizers": [*view.finalizers, CLEANUP_FINALIZER]}})
        view = ProfileView.from_obj(after)
        mgr.profile_index.remember(view)
        return view

    def _write(self, view: ProfileView | None, steps: Sequence[Step]) -> None:
        """The phases' events, then the one write of the WarmProfile."""
        for step in steps:
            for ev in step.events:
                self.mgr.events.emit(ev)
        ops = [op for step in steps for op in step.finalizer_ops]
        if ops:
            try:
                self.mgr.kube.json_patch(WARMPROFILES, view.name, ops)
            except ApiException as e:
                if e.status != 404:
                    raise
            return
        self.write_status(view, [(s.condition, s.injected) for s in steps if s.condition is not None])

    def write_status(self, view: ProfileView | None, updates: Sequence[tuple[Condition, dict | None]]) -> None:
        """WarmProfile status, written only when a condition (or status.injected) changes, with the object's
        resourceVersion so a concurrent writer makes us re-read instead of clobbering."""
        mgr = self.mgr
        if view is None or mgr.opt.dry_run:
            return
        status = conditions.status(view, updates, time.time())
        if status is None:
            return
        after = mgr.kube.merge_patch(WARMPROFILES, view.name, {"metadata": {"resourceVersion": view.resource_version},
                                                               "status": status}, sub="status")
        # A later write (the budget's condition) goes with this resourceVersion, not the stale one.
        if after.get("metadata"):
            mgr.profile_index.remember(ProfileView.from_obj(after))
