"""Which changes make Karpenter replace nodes: its drift checks, on top of its exact hashes (karpenterhash.py).

A NodeClaim is drifted, in the order Karpenter checks (kubernetes-sigs/karpenter
``pkg/controllers/nodeclaim/disruption/drift.go`` ``isDrifted``, then aws/karpenter-provider-aws
``pkg/cloudprovider/drift.go`` ``isNodeClassDrifted``), only once it is Launched, as:

* ``NodePoolDrifted``: the NodePool's ``karpenter.sh/nodepool-hash`` differs from the one stamped on the NodeClaim
  at launch, when both carry the same ``-hash-version`` (a version change is never drift: the hash controllers
  re-stamp the NodeClaims instead);
* ``RequirementsDrifted``: the NodeClaim's labels no longer satisfy the pool's requirements
  (``nodepool.requirements_drifted``; requirements are outside the hash);
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

from . import karpenterhash
from .karpenterhash import DEFAULT_EC2NODECLASS_VERSION, HashInputError

NODEPOOL_DRIFTED = "NodePoolDrifted"
REQUIREMENTS_DRIFTED = "RequirementsDrifted"
NODECLASS_DRIFT = "NodeClassDrift"
AMI_DRIFT = "AMIDrift"


def ami_family(spec: dict) -> str | None:
    """EC2NodeClass ``AMIFamily()`` (``Custom`` when neither amiFamily nor an alias says), None for an alias
    Karpenter itself could not parse."""
    try:
        return karpenterhash.ami_family(spec)
    except HashInputError:
        return None


def static_hash(obj: dict, ca_bundle: str | None = None, version: str = DEFAULT_EC2NODECLASS_VERSION) -> str:
    """The value Karpenter stamps for a NodePool or EC2NodeClass; for an Auto Mode NodeClass, a digest of its
    whole spec."""
    if obj.get("kind") == "NodeClass":
        return hashlib.sha256(json.dumps(obj.get("spec") or {}, sort_keys=True).encode()).hexdigest()[:16]
    return karpenterhash.stamped_hash(obj, ca_bundle, version).value


def would_drift(before: dict, after: dict, ca_bundle: str | None = None,
                version: str = DEFAULT_EC2NODECLASS_VERSION) -> bool:
    """Whether changing ``before`` into ``after`` changes the hash Karpenter stamps, i.e. marks every live NodeClaim
    of the object drifted. Fields this model does not know count as hashed when they change."""
    if before.get("kind") == "NodeClass" or after.get("kind") == "NodeClass":
        return static_hash(before) != static_hash(after)
    a = karpenterhash.stamped_hash(before, ca_bundle, version)
    b = karpenterhash.stamped_hash(after, ca_bundle, version)
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


NODEPOOL_STAMP = (karpenterhash.NODEPOOL_HASH, karpenterhash.NODEPOOL_HASH_VERSION)
EC2NODECLASS_STAMP = (karpenterhash.EC2NODECLASS_HASH, karpenterhash.EC2NODECLASS_HASH_VERSION)


def _statically_drifted(expected: tuple[str, str] | None, claim: tuple[str, str] | None) -> bool:
    if expected is None or claim is None:
        return False                 # nothing stamped yet: Karpenter does not guess
    if expected[1] != claim[1]:
        return False                 # another hash version: re-stamped, never drift
    return expected[0] != claim[0]


def nodeclaim_drift(claim: dict, pool: dict, nodeclass: dict | None = None, *,
                    pool_stamp: tuple[str, str] | None = None, nodeclass_stamp: tuple[str, str] | None = None,
                    ) -> str | None:
    """Karpenter's drift reason for ``claim`` (None: not drifted). ``pool_stamp``/``nodeclass_stamp`` are the
    (hash, version) to compare with; by default the ones annotated on ``pool``/``nodeclass`` by Karpenter's hash
    controllers. Pass the hash of an object you are about to apply to ask what applying it would do."""
    from .nodepool import requirements_drifted

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
