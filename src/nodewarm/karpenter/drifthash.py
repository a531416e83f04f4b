"""Karpenter's drift hashes, bit for bit: the decimal uint64 it stamps as ``karpenter.sh/nodepool-hash`` and
``karpenter.k8s.aws/ec2nodeclass-hash``, and copies onto each NodeClaim it launches.

Both are hashstructure's walk (``hashstructure``) over Karpenter's Go structs (``apis``), decoded from the object's
JSON after the CRD defaults the API server applies (``gojson``):

* ``NodePool.Hash()`` (kubernetes-sigs/karpenter ``pkg/apis/v1/nodepool.go``, version ``v3`` at v1.14.1 and main):
  ``spec.template`` as a ``NodeClaimTemplate``; ``requirements`` is ``hash:"ignore"`` (``nodeclaim.go``).
* ``EC2NodeClass.Hash(caBundle)`` (aws/karpenter-provider-aws ``pkg/apis/v1/ec2nodeclass.go``): the list
  ``[spec, AMIFamily(), caBundle]`` at ``v5`` (v1.14.1), plus ``spec.kubelet.String()`` at ``v6`` (main), where
  ``spec.kubelet`` became an open map tagged ``hash:"ignore"``.

Go's zero value is what decides drift on the edges: a nil pointer, slice or map is zero, but a pointer to ``false``
or ``""`` and an empty list or map are not (``detailedMonitoring: false`` differs from absent, ``startupTaints: []``
from absent). Durations are nanoseconds (``720h`` equals ``43200m``). Verified against upstream's static values in
``pkg/apis/v1/ec2nodeclass_hash_test.go`` (tests/karpenter/test_drifthash.py).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from .apis import (
    DEFAULT_EC2NODECLASS_VERSION, EC2NODECLASS_SPEC, EC2NODECLASS_VERSIONS, NODECLAIM_TEMPLATE, ami_family,
    kubelet_string,
)
from .gojson import decode
from .gotypes import STRING, HashInputError
from .hashstructure import visit, visit_any_list

NODEPOOL_HASH = "karpenter.sh/nodepool-hash"
NODEPOOL_HASH_VERSION = "karpenter.sh/nodepool-hash-version"
EC2NODECLASS_HASH = "karpenter.k8s.aws/ec2nodeclass-hash"
EC2NODECLASS_HASH_VERSION = "karpenter.k8s.aws/ec2nodeclass-hash-version"

NODEPOOL_VERSION = "v3"            # NodePoolHashVersion, v1.14.1 and main


@dataclass(frozen=True)
class StampedHash:
    """What Karpenter's hash controller writes on the object (and copies onto each NodeClaim at launch)."""
    kind: str
    name: str
    version: str
    value: str                    # decimal uint64, as fmt.Sprint writes it
    hash_annotation: str
    version_annotation: str
    unknown_fields: tuple[str, ...] = ()   # JSON fields this model does not know: the value may not be exact


def _check_version(version: str) -> str:
    if version not in EC2NODECLASS_VERSIONS:
        raise HashInputError(f"hash version {version!r}: Karpenter's EC2NodeClass hash versions here are "
                             f"{', '.join(EC2NODECLASS_VERSIONS)} (v5 = v1.14.x, v6 = main)")
    return version


def encode_ca_bundle(data: bytes) -> str:
    """The CA string Karpenter hashes: base64 of the PEM it trusts for the API server (operator.GetCABundle), or a
    --cluster-ca-bundle / CLUSTER_CA_BUNDLE value verbatim (EKS's certificateAuthority.data is that base64)."""
    text = data.strip()
    if text.startswith(b"-----BEGIN"):
        return base64.b64encode(data).decode()
    return text.decode()


def nodepool_hash(nodepool: dict) -> StampedHash:
    """``NodePool.Hash()`` of a NodePool object (a dict as the API server returns it, or as a user writes it)."""
    unknown: list[str] = []
    template = ((nodepool.get("spec") or {}).get("template"))
    v = decode(NODECLAIM_TEMPLATE, template or {}, "spec.template", unknown)
    return StampedHash("NodePool", _name(nodepool), NODEPOOL_VERSION, str(visit(NODECLAIM_TEMPLATE, v)),
                       NODEPOOL_HASH, NODEPOOL_HASH_VERSION, tuple(unknown))


def ec2nodeclass_hash(nodeclass: dict, ca_bundle: str | None = None,
                      version: str = DEFAULT_EC2NODECLASS_VERSION) -> StampedHash:
    """``EC2NodeClass.Hash(caBundle)`` at hash version ``version``. ``ca_bundle`` is the string Karpenter uses
    (``encode_ca_bundle``); None hashes as the empty string, which is never what a real Karpenter stamps."""
    t = EC2NODECLASS_SPEC[_check_version(version)]
    spec = nodeclass.get("spec") or {}
    unknown: list[str] = []
    items = [(t, decode(t, spec, "spec", unknown)), (STRING, ami_family(spec)), (STRING, ca_bundle or "")]
    if version == "v6":
        items.append((STRING, kubelet_string(spec.get("kubelet"))))
    return StampedHash("EC2NodeClass", _name(nodeclass), version, str(visit_any_list(items)),
                       EC2NODECLASS_HASH, EC2NODECLASS_HASH_VERSION, tuple(unknown))


def stamped_hash(obj: dict, ca_bundle: str | None = None, version: str = DEFAULT_EC2NODECLASS_VERSION) -> StampedHash:
    """The hash Karpenter stamps for a NodePool or EC2NodeClass (``version`` applies to EC2NodeClass only)."""
    kind = obj.get("kind")
    if kind == "NodePool":
        return nodepool_hash(obj)
    if kind == "EC2NodeClass":
        return ec2nodeclass_hash(obj, ca_bundle, version)
    raise HashInputError(f"kind {kind!r}: Karpenter stamps a drift hash only on NodePool and EC2NodeClass")


def _name(obj: dict) -> str:
    return ((obj.get("metadata") or {}).get("name")) or ""
