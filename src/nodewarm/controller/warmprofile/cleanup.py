"""Cleanup phase -> condition Cleanup: a deleted WarmProfile (finalizer ``nodewarm.io/cleanup``).

Its startup taint leaves the NodePool and the nodes still carrying it; then the finalizer goes. The taint is hashed
into the NodePool (removing it drifts every live NodeClaim exactly as adding it did), so the injection guard
decides: with live NodeClaims it would drift and spec.injection.onLive not ``drift``, the taint stays and so does the
finalizer. The terminating profile then keeps gating the pool (agents still read it, the controller still lifts the
taint once a node is Warm): no node is replaced and none is left stuck; condition Cleanup=False (WouldDrift) says how
to finish and what it costs, and the reconciler looks again as NodeClaims come and go. Its peer key Secret, Role and
RoleBindings go first, whatever the taint does: no agent of a deleted profile serves peers (peerkeys.py). The NodeClass's user data
(and instanceStorePolicy) stays either way: removing it would replace every node of the class, and an agent whose
profile is gone only reports ProfileNotFound.

A node Karpenter has not registered yet is not lifted (its registration would merge the taint back from its
NodeClaim, lifecycle.registration_pending), and while any NodeClaim of the pool is unregistered the finalizer stays
(AwaitingRegistration): a NodeClaim keeps the startupTaints it was created with, so its node registers under the
taint, and only this profile's clean-up would lift it.
"""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException

from nodewarm.api import lifecycle
from nodewarm.api.names import CLEANUP_CONDITION, CLEANUP_FINALIZER
from nodewarm.api.views import Condition, NodeView
from nodewarm.api.warmprofile import WarmProfile

from ..events import EventSpec
from ..kube import MAX_CONFLICT_RETRIES, NODES, Kube
from ..nodepatch import guarded_taint_removal
from ..profiles import ProfileView
from ..shared import Manager
from .conditions import Step, warning
from .inject import Injector, Release, conflict_managers
from .peerkeys import remove as remove_peers


def reconcile(mgr: Manager, injector: Injector, view: ProfileView) -> Step:
    """The deleted profile's Step: the finalizer's removal once every taint it put in is out, else why it waits."""
    if CLEANUP_FINALIZER not in view.finalizers or mgr.opt.dry_run:
        return Step()
    pool = view.injected.get("nodePool") or (view.profile.nodes.node_pool if view.profile else None)
    keys = {k for k in (view.injected.get("taintKey"), view.profile and view.profile.readiness.taint_key,
                        *(view.injected.get("retiredTaintKeys") or ())) if k}
    live = mgr.profile_index.live()
    if pool and any(other.nodes.node_pool == pool for other in live):
        keys -= {other.readiness.taint_key for other in live if other.nodes.node_pool == pool}
    on_live = view.profile.injection.on_live if view.profile else "refuse"
    held: list[Release] = []
    events: list[EventSpec] = remove_peers(mgr, view)
    unregistered = _unregistered(mgr, pool) if pool else set()
    try:
        for key in sorted(keys) if pool else ():
            done = _release(injector, view, pool, key, on_live, events)
            if done is not None and not done.done:
                held.append(done)
                continue
            lifted = lift_taint(mgr.kube, mgr.nodes.store.values(), pool, key, unregistered)
            mgr.log.info("profile.cleaned", profile=view.name, nodepool=pool, taint=key, nodes_untainted=lifted)
    except Exception:
        for ev in events:       # what was done before the failure is told all the same; the retry will not
            mgr.events.emit(ev)
        raise
    if held:
        cond = cleanup_held(view.name, pool, [r.taint_key for r in held], max(r.drifting for r in held), view.profile)
        mgr.log.info("profile.cleanup_held", profile=view.name, nodepool=pool, nodeclaims=held[0].drifting)
        return Step(cond, events=tuple(events) + warning(view, cond))
    waiting = sorted(unregistered) if keys else []
    if waiting:
        # The claims' registrations re-queue this profile (the manager's NodeClaim handler).
        cond = awaiting_registration(view.name, pool, waiting)
        mgr.log.info("profile.cleanup_awaits_registration", profile=view.name, nodepool=pool, nodeclaims=waiting)
        return Step(cond, events=tuple(events))
    return Step(events=tuple(events), finalizer_ops=(
        {"op": "test", "path": "/metadata/finalizers", "value": list(view.finalizers)},
        {"op": "replace", "path": "/metadata/finalizers",
         "value": [f for f in view.finalizers if f != CLEANUP_FINALIZER]}))


def _release(injector: Injector, view: ProfileView, pool: str, key: str, on_live: str,
             events: list[EventSpec]) -> Release | None:
    """Take ``key`` out of the NodePool if the injection guard allows it (None: the pool is gone, or another field
    manager owns the taint); what it did is told in ``events``."""
    try:
        done = injector.release(pool, key, on_live)
    except ApiException as e:
        if e.status == 404:
            return None
        if e.status != 409:
            raise
        managers, _ = conflict_managers(e)
        events.append(EventSpec(
            "WarmProfile", view.name, view.uid, "CleanupConflict",
            f"startupTaint {key} in NodePool {pool} is owned by field manager {', '.join(managers)}; "
            "remove it from that manager's copy", "Warning"))
        return None
    if done.applied:
        cost = f"; {done.drifting} node(s) replaced (spec.injection.onLive: drift)" if done.drifting else ""
        events.append(EventSpec("NodePool", pool, "", "NodewarmReleased",
                                f"WarmProfile {view.name} deleted: removed startupTaint {key}{cost}"))
    return done


def _unregistered(mgr: Manager, pool: str) -> set[str]:
    """The pool's NodeClaims (not being deleted) that Karpenter has not registered yet, with their Nodes' names."""
    out = set()
    for claim in list(mgr.claims.store.values()):
        if claim.nodepool != pool or claim.deleting:
            continue
        node = mgr.node_for(claim)
        if claim.registered is None or (node is not None and lifecycle.registration_pending(claim, node)):
            out |= {claim.name} | ({node.name} if node is not None else set())
    return out


def lift_taint(kube: Kube, nodes, pool: str, key: str, unregistered: set[str] = frozenset()) -> int:
    """Remove ``key`` from every node of ``pool`` still carrying it (guarded, like the NodeClaim reconciler's), but
    the ``unregistered`` ones: registration would put it back."""
    lifted = 0
    for node in list(nodes):
        if node.nodepool != pool or not node.has_taint(key) or node.name in unregistered:
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


def awaiting_registration(profile: str, pool: str, names: list[str]) -> Condition:
    return Condition(
        CLEANUP_CONDITION, "False", "AwaitingRegistration",
        f"WarmProfile {profile} is deleted and its startup taint is out of NodePool {pool}, but {', '.join(names)} "
        "has not been registered by Karpenter yet: its NodeClaim keeps the startupTaints it was created with and "
        "registration puts them on the Node, so the clean-up lifts the taint once it has registered, then finishes")


def cleanup_held(profile: str, pool: str, keys: list[str], nodeclaims: int, p: WarmProfile | None) -> Condition:
    """Why a deleted profile's clean-up waits, what finishing it costs (the nodes Karpenter would replace, and the
    weights each pulls again), and the ways to finish it."""
    size = p.model.size_gb if p is not None else None
    pull = f", {nodeclaims * size:g} GB of weights pulled again ({nodeclaims} x {size:g} GB)" if size else ""
    taints = " and ".join(keys)
    return Condition(
        CLEANUP_CONDITION, "False", "WouldDrift",
        f"WarmProfile {profile} is deleted, but NodePool {pool} keeps startupTaint {taints}: startupTaints is in "
        f"Karpenter's NodePool hash, so removing it would drift {nodeclaims} live NodeClaim(s) and Karpenter would "
        f"replace those nodes{pull}, compile caches cold. Until then this profile stays (Terminating) and new nodes "
        f"of {pool} are still warmed and untainted. To finish: let {pool} scale to zero nodes (the taint then goes "
        f"and nothing is replaced), or set spec.injection.onLive: drift on this WarmProfile to remove it now and "
        f"replace the {nodeclaims} node(s), or take {taints} out of the NodePool yourself (the same replacement). "
        "Do not remove the finalizer nodewarm.io/cleanup by hand: the taint would stay with nobody to lift it")
