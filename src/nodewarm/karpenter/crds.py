"""Karpenter's CRDs as nodewarm knows them: NodePool and NodeClaim (karpenter.sh/v1) and EC2NodeClass
(karpenter.k8s.aws/v1), generated from the descriptions of Karpenter's Go structs (``apis``) that the drift hash
walks too, with upstream's validation markers for the fields nodewarm reads, writes or hashes.

Two users: ``nodewarm render`` checks every Karpenter object it renders against them (no upstream file needed;
``--crds DIR`` checks against a release's own files as well), and the test environment installs them in its API
server unless ``NODEWARM_CRDS_DIR`` names a Karpenter release's CRDs (docs/testing.md, "Karpenter's CRDs in the
tests"). The EC2NodeClass is the shape of the latest release (hash version v5: the typed kubelet). CEL rules are not
part of them: the API server the tests run (v1.20) ignores CEL, and nodewarm's render refuses those cases itself.
"""

from __future__ import annotations

import copy

from .apis import (
    DATE_TIME, DEFAULT_EC2NODECLASS_VERSION, EC2NODECLASS_SPEC, EC2NODECLASS_STATUS, NODECLAIM_SPEC, NODECLAIM_STATUS,
    NODEPOOL_SPEC, NODEPOOL_STATUS,
)
from .gotypes import Field, Map, Opaque, Ptr, Scalar, Slice, Struct, Time

KARPENTER_GROUP = "karpenter.sh"
AWS_GROUP = "karpenter.k8s.aws"
VERSION = "v1"

_FORMATS = {"int32": "int32", "int64": "int64"}


def openapi(t) -> dict:
    """The OpenAPI v3 (structural) schema of a Go type's JSON form."""
    if isinstance(t, Ptr):
        return openapi(t.elem)
    if isinstance(t, Slice):
        return {"type": "array", "items": openapi(t.elem)}
    if isinstance(t, Map):
        return {"type": "object", "additionalProperties": openapi(t.elem)}
    if isinstance(t, Time):
        return dict(DATE_TIME)
    if isinstance(t, Opaque):
        if t.schema is None:
            raise TypeError("an opaque value needs its schema to be part of a CRD")
        return copy.deepcopy(t.schema)
    if isinstance(t, Scalar):
        out = {"type": {"string": "string", "bool": "boolean"}.get(t.kind, "integer")}
        if t.kind in _FORMATS:
            out["format"] = _FORMATS[t.kind]
        return out
    if isinstance(t, Struct):
        if t.schema is not None:
            return copy.deepcopy(t.schema)
        props, required = {}, []
        for f in t.fields:
            if not f.json:
                continue
            props[f.json] = _field(f)
            if f.required:
                required.append(f.json)
        out = {"type": "object", "properties": props}
        if required:
            out["required"] = sorted(required)
        return out
    raise TypeError(f"no schema for {t!r}")


def _field(f: Field) -> dict:
    s = openapi(f.type)
    for k, v in (f.schema or {}).items():
        if k == "additionalProperties":          # markers on a map's values (+kubebuilder:validation on the type)
            s[k] = {**s[k], **v}
        else:
            s[k] = copy.deepcopy(v)
    if f.default is not None:
        s["default"] = copy.deepcopy(f.default)
    return s


def _crd(group: str, kind: str, plural: str, spec: Struct, status: Struct, *, spec_required: bool,
         short_names: tuple[str, ...] = (), scale: dict | None = None) -> dict:
    root = {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "spec": openapi(spec), "status": openapi(status)}}
    if spec_required:
        root["required"] = ["spec"]
    names = {"categories": ["karpenter"], "kind": kind, "listKind": f"{kind}List", "plural": plural,
             "singular": kind.lower()}
    if short_names:
        names["shortNames"] = list(short_names)
    subresources = {"status": {}, **({"scale": scale} if scale else {})}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}", "annotations": {
            "nodewarm.io/generated-from": "nodewarm.karpenter.apis (Karpenter's Go types)"}},
        "spec": {"group": group, "names": names, "scope": "Cluster", "versions": [{
            "name": VERSION, "served": True, "storage": True, "subresources": subresources,
            "schema": {"openAPIV3Schema": root}}]},
    }


def nodepool_crd() -> dict:
    return _crd(KARPENTER_GROUP, "NodePool", "nodepools", NODEPOOL_SPEC, NODEPOOL_STATUS, spec_required=True,
                scale={"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.nodes"})


def nodeclaim_crd() -> dict:
    return _crd(KARPENTER_GROUP, "NodeClaim", "nodeclaims", NODECLAIM_SPEC, NODECLAIM_STATUS, spec_required=True)


def ec2nodeclass_crd() -> dict:
    return _crd(AWS_GROUP, "EC2NodeClass", "ec2nodeclasses", EC2NODECLASS_SPEC[DEFAULT_EC2NODECLASS_VERSION],
                EC2NODECLASS_STATUS, spec_required=False, short_names=("ec2nc", "ec2ncs"))


def crds() -> list[dict]:
    """The three CRDs, in the order they are installed."""
    return [nodepool_crd(), nodeclaim_crd(), ec2nodeclass_crd()]
