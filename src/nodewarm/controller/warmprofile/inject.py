"""Inject phase -> condition Injected: make a profile's NodeClass and NodePool hold nodewarm's fields, without ever
starting a drift storm or fighting another field manager.

Before anything is written, ``refused`` turns away a profile the loader rejects (InvalidProfile) and one naming a
NodePool or NodeClass an older profile holds (NodePoolTaken, NodeClassTaken): each belongs to the first profile
that names it. ``reconcile`` is the phase; ``Injector`` does the I/O, which the clean-up (cleanup.py) uses too.

The desired fields come from ``nodewarm.nodeclasses.inject`` (pure, shared with ``render``). This shell
reads the live objects and, in order:

1. refuses objects nodewarm must not touch (``check_live``: wrong nodeClassRef, AMI family, taint key, non-NVMe
   instance types) — Injected=False with that reason;
2. compares; nothing differs -> UpToDate, and nothing is sent (a no-op must provably write nothing);
3. ``spec.injection.mode: verify`` stops here and reports the differences;
4. counts the NodeClaims the change would drift (``karpenter.driftpreview``, the answer `render --diff` gives:
   Karpenter's hash stamps and requirement drift, every NodeClaim of the class whatever its pool) and refuses
   with ``WouldDrift`` unless ``spec.injection.onLive: drift``;
5. applies with server-side apply *without* force: a field another manager owns (Argo CD, Flux) is reported
   as ``Conflict`` naming that manager, never taken.

A missing NodeClass/NodePool is reported, never created: an SSA with only our fields would create an object
without the user's required fields (role, subnets...). ``render`` creates them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

from nodewarm import instancetypes, logs, profile
from nodewarm.api.errors import NodewarmError
from nodewarm.api.views import Condition
from nodewarm.karpenter import driftpreview
from nodewarm.nodeclasses import inject as desired
from nodewarm.api.warmprofile import WarmProfile

from ..events import EventSpec
from ..kube import AUTOMODE_NODECLASSES, EC2NODECLASSES, NODECLAIMS, NODEPOOLS, Kube, Resource
from ..profiles import ProfileView
from ..shared import Manager
from .conditions import Step, warning

_MANAGER = re.compile(r'conflict with "([^"]+)"')


@dataclass(frozen=True)
class TargetResult:
    kind: str
    name: str
    changed_fields: tuple[str, ...]     # what differs (what was, or would be, applied)
    applied: bool
    resource_version: str = ""


@dataclass(frozen=True)
class Release:
    """What a deleted profile's clean-up did to one startup taint of its NodePool."""

    pool: str
    taint_key: str
    done: bool                  # the taint is out of the pool (removed now, or it was not there)
    applied: bool = False       # removed by this call
    drifting: int = 0           # live NodeClaims the removal drifts (drifted, if applied; else why it was held)


@dataclass(frozen=True)
class InjectResult:
    profile: str
    condition: Condition
    targets: tuple[TargetResult, ...] = ()
    warning: bool = False               # the condition deserves a Warning event (refused, would drift, conflict)


def nodeclass_resource(p: WarmProfile) -> Resource:
    return AUTOMODE_NODECLASSES if p.nodes.mode == "automode" else EC2NODECLASSES


def conflict_managers(e: ApiException) -> tuple[list[str], list[str]]:
    """(managers, fields) from a server-side-apply 409."""
    try:
        causes = (json.loads(e.body or "{}").get("details") or {}).get("causes") or []
    except ValueError:
        causes = []
    managers = sorted({m for c in causes for m in _MANAGER.findall(c.get("message", ""))})
    fields = sorted({c.get("field", "") for c in causes if c.get("field")})
    if not managers:
        managers = sorted(set(_MANAGER.findall(str(e.body or ""))))
    return managers, fields


def _injected(p: WarmProfile, where: str, advice: str | None, targets: list[TargetResult]) -> InjectResult:
    """Injected=True; a pool whose own disruption policy discards warm nodes says so (reason ConsolidatesWarmNodes,
    a Warning event) while the fields are in place all the same."""
    if advice:
        return InjectResult(p.name, Condition("Injected", "True", "ConsolidatesWarmNodes",
                                              f"{where} hold nodewarm's fields; but {advice}"), tuple(targets), warning=True)
    return InjectResult(p.name, Condition("Injected", "True", "UpToDate", f"{where} hold nodewarm's fields"),
                        tuple(targets))


class Injector:
    def __init__(self, kube: Kube, dry_run: bool = False, instance_source: str = "offline"):
        self.kube, self.dry_run, self.instance_source = kube, dry_run, instance_source
        self.log = logs.get("controller.inject")

    def _get(self, res: Resource, name: str) -> dict | None:
        try:
            return self.kube.get(res, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _live_objects(self, targets: list[tuple[Resource, dict]]) -> tuple[list[dict], list[dict]]:
        """(the live objects, with their kind, and every NodeClaim): what ``driftpreview`` judges a write against."""
        live = [{"kind": res.kind, **obj} for res, obj in targets if obj is not None]
        return live, self.kube.list(NODECLAIMS).get("items", [])

    def drift_preview(self, targets: list[tuple[Resource, dict, dict]]) -> driftpreview.Preview:
        """What applying each ``(resource, live object, SSA body)`` would drift: the one answer `render --diff`
        also gives (nodewarm/karpenter/driftpreview.py), from a live read of the NodeClaims."""
        live, claims = self._live_objects([(res, cur) for res, cur, _ in targets])
        after = [{"kind": res.kind, **driftpreview.objects_after(cur, body)} for res, cur, body in targets]
        return driftpreview.preview(after, live, claims)

    def reconcile(self, p: WarmProfile, previous_taint_key: str | None = None) -> InjectResult:
        nc_res = nodeclass_resource(p)
        nodeclass = self._get(nc_res, p.nodes.node_class)
        pool = self._get(NODEPOOLS, p.nodes.node_pool)
        missing = [f"{r.kind} {n}" for r, n, o in ((nc_res, p.nodes.node_class, nodeclass),
                                                   (NODEPOOLS, p.nodes.node_pool, pool)) if o is None]
        if missing:
            return InjectResult(p.name, Condition("Injected", "False", "TargetNotFound",
                                                  f"{' and '.join(missing)} not found; create them with "
                                                  "`nodewarm render -f profile.yaml | kubectl apply --server-side -f -`"),
                                warning=True)
        lookup = lambda names: instancetypes.lookup(list(names), self.instance_source)  # noqa: E731
        try:
            types = lookup(p.nodes.instance_types)
            profile.check(p, types)     # the CRD's schema cannot check types, TP, NVMe sizes
            desired.check_live(p, nodeclass, pool, lookup)
            advice = desired.disruption_advice(p, pool)     # the pool's own policy: warned about, never changed
            plan = [(nc_res, nodeclass, desired.desired_nodeclass_fields(p, nodeclass, types)),
                    (NODEPOOLS, pool, desired.desired_nodepool_fields(p, pool, previous_taint_key))]
        except NodewarmError as e:
            return InjectResult(p.name, Condition("Injected", "False", e.reason, str(e)), warning=True)

        diffs = [(res, current, body, tuple(desired.differs(body, current))) for res, current, body in plan]
        pending = [d for d in diffs if d[3]]
        results = [TargetResult(res.kind, body["metadata"]["name"], diff, False, current["metadata"]["resourceVersion"])
                   for res, current, body, diff in diffs]
        where = f"{nc_res.kind} {p.nodes.node_class} and NodePool {p.nodes.node_pool}"
        if not pending:
            return _injected(p, where, advice, results)
        said = "; ".join(f"{res.kind}/{body['metadata']['name']}: {', '.join(diff)}" for res, _, body, diff in pending)
        if p.injection.mode == "verify":
            return InjectResult(p.name, Condition("Injected", "False", "Differs",
                                                  f"spec.injection.mode is verify; the live objects differ from "
                                                  f"`nodewarm render` in {said}"), tuple(results), warning=True)
        if self.dry_run:
            return InjectResult(p.name, Condition("Injected", "False", "AuditOnly", f"audit mode; would apply {said}"),
                                tuple(results))
        pv = self.drift_preview([(res, current, body) for res, current, body, _ in pending])
        count, pools = pv.count(), pv.pools()
        if count and p.injection.on_live != "drift":
            return InjectResult(p.name, Condition(
                "Injected", "False", "WouldDrift",
                f"changing {said} would drift {count} live NodeClaim(s) of NodePool(s) {', '.join(pools)}: "
                "Karpenter would replace those nodes (weights pulled again, caches cold). Render the objects "
                "with `nodewarm render` before nodes exist, or set spec.injection.onLive: drift to allow it"),
                tuple(results), warning=True)
        if count:
            self.log.warning("inject.drifting", profile=p.name, nodeclaims=count, nodepools=pools)
        applied = []
        for res, current, body, diff in diffs:
            if not diff:
                applied.append(TargetResult(res.kind, body["metadata"]["name"], diff, False,
                                            current["metadata"]["resourceVersion"]))
                continue
            try:
                after = self.kube.apply(res, body, force=False)
            except ApiException as e:
                if e.status != 409:
                    raise
                managers, fields = conflict_managers(e)
                return InjectResult(p.name, Condition(
                    "Injected", "False", "Conflict",
                    f"{res.kind} {body['metadata']['name']}: {', '.join(fields) or ', '.join(diff)} "
                    f"owned by field manager {', '.join(managers) or '(unknown)'}; nodewarm never takes a field "
                    "another manager owns: add nodewarm's values to that manager's copy (`nodewarm render` shows "
                    "them) or drop the field from it"), tuple(applied), warning=True)
            self.log.info("inject.applied", profile=p.name, kind=res.kind, name=body["metadata"]["name"],
                          fields=list(diff), rv=after["metadata"]["resourceVersion"])
            applied.append(TargetResult(res.kind, body["metadata"]["name"], diff, True,
                                        after["metadata"]["resourceVersion"]))
        return _injected(p, where, advice, applied)

    def release(self, pool_name: str, taint_key: str, on_live: str = "refuse") -> Release:
        """A deleted profile: take its startup taint out of the NodePool, unless that would drift live NodeClaims
        and ``on_live`` (the profile's spec.injection.onLive) is not ``drift``: startupTaints is hashed, so removing
        it replaces every node of the pool exactly as adding it would. The same guard as injection decides."""
        current = self._get(NODEPOOLS, pool_name)
        body = desired.without_taint(pool_name, current, taint_key) if current else None
        if body is None:
            return Release(pool_name, taint_key, done=True)
        pv = self.drift_preview([(NODEPOOLS, current, body)])
        if pv.count() and on_live != "drift":
            return Release(pool_name, taint_key, done=False, drifting=pv.count())
        if self.dry_run:
            return Release(pool_name, taint_key, done=False, drifting=pv.count())
        after = self.kube.apply(NODEPOOLS, body, force=False)
        self.log.info("release.applied", nodepool=pool_name, taint=taint_key, drifted=pv.count(),
                      rv=after["metadata"]["resourceVersion"])
        return Release(pool_name, taint_key, done=True, applied=True, drifting=pv.count())


def _owner_conflict(p: WarmProfile, live: list[WarmProfile]) -> Condition | None:
    """A NodePool or NodeClass belongs to the first profile that names it; a second one is refused."""
    for other in live:
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


def refused(view: ProfileView | None, p: WarmProfile | None, live: list[WarmProfile]) -> Step | None:
    """The Step of a profile that is not injected at all (no finalizer, no later phase), or None."""
    if p is None:
        return Step(Condition("Injected", "False", "InvalidProfile", view.error)) if view and view.error else Step()
    taken = _owner_conflict(p, live)
    return Step(taken, events=warning(view, taken)) if taken is not None else None


def reconcile(mgr: Manager, injector: Injector, view: ProfileView | None,
              p: WarmProfile) -> tuple[Step, InjectResult]:
    """The phase: what differs applied (or why not); a metric per target, an event per apply, a Warning event for a
    refusal; on Injected=True, status.injected says what this profile now holds. The result is what `--once` shows."""
    result = injector.reconcile(p, (view.injected.get("taintKey") if view else None))
    events: list[EventSpec] = []
    for t in result.targets:
        if t.applied:
            mgr.metrics.injections.labels(t.kind, "applied").inc()
            events.append(EventSpec(t.kind, t.name, "", "NodewarmInjected",
                                    f"WarmProfile {p.name} applied {', '.join(t.changed_fields)}"))
        elif t.changed_fields:
            mgr.metrics.injections.labels(t.kind, "audit").inc()
        else:
            mgr.metrics.injections.labels(t.kind, "uptodate").inc()
    if result.warning:
        mgr.metrics.injections.labels("WarmProfile", result.condition.reason).inc()
        events += warning(view, result.condition)
    mgr.log.info("inject", profile=p.name, reason=result.condition.reason, message=result.condition.message)
    injected = None
    if result.condition.status == "True":
        # A renamed taintKey: nodes registered with the old key are still gated by it (nodewarm.api.lifecycle
        # gating_taint, which the NodeClaim reconciler asks).
        old = view.injected if view else {}
        retired = set(old.get("retiredTaintKeys") or ()) | ({old["taintKey"]} if old.get("taintKey") else set())
        injected = {"nodePool": p.nodes.node_pool, "nodeClass": p.nodes.node_class,
                    "taintKey": p.readiness.taint_key,
                    "retiredTaintKeys": sorted(retired - {p.readiness.taint_key})}
    return Step(result.condition, injected, tuple(events)), result
