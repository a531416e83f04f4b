"""Inject phase: make each bound NodePool's NodeClass and startup taint right, converging once.

The desired fields come from ``nodewarm.nodeclasses.inject`` (the same pure functions ``render`` uses,
so what render shows is what the controller converges to). The shell here compares them with the
live object and applies with server-side apply (field manager ``nodewarm``, ``force`` only over the
fields in the body) *only if something differs*. Why compare first instead of applying blindly:
changing an EC2NodeClass's userData or instanceStorePolicy drifts every NodeClaim of the class, so a
no-op must provably send nothing; and audit mode needs the list of changes without writing.

A missing NodeClass/NodePool is reported, never created: an SSA with only our fields would create an
object without the user's required fields (role, subnets...). ``render`` creates them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

from nodewarm import instancetypes, logs, profile
from nodewarm.errors import NodewarmError
from nodewarm.nodeclasses import inject as desired
from nodewarm.profile import WarmProfile

from .kube import AUTOMODE_NODECLASSES, EC2NODECLASSES, NODEPOOLS, Kube, Resource
from .model import Condition


@dataclass(frozen=True)
class TargetResult:
    kind: str
    name: str
    changed_fields: tuple[str, ...]     # what differs (what was, or in audit mode would be, applied)
    applied: bool
    resource_version: str = ""


@dataclass(frozen=True)
class InjectResult:
    profile: str
    condition: Condition
    targets: tuple[TargetResult, ...] = ()


def nodeclass_resource(p: WarmProfile) -> Resource:
    return AUTOMODE_NODECLASSES if p.nodes.mode == "automode" else EC2NODECLASSES


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

    def reconcile(self, p: WarmProfile) -> InjectResult:
        nc_res = nodeclass_resource(p)
        nodeclass = self._get(nc_res, p.nodes.node_class)
        nodepool = self._get(NODEPOOLS, p.nodes.node_pool)
        missing = [f"{r.kind} {n}" for r, n, o in ((nc_res, p.nodes.node_class, nodeclass),
                                                   (NODEPOOLS, p.nodes.node_pool, nodepool)) if o is None]
        if missing:
            return InjectResult(p.name, Condition("Injected", "False", "TargetNotFound",
                                                  f"{' and '.join(missing)} not found; create them with "
                                                  "`nodewarm render -f profile.yaml | kubectl apply --server-side -f -`"))
        try:
            types = instancetypes.lookup(list(p.nodes.instance_types), self.instance_source)
            profile.check(p, types)     # the CRD's schema cannot check types, TP, NVMe sizes
            plan = [(nc_res, nodeclass, desired.desired_nodeclass_fields(p, nodeclass, types)),
                    (NODEPOOLS, nodepool, desired.desired_nodepool_fields(p, nodepool))]
        except NodewarmError as e:
            return InjectResult(p.name, Condition("Injected", "False", e.reason, str(e)))
        results = []
        for res, current, body in plan:
            diff = tuple(desired.differs(body, current))
            name = body["metadata"]["name"]
            if not diff or self.dry_run:
                results.append(TargetResult(res.kind, name, diff, False, current["metadata"]["resourceVersion"]))
                if diff:
                    self.log.info("inject.would_change", profile=p.name, kind=res.kind, name=name, fields=list(diff))
                continue
            after = self.kube.apply(res, body)
            self.log.info("inject.applied", profile=p.name, kind=res.kind, name=name, fields=list(diff),
                          rv=after["metadata"]["resourceVersion"])
            results.append(TargetResult(res.kind, name, diff, True, after["metadata"]["resourceVersion"]))
        pending = [f"{t.kind}/{t.name}: {', '.join(t.changed_fields)}" for t in results if t.changed_fields]
        if self.dry_run and pending:
            cond = Condition("Injected", "False", "AuditOnly", "audit mode; would apply " + "; ".join(pending))
        else:
            # Same condition whether we just applied or found it done: the status is written once, and
            # what was applied is told by the event and the log instead.
            cond = Condition("Injected", "True", "UpToDate",
                             f"{nc_res.kind} {p.nodes.node_class} and NodePool {p.nodes.node_pool} already hold "
                             "nodewarm's fields")
        return InjectResult(p.name, cond, tuple(results))
