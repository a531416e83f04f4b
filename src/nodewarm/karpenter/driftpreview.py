"""Which live NodeClaims a change to their NodePool or NodeClass would drift, and why (pure).

One answer for both askers: ``nodewarm render --diff`` (the objects render would apply, against the live cluster)
and the controller's WouldDrift guard (what injection or a profile's clean-up would write). Both pass the objects
as they would be *after* the write and the live objects and NodeClaims; nothing here reads the cluster.

How Karpenter decides, and how this follows it (kubernetes-sigs/karpenter
``pkg/controllers/nodeclaim/disruption/drift.go`` ``areStaticFieldsDrifted``, the provider's ``isNodeClassDrifted``):

* Static drift compares two *stamps*: the hash annotation Karpenter's hash controller keeps on the NodePool /
  EC2NodeClass with the one copied onto the NodeClaim at launch, and only when both hash-version annotations are
  present and equal (a new hash version re-stamps, it does not drift). A NodeClaim without the annotations never
  drifts statically. After a write the hash controller stamps the object with the hash of its new spec: for a
  NodePool that value is computed here exactly (``drifthash.nodepool_hash``) and compared with the
  NodeClaim's; for an EC2NodeClass, whose hash also covers the cluster CA bundle, a NodeClaim in step with the
  live object's stamp drifts exactly when the live and the new spec hash differently (``drift.would_drift``).
  One already out of step is drifted now, whatever we write.
* Requirement drift is dynamic: a NodeClaim whose labels the pool's requirements no longer admit is
  ``RequirementsDrifted`` (``drift.requirements_drifted``).
* A NodeClaim being deleted is not counted: it is going anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodewarm.api.names import NODEPOOL_LABEL

from . import drift, drifthash
from .apis import DEFAULT_EC2NODECLASS_VERSION, EC2NODECLASS_VERSIONS
from .drift import requirements_drifted
from .drifthash import EC2NODECLASS_HASH, EC2NODECLASS_HASH_VERSION, NODEPOOL_HASH, NODEPOOL_HASH_VERSION

_STAMPS = {"NodePool": (NODEPOOL_HASH, NODEPOOL_HASH_VERSION),
           "EC2NodeClass": (EC2NODECLASS_HASH, EC2NODECLASS_HASH_VERSION)}
# Karpenter's reason for each kind's static drift (NodeClass: Auto Mode's, which documents none, is treated alike).
_REASONS = {"NodePool": "NodePoolDrifted", "EC2NodeClass": "NodeClassDrift", "NodeClass": "NodeClassDrift"}

WOULD, ALREADY = "would", "already"


@dataclass(frozen=True)
class ClaimDrift:
    nodeclaim: str
    nodepool: str
    source: str                 # the object whose change it is: "NodePool/gpu-p5", "EC2NodeClass/gpu-p5"
    reason: str                 # Karpenter's name: NodePoolDrifted | NodeClassDrift | RequirementsDrifted
    when: str                   # WOULD (the change drifts it) | ALREADY (drifted before the change)
    why: str                    # what differs, for a person


@dataclass(frozen=True)
class Preview:
    drifts: tuple[ClaimDrift, ...]
    claims: dict[str, int]      # "Kind/name" -> its live NodeClaims, drifting or not

    def would(self) -> tuple[ClaimDrift, ...]:
        """The NodeClaims this change drifts (Karpenter replaces them within the pool's disruption budgets)."""
        return tuple(d for d in self.drifts if d.when == WOULD)

    def pools(self) -> list[str]:
        return sorted({d.nodepool for d in self.would()})

    def count(self) -> int:
        return len({d.nodeclaim for d in self.would()})


def _key(obj: dict) -> tuple[str, str]:
    return obj.get("kind", ""), obj["metadata"]["name"]


def _stamp(obj: dict, kind: str) -> tuple[str | None, str | None]:
    hash_key, version_key = _STAMPS.get(kind, (None, None))
    ann = (obj.get("metadata") or {}).get("annotations") or {}
    return (ann.get(hash_key), ann.get(version_key)) if hash_key else (None, None)


def _changed_fields(kind: str, live: dict, after: dict) -> str:
    """The spec paths that differ (under spec.template for a NodePool: what its hash covers), for a person."""
    def part(o: dict):
        spec = o.get("spec") or {}
        return ("spec.template", spec.get("template") or {}) if kind == "NodePool" else ("spec", spec)

    def walk(x, y, path):
        if isinstance(x, dict) and isinstance(y, dict):
            return [p for k in sorted(set(x) | set(y)) for p in walk(x.get(k), y.get(k), f"{path}.{k}")]
        return [] if x == y else [path]

    (root, a), (_, b) = part(live), part(after)
    fields = walk(a, b, root)
    return ", ".join(fields[:4]) + (f" (+{len(fields) - 4} more)" if len(fields) > 4 else "")


def static_drift(kind: str, live: dict, after: dict, claim: dict) -> tuple[str, str] | None:
    """(WOULD|ALREADY, why) for one NodeClaim of ``live`` once it is ``after``, or None: no static drift."""
    claim_hash, claim_version = _stamp(claim, kind)
    live_hash, live_version = _stamp(live, kind)
    if kind in _STAMPS:
        if claim_hash is None or claim_version is None:
            return None                 # Karpenter skips NodeClaims without the annotations
        if live_version is not None and live_version != claim_version:
            return None                 # a new hash version: Karpenter re-stamps instead of drifting
        if kind == "NodePool":
            # Exact: the value Karpenter will stamp on the pool once it is ``after`` (no cluster input in it).
            expected = drifthash.nodepool_hash(after)
            if expected.version != claim_version:
                return None
            if expected.value == claim_hash:
                return None             # the change brings the pool back to what this NodeClaim was launched from
        if live_hash is not None and live_hash != claim_hash:
            return ALREADY, f"its {kind} hash {claim_hash} is no longer the {kind}'s {live_hash}"
        if kind == "NodePool":
            return WOULD, f"{kind} {live['metadata']['name']}: changes {_changed_fields(kind, live, after)}"
    # The EC2NodeClass hash takes the cluster's CA bundle as an input Karpenter reads itself: judged relative to the
    # live object's own stamp (same CA on both sides), at the hash version it is stamped with (v5 hashes the kubelet
    # as a struct, v6 as a JSON string: reordering a list drifts only at v6); Auto Mode's NodeClass by its spec.
    version = live_version if live_version in EC2NODECLASS_VERSIONS else DEFAULT_EC2NODECLASS_VERSION
    if drift.would_drift(live, after, version=version):
        return WOULD, f"{kind} {live['metadata']['name']}: changes {_changed_fields(kind, live, after)}"
    return None


def preview(after: list[dict], live: list[dict], claims: list[dict]) -> Preview:
    """The drift of every live NodeClaim belonging to an object in ``after`` (NodePools, EC2NodeClasses, Auto Mode
    NodeClasses, each as it will be once applied). ``live``: the objects as they are now (a missing one: nothing
    of it can drift); ``claims``: the live NodeClaims."""
    now = {_key(o): o for o in live}
    changed = {_key(o): o for o in after if _key(o) in now}
    out: list[ClaimDrift] = []
    counted = {f"{kind}/{name}": 0 for kind, name in changed}
    for c in claims:
        md = c["metadata"]
        if md.get("deletionTimestamp"):
            continue
        labels = md.get("labels") or {}
        pool = labels.get(NODEPOOL_LABEL, "")
        ref = (c.get("spec") or {}).get("nodeClassRef") or {}
        mine = [k for k in (("NodePool", pool), (ref.get("kind", ""), ref.get("name", ""))) if k in changed]
        for kind, name in mine:
            counted[f"{kind}/{name}"] += 1
            found = static_drift(kind, now[(kind, name)], changed[(kind, name)], c)
            if found:
                out.append(ClaimDrift(md["name"], pool, f"{kind}/{name}", _REASONS[kind], *found))
        if ("NodePool", pool) in mine:
            before, later = requirements_drifted(now[("NodePool", pool)], labels), requirements_drifted(
                changed[("NodePool", pool)], labels)
            if later:
                out.append(ClaimDrift(md["name"], pool, f"NodePool/{pool}", "RequirementsDrifted",
                                      ALREADY if before else WOULD,
                                      f"NodePool {pool}: its labels no longer meet the pool's requirements"))
    return Preview(tuple(out), counted)


def objects_after(live: dict | None, body: dict) -> dict | None:
    """A live object once a server-side apply of ``body`` lands (maps merge; lists, atomic here, are replaced)."""
    return merged(live, body) if live is not None else None


def merged(current: dict, body: dict) -> dict:
    """``current`` with the fields of a server-side-apply ``body`` laid over it (maps merge, everything else
    — including lists, which are atomic in these CRDs' schemas for the fields nodewarm owns — is replaced)."""
    def lay(c, b):
        if isinstance(c, dict) and isinstance(b, dict):
            out = dict(c)
            for k, v in b.items():
                out[k] = lay(c.get(k), v)
            return out
        return b

    return lay(current, body)
