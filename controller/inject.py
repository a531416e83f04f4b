"""Inject phase: make a profile's NodeClass and NodePool hold nodewarm's fields, without ever starting a drift
storm or fighting another field manager.

The desired fields come from ``nodewarm.nodeclasses.inject`` (pure, shared with ``render``). This shell
reads the live objects and, in order:

1. refuses objects nodewarm must not touch (``check_live``: wrong nodeClassRef, AMI family, taint key, non-NVMe
   instance types) — Injected=False with that reason;
2. compares; nothing differs -> UpToDate, and nothing is sent (a no-op must provably write nothing);
3. ``spec.injection.mode: verify`` stops here and reports the differences;
4. counts the NodeClaims the change would drift (drift.py: the fields Karpenter hashes; every NodePool that
   references the class) and refuses with ``WouldDrift`` unless ``spec.injection.onLive: drift``;
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
from nodewarm.errors import NodewarmError
from nodewarm.nodeclasses import drift
from nodewarm.nodeclasses import inject as desired
from nodewarm.nodeclasses.labels import NODEPOOL_LABEL
from nodewarm.profile import WarmProfile

from .kube import AUTOMODE_NODECLASSES, EC2NODECLASSES, NODECLAIMS, NODEPOOLS, Kube, Resource
from .model import Condition

_MANAGER = re.compile(r'conflict with "([^"]+)"')


@dataclass(frozen=True)
class TargetResult:
    kind: str
    name: str
    changed_fields: tuple[str, ...]     # what differs (what was, or would be, applied)
    applied: bool
    resource_version: str = ""


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

    def drift_count(self, nc_res: Resource, nodeclass: dict, pool_name: str, targets: list[str]) -> tuple[int, list[str]]:
        """How many live NodeClaims the change to ``targets`` (kinds) would drift, and in which NodePools."""
        pools = {pool_name} if "NodePool" in targets else set()
        if nc_res.kind in targets:
            pools |= set(drift.nodepools_using(nodeclass, self.kube.list(NODEPOOLS).get("items", [])))
        claims = [c for c in self.kube.list(NODECLAIMS).get("items", [])
                  if (c["metadata"].get("labels") or {}).get(NODEPOOL_LABEL) in pools
                  and not c["metadata"].get("deletionTimestamp")]
        return len(claims), sorted(pools)

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
        drifting = [res.kind for res, current, body, _ in pending
                    if drift.would_drift(current, drift.merged(current, body))]
        if drifting:
            count, pools = self.drift_count(nc_res, nodeclass, p.nodes.node_pool, drifting)
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

    def release(self, pool_name: str, taint_key: str) -> TargetResult | None:
        """A deleted profile: take its startup taint out of the NodePool (new nodes would stay tainted until
        expireAfter otherwise). Returns what was done, None when there was nothing to do."""
        current = self._get(NODEPOOLS, pool_name)
        body = desired.without_taint(pool_name, current, taint_key) if current else None
        if body is None:
            return None
        if self.dry_run:
            return TargetResult("NodePool", pool_name, ("spec.template.spec.startupTaints",), False)
        after = self.kube.apply(NODEPOOLS, body, force=False)
        return TargetResult("NodePool", pool_name, ("spec.template.spec.startupTaints",), True,
                            after["metadata"]["resourceVersion"])
