"""The NodeClaim reconciler: plan on the cached NodeClaim and its Node (plan.py runs the phases), then carry the
plan out in one guarded write, with its events and metrics.

The plan is pure; this shell adds what needs the API server or this term's memory: a deadline plan is made again
on a live read before it acts (the cache may be a moment behind a node that has just turned Warm), a replace waits
for the per-NodePool budget (budget.py), and a write that meets a changed object (409/422: the taint list moved, a
newer resourceVersion) re-reads and re-plans, at most MAX_CONFLICT_RETRIES times.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from typing import Callable, Sequence

from kubernetes.client.exceptions import ApiException

from nodewarm.api import lifecycle
from nodewarm.api.names import CACHE_ANNOTATION
from nodewarm.api.views import ClaimView, Condition, NodeView
from nodewarm.api.warmprofile import WarmProfile

from ..kube import MAX_CONFLICT_RETRIES, NODECLAIMS, NODES, WARMPROFILES
from ..leader import NotLeading
from ..profiles import ProfileView, pools_of
from ..shared import Manager
from ..watch import Watch, deleted, not_deleted
from . import budget
from .plan import DELETE_CLAIM, NONE, Plan, plan_claim


# Writes conditions on a WarmProfile's status (the WarmProfile reconciler's write_status).
StatusWriter = Callable[[ProfileView | None, Sequence[tuple[Condition, dict | None]]], None]


KIND = "claim"
BUDGET = "budget"           # budget/<NodePool>: a paused replace budget, looked at again when it reopens


def key(claim: str) -> str:
    return f"{KIND}/{claim}"


def count_served_cache_outcome(mgr: Manager, kind: str, old: NodeView | None, new: NodeView | None) -> None:
    """hit|miss arrive after the taint is lifted, when the publisher proves them in serving: count each
    change to one once (a change, not a state: a restarted controller listing old nodes counts nothing)."""
    if kind != "MODIFIED" or old is None or new is None or not mgr.is_leader.is_set():
        return
    was, now = old.annotations.get(CACHE_ANNOTATION), new.annotations.get(CACHE_ANNOTATION)
    if now != was and now in ("hit", "miss"):
        mgr.metrics.cache.labels(new.nodepool, now).inc()
        mgr.log.info("compile_cache.proven", node=new.name, nodepool=new.nodepool, result=now)


class NodeClaimController:
    def __init__(self, mgr: Manager, write_profile_status: StatusWriter):
        self.mgr = mgr
        self.write_profile_status = write_profile_status
        opt = mgr.opt
        self.budget = budget.ReplaceBudget(budget.ReplacePolicy(opt.replace_budget, opt.replace_window_s,
                                                                opt.replace_backoff_s, opt.replace_backoff_max_s))

    # -- what brings a NodeClaim here (the manager routes the events: watch.py) -------------------------
    def watches(self) -> list[Watch]:
        return [
            Watch(NODECLAIMS, lambda event, old, new: [key((new or old).name)], predicate=not_deleted),
            Watch(NODECLAIMS, on_event=self._claim_gone, predicate=deleted),
            Watch(NODES, on_event=self._node_gone, predicate=deleted),
            # The compile-cache outcome (nodewarm_compile_cache_total) proven in serving, on the Node's change.
            Watch(NODES, on_event=partial(count_served_cache_outcome, self.mgr)),
            Watch(NODES, self._paired_claim),
            # A profile changed (or came, or went): the claims of the pools it bound and binds.
            Watch(WARMPROFILES, self._claims_in_pools),
        ]

    def routes(self) -> dict:
        return {KIND: self.reconcile, BUDGET: self.reconcile_budget}

    def keys(self) -> list[str]:
        return [key(name) for name in list(self.mgr.claims.store)]

    def _claim_gone(self, event: str, old: ClaimView | None, new: ClaimView | None) -> None:
        name = (new or old).name
        self.mgr.queue.forget(key(name))
        self.mgr.log.info("nodeclaim.deleted", nodeclaim=name)

    def _node_gone(self, event: str, old: NodeView | None, new: NodeView | None) -> None:
        claim = self.mgr.claim_for(new or old)
        if claim:
            # Nothing to undo: the record lived on the Node. The NodeClaim is Karpenter's to clean up.
            self.mgr.log.info("node.deleted", node=(old or new).name, nodeclaim=claim)

    def _paired_claim(self, event: str, old: NodeView | None, new: NodeView | None) -> list[str]:
        claim = self.mgr.claim_for(new or old)
        return [key(claim)] if claim else []

    def _claims_in_pools(self, event: str, old: ProfileView | None, new: ProfileView | None) -> list[str]:
        pools = pools_of(old, new)
        return [key(name) for name, c in list(self.mgr.claims.store.items()) if c.nodepool in pools]

    def _read_live(self, claim: ClaimView, node: NodeView | None) -> tuple[ClaimView | None, NodeView | None]:
        """GET the NodeClaim and its Node from the API server (not the cache): deadline actions and
        retries after a conflict decide on what is there now."""
        kube = self.mgr.kube
        try:
            live_claim = ClaimView.from_obj(kube.get(NODECLAIMS, claim.name, timeout=self.mgr.write_timeout()))
        except ApiException as e:
            if e.status == 404:
                return None, None
            raise
        name = node.name if node is not None else None
        if name is None:
            cached = self.mgr.node_for(live_claim)
            name = cached.name if cached else None
        live_node = None
        if name is not None:
            try:
                live_node = NodeView.from_obj(kube.get(NODES, name, timeout=self.mgr.write_timeout()))
            except ApiException as e:
                if e.status != 404:
                    raise
        if live_node is not None and not lifecycle.paired(live_claim, live_node):
            live_node = None      # a namesake Node of another instance is not this claim's node
        return live_claim, live_node

    def reconcile(self, name: str) -> Plan | None:
        mgr = self.mgr
        claim = mgr.claims.store.get(name)
        if claim is None:
            return None
        p = mgr.profile_index.for_pool(claim.nodepool)
        node = mgr.node_for(claim)
        if p is not None and node is not None and not node.has_taint(p.readiness.taint_key):
            p = self._gated_by_retired_key(p, node)
        live = False
        for _ in range(MAX_CONFLICT_RETRIES):
            plan = plan_claim(claim, node, p, time.time())
            if plan.deadline and not live:
                # The cache can be a moment behind (a node that has just turned Warm): re-read, re-plan.
                claim, node = self._read_live(claim, node)
                live = True
                if claim is None:
                    return None
                continue
            if plan.action == NONE:
                if plan.requeue_after is not None:
                    mgr.queue.add_after(key(name), plan.requeue_after + 0.05)
                return plan
            if plan.action == DELETE_CLAIM:
                gate = self._replace_gate(claim.nodepool, p, reserve=not mgr.opt.dry_run)
                if not gate.allowed:
                    mgr.log.info("decision.replace_paused", nodeclaim=name, nodepool=claim.nodepool,
                                 until=gate.until, reason=gate.condition.reason)
                    mgr.queue.add_after(key(name), gate.until - time.time() + 0.05)
                    return budget.held_back(plan, gate, time.time())
            if mgr.opt.dry_run:
                mgr.log.info("decision.would", nodeclaim=name, node=node.name if node else None, action=plan.action,
                             reasons=[c.reason for c in plan.conditions])
                return plan
            try:
                self._execute(plan, claim, node)
                return plan
            except NotLeading:
                if plan.action == DELETE_CLAIM:
                    self.budget.unreserve(claim.nodepool)     # raised before anything was sent
                raise
            except ApiException as e:
                if plan.action == DELETE_CLAIM:
                    self.budget.unreserve(claim.nodepool)
                if e.status == 404:
                    mgr.log.info("decision.target_gone", nodeclaim=name, action=plan.action)
                    return None
                if e.status not in (409, 422):
                    raise
                # The object changed under us (taint list moved, a newer resourceVersion): re-read, re-plan.
                mgr.metrics.conflicts.labels("nodeclaims" if plan.action == DELETE_CLAIM else "nodes").inc()
                mgr.log.info("decision.conflict", nodeclaim=name, node=node.name if node else None, status=e.status)
                claim, node = self._read_live(claim, node)
                live = True
                if claim is None:
                    return None
        raise RuntimeError(f"NodeClaim {name} or its node kept changing; giving up after {MAX_CONFLICT_RETRIES} tries")

    # -- replace budget ------------------------------------------------------------------------------
    def _replace_gate(self, pool: str, p: WarmProfile | None, reserve: bool) -> budget.ReplaceGate:
        """The budget's gate for ``pool``; its ReplacementsPaused condition goes on the profile's status, and a
        paused budget is looked at again when it reopens (key ``budget/<pool>``)."""
        gate = self.budget.gate(pool, time.time(), reserve)
        view = self.mgr.profile_index.view(p.name) if p is not None else None
        cond = budget.profile_condition(gate, view.conditions) if view is not None else None
        if cond is not None:
            self.write_profile_status(view, [(cond, None)])
        if gate.condition.status == "True":
            self.mgr.queue.add_after(f"{BUDGET}/{pool}", gate.until - time.time() + 0.05)
        return gate

    def reconcile_budget(self, pool: str) -> budget.ReplaceGate:
        """A paused budget reopened (or is still paused): keep the WarmProfile's condition true to it."""
        gate = self._replace_gate(pool, self.mgr.profile_index.for_pool(pool), reserve=False)
        if gate.condition.status == "False":
            # The claims it held back were requeued for the same moment; nothing else to do here.
            self.mgr.log.info("replace_budget.reopened", nodepool=pool)
        return gate

    def _gated_by_retired_key(self, p: WarmProfile, node: NodeView) -> WarmProfile:
        """A node registered before a taintKey rename carries the old key: gate it by that key."""
        view = self.mgr.profile_index.view(p.name)
        retired = (view.injected.get("retiredTaintKeys") or ()) if view else ()
        key = lifecycle.gating_taint(p.readiness.taint_key, retired, node)
        return p if key == p.readiness.taint_key else replace(p, readiness=replace(p.readiness, taint_key=key))

    def _execute(self, plan: Plan, claim: ClaimView, node: NodeView | None) -> None:
        mgr = self.mgr
        timeout = mgr.write_timeout()
        if plan.action == DELETE_CLAIM:
            # Exactly the NodeClaim we planned on: another uid or a newer resourceVersion gets 409 and a re-plan.
            mgr.kube.delete(NODECLAIMS, claim.name, uid=claim.uid, resource_version=claim.resource_version or None,
                            timeout=timeout)
        else:
            after = mgr.kube.json_patch(NODES, node.name, list(plan.node_ops), timeout=timeout)
            # Feed our own write into the cache so a re-queue before the watch event sees the record.
            mgr.nodes.store[node.name] = NodeView.from_obj(after)
        mgr.decisions.append((claim.name, plan.action))      # deque.append is thread-safe
        mgr.metrics.observe(claim.nodepool, plan.counters, plan.durations, plan.profile)
        node_ev = next((e for e in plan.events if e.kind == "Node"), None)
        claim_ev = next((e for e in plan.events if e.kind == "NodeClaim"), None)
        for ev in plan.events:      # the model labels' events on the Node too: related to the claim, not themselves
            mgr.events.emit(ev, claim_ev if ev.kind == "Node" else node_ev)
        mgr.log.info("decision", nodeclaim=claim.name, node=node.name if node else None, action=plan.action,
                     nodepool=claim.nodepool, reasons={c.type: c.reason for c in plan.conditions},
                     durations={k: round(v, 3) for k, v in plan.durations})
