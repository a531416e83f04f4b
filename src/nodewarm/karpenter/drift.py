"""Which changes make Karpenter replace nodes: its drift checks, on top of its exact hashes (``drifthash``).

A NodeClaim is drifted, in the order Karpenter checks (kubernetes-sigs/karpenter
``pkg/controllers/nodeclaim/disruption/drift.go`` ``isDrifted``, then aws/karpenter-provider-aws
``pkg/cloudprovider/drift.go`` ``isNodeClassDrifted``), only once it is Launched, as:

* ``NodePoolDrifted``: the NodePool's ``karpenter.sh/nodepool-hash`` differs from the one stamped on the NodeClaim
  at launch, when both carry the same ``-hash-version`` (a version change is never drift: the hash controllers
  re-stamp the NodeClaims instead);
* ``RequirementsDrifted``: the NodeClaim's labels no longer satisfy the pool's requirements
  (``requirements_drifted``; requirements are outside the hash);
* ``NodeClassDrift``: the same comparison for ``karpenter.k8s.aws/ec2nodeclass-hash``;
* ``AMIDrift``: the NodeClaim's ``status.imageID`` is not among the class's resolved ``status.amis`` (every
  release of an ``@latest`` alias replaces every node).

``would_drift(before, after)`` answers "does this edit change a hash", which is what the controller asks before it
writes a live object. The Auto Mode NodeClass has no documented hash; every change of its spec counts (the safe
side). Citations: docs/karpenter.md, "Drift".
"""

from __future__ import annotations

import hashlib
import json
import re

from . import drifthash
from .apis import DEFAULT_EC2NODECLASS_VERSION

NODEPOOL_DRIFTED = "NodePoolDrifted"
REQUIREMENTS_DRIFTED = "RequirementsDrifted"
NODECLASS_DRIFT = "NodeClassDrift"
AMI_DRIFT = "AMIDrift"


def static_hash(obj: dict, ca_bundle: str | None = None, version: str = DEFAULT_EC2NODECLASS_VERSION) -> str:
    """The value Karpenter stamps for a NodePool or EC2NodeClass; for an Auto Mode NodeClass, a digest of its
    whole spec."""
    if obj.get("kind") == "NodeClass":
        return hashlib.sha256(json.dumps(obj.get("spec") or {}, sort_keys=True).encode()).hexdigest()[:16]
    return drifthash.stamped_hash(obj, ca_bundle, version).value


def would_drift(before: dict, after: dict, ca_bundle: str | None = None,
                version: str = DEFAULT_EC2NODECLASS_VERSION) -> bool:
    """Whether changing ``before`` into ``after`` changes the hash Karpenter stamps, i.e. marks every live NodeClaim
    of the object drifted. Fields this model does not know count as hashed when they change."""
    if before.get("kind") == "NodeClass" or after.get("kind") == "NodeClass":
        return static_hash(before) != static_hash(after)
    a = drifthash.stamped_hash(before, ca_bundle, version)
    b = drifthash.stamped_hash(after, ca_bundle, version)
    if a.value != b.value:
        return True
    if a.unknown_fields or b.unknown_fields:
        # A field newer than this model: it may be hashed, so any change under the hashed root counts.
        return _hashed_root(before) != _hashed_root(after)
    return False


def _hashed_root(obj: dict):
    spec = obj.get("spec") or {}
    return spec.get("template") if obj.get("kind") == "NodePool" else spec


def stamp_of(obj: dict, hash_annotation: str, version_annotation: str) -> tuple[str, str] | None:
    """(hash, version) as annotated on ``obj``; None when either annotation is missing."""
    ann = (obj.get("metadata") or {}).get("annotations") or {}
    if hash_annotation not in ann or version_annotation not in ann:
        return None
    return ann[hash_annotation], ann[version_annotation]


NODEPOOL_STAMP = (drifthash.NODEPOOL_HASH, drifthash.NODEPOOL_HASH_VERSION)
EC2NODECLASS_STAMP = (drifthash.EC2NODECLASS_HASH, drifthash.EC2NODECLASS_HASH_VERSION)


def _statically_drifted(expected: tuple[str, str] | None, claim: tuple[str, str] | None) -> bool:
    if expected is None or claim is None:
        return False                 # nothing stamped yet: Karpenter does not guess
    if expected[1] != claim[1]:
        return False                 # another hash version: re-stamped, never drift
    return expected[0] != claim[0]


_GO_INT = re.compile(r"[+-]?[0-9]+")


def _label_matches(req: dict, labels: dict[str, str]) -> bool:
    """One NodePool requirement against a NodeClaim's labels, as Karpenter's ``Requirements.Compatible`` sees it
    (``pkg/scheduling/requirements.go``): a key the NodeClaim lacks fails every operator but NotIn/DoesNotExist."""
    key, op, values = req.get("key"), req.get("operator"), [str(x) for x in req.get("values") or ()]
    if key not in labels:
        return op in ("NotIn", "DoesNotExist")
    value = labels[key]
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return True
    if op == "DoesNotExist":
        return False
    if op in ("Gt", "Lt", "Gte", "Lte"):
        # Gte/Lte since v1.9.0 (``pkg/scheduling/requirement.go``: Gt N is kept as Gte N+1, Lt N as Lte N-1);
        # a value that is not an integer (strconv.Atoi) is outside every bound.
        if not values or not _GO_INT.fullmatch(value) or not _GO_INT.fullmatch(values[0]):
            return False
        n, bound = int(value), int(values[0])
        return {"Gt": n > bound, "Lt": n < bound, "Gte": n >= bound, "Lte": n <= bound}[op]
    return False


def requirements_drifted(pool: dict, nodeclaim_labels: dict[str, str]) -> bool:
    """Whether a live NodeClaim with these labels is RequirementsDrifted (replaced) under ``pool``'s requirements:
    the dynamic drift check, which ``would_drift`` (static hash only) does not cover."""
    reqs = (((pool.get("spec") or {}).get("template") or {}).get("spec") or {}).get("requirements") or ()
    return not all(_label_matches(r, nodeclaim_labels) for r in reqs)


def nodeclaim_drift(claim: dict, pool: dict, nodeclass: dict | None = None, *,
                    pool_stamp: tuple[str, str] | None = None, nodeclass_stamp: tuple[str, str] | None = None,
                    ) -> str | None:
    """Karpenter's drift reason for ``claim`` (None: not drifted). ``pool_stamp``/``nodeclass_stamp`` are the
    (hash, version) to compare with; by default the ones annotated on ``pool``/``nodeclass`` by Karpenter's hash
    controllers. Pass the hash of an object you are about to apply to ask what applying it would do."""
    conds = {c.get("type"): c.get("status") for c in (claim.get("status") or {}).get("conditions") or ()}
    if conds.get("Launched") != "True":
        return None
    if _statically_drifted(pool_stamp or stamp_of(pool, *NODEPOOL_STAMP), stamp_of(claim, *NODEPOOL_STAMP)):
        return NODEPOOL_DRIFTED
    if requirements_drifted(pool, (claim.get("metadata") or {}).get("labels") or {}):
        return REQUIREMENTS_DRIFTED
    if nodeclass is None or nodeclass.get("kind") != "EC2NodeClass":
        return None
    if _statically_drifted(nodeclass_stamp or stamp_of(nodeclass, *EC2NODECLASS_STAMP),
                           stamp_of(claim, *EC2NODECLASS_STAMP)):
        return NODECLASS_DRIFT
    amis = {a.get("id") for a in (nodeclass.get("status") or {}).get("amis") or ()}
    image = (claim.get("status") or {}).get("imageID")
    if amis and image and image not in amis:
        return AMI_DRIFT
    return None
