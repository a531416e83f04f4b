"""Which changes to a NodeClass or NodePool make Karpenter replace nodes, computed from the fields it hashes.

Karpenter stamps a hash of these fields on each NodeClaim at launch and marks the NodeClaim Drifted (then
replaces it) when the live object hashes differently:

* EC2NodeClass (aws/karpenter-provider-aws ``pkg/apis/v1/ec2nodeclass.go``, ``Hash()``): all of ``spec``
  except the fields tagged ``hash:"ignore"`` — the subnet, security-group, capacity-reservation and AMI
  selector terms (they drift by their resolved values instead), ``ipPrefixCount`` and the literal
  ``amiFamily``, which is hashed as resolved from the alias instead. Options ``SlicesAsSets``,
  ``IgnoreZeroValue``, ``ZeroNil``: list order and empty values do not count.
* NodePool (kubernetes-sigs/karpenter ``pkg/apis/v1/nodepool.go``, ``Hash()``): all of ``spec.template``
  except ``spec.template.spec.requirements`` and ``.resources`` (``hash:"ignore"``).
* Auto Mode NodeClass: AWS documents no hash; every ``spec`` field is treated as hashed (the safe side).

Citations and the drift mechanics: ../shared/reference/karpenter-semantics.md, "Drift". The controller uses
``would_drift`` before it changes a live object; the tests use ``static_hash`` to assert "no drift".
"""

from __future__ import annotations

import hashlib
import json

EC2NODECLASS_IGNORED = ("subnetSelectorTerms", "securityGroupSelectorTerms", "capacityReservationSelectorTerms",
                        "amiSelectorTerms", "amiFamily", "ipPrefixCount")
NODEPOOL_TEMPLATE_SPEC_IGNORED = ("requirements", "resources")
_ALIAS_FAMILIES = {"al2": "AL2", "al2023": "AL2023", "bottlerocket": "Bottlerocket",
                   "windows2019": "Windows2019", "windows2022": "Windows2022", "windows2025": "Windows2025"}


def ami_family(spec: dict) -> str | None:
    """EC2NodeClass ``AMIFamily()``: spec.amiFamily, else the family of the alias term, else None."""
    if spec.get("amiFamily"):
        return spec["amiFamily"]
    for term in spec.get("amiSelectorTerms") or ():
        alias = term.get("alias") if isinstance(term, dict) else None
        if alias and "@" in alias:
            return _ALIAS_FAMILIES.get(alias.split("@", 1)[0])
    return None


def _canon(v):
    """IgnoreZeroValue + SlicesAsSets: drop empty values, order lists."""
    if isinstance(v, dict):
        out = {k: _canon(x) for k, x in v.items()}
        return {k: x for k, x in out.items() if x not in (None, "", 0, False, [], {})}
    if isinstance(v, list):
        items = [_canon(x) for x in v]
        return sorted(items, key=lambda x: json.dumps(x, sort_keys=True))
    return v


def hashed_fields(obj: dict) -> dict:
    """The part of ``obj`` that Karpenter's drift hash covers, for the kinds nodewarm touches."""
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    if kind == "EC2NodeClass":
        view = {k: v for k, v in spec.items() if k not in EC2NODECLASS_IGNORED}
        return {"spec": view, "amiFamily": ami_family(spec)}
    if kind == "NodePool":
        template = dict(spec.get("template") or {})
        tspec = {k: v for k, v in (template.get("spec") or {}).items() if k not in NODEPOOL_TEMPLATE_SPEC_IGNORED}
        return {"metadata": template.get("metadata") or {}, "spec": tspec}
    if kind == "NodeClass":
        return {"spec": spec}
    raise ValueError(f"no drift rule for kind {kind!r}")


def static_hash(obj: dict) -> str:
    return hashlib.sha256(json.dumps(_canon(hashed_fields(obj)), sort_keys=True).encode()).hexdigest()[:16]


def would_drift(before: dict, after: dict) -> bool:
    return static_hash(before) != static_hash(after)


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


def nodepools_using(nodeclass: dict, nodepools: list[dict]) -> list[str]:
    """Names of the NodePools whose nodeClassRef names this NodeClass (group, kind and name)."""
    group = nodeclass.get("apiVersion", "").split("/")[0]
    kind, name = nodeclass.get("kind"), nodeclass["metadata"]["name"]
    out = []
    for np in nodepools:
        ref = ((np.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeClassRef") or {}
        if ref.get("name") == name and ref.get("kind") == kind and ref.get("group", group) == group:
            out.append(np["metadata"]["name"])
    return sorted(out)
