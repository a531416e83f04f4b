"""Karpenter's CRDs as nodewarm knows them: NodePool and NodeClaim (karpenter.sh/v1) and EC2NodeClass
(karpenter.k8s.aws/v1), generated from the typed descriptions of Karpenter's Go structs that the drift hash walks
(``karpenterhash``), with upstream's validation markers for the fields nodewarm reads, writes or hashes.

Two users: ``nodewarm render`` checks every Karpenter object it renders against them (no upstream file needed;
``--crds DIR`` checks against a release's own files as well), and the test environment installs them in its API
server unless ``NODEWARM_CRDS_DIR`` names a Karpenter release's CRDs (docs/testing.md, "Karpenter's CRDs in the
tests"). The EC2NodeClass is the shape of the latest release (hash version v5: the typed kubelet). CEL rules are not
part of them: the API server the tests run (v1.20) ignores CEL, and nodewarm's render refuses those cases itself.
"""

from __future__ import annotations

import copy

from .karpenterhash import (
    DATE_TIME, DEFAULT_EC2NODECLASS_VERSION, EC2NODECLASS_SPEC, INT64, NODECLAIM_EXPIRE_AFTER,
    NODECLAIM_NODECLASS_REF, NODECLAIM_REQUIREMENTS, NODECLAIM_STARTUP_TAINTS, NODECLAIM_TAINTS, NODECLAIM_TEMPLATE,
    NODECLAIM_TERMINATION_GRACE, QUANTITY, STRING, BOOL, Field, Map, Opaque, Ptr, Scalar, Slice,
    Struct, Time,
)

KARPENTER_GROUP = "karpenter.sh"
AWS_GROUP = "karpenter.k8s.aws"
VERSION = "v1"

_QUANTITY_MAP = Map(Opaque(QUANTITY))                       # corev1.ResourceList


CONDITION_TYPE = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?"
                  r"[A-Za-z0-9])$")


def _condition(reason_pattern: str, required: tuple[str, ...]) -> Struct:
    # karpenter's status.Condition (metav1.Condition's fields): NodeClaims allow an empty reason, the others do not.
    reason = {"maxLength": 1024, "pattern": reason_pattern}
    if "reason" in required:
        reason["minLength"] = 1
    return Struct("Condition", (
        Field("Type", "type", STRING, required="type" in required,
              schema={"maxLength": 316, "pattern": CONDITION_TYPE}),
        Field("Status", "status", STRING, required=True, schema={"enum": ["True", "False", "Unknown"]}),
        Field("ObservedGeneration", "observedGeneration", INT64, schema={"minimum": 0}),
        Field("LastTransitionTime", "lastTransitionTime", Time(), required=True),
        Field("Reason", "reason", STRING, required="reason" in required, schema=reason),
        Field("Message", "message", STRING, required="message" in required, schema={"maxLength": 32768}),
    ))


_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
CONDITION = _condition(_REASON, ("type", "status", "lastTransitionTime", "reason", "message"))
NODECLAIM_CONDITION = _condition(r"^([A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?|)$", ("type", "status",
                                                                                   "lastTransitionTime"))
_CONDITIONS_AS_MAP = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}

BUDGET = Struct("Budget", (
    Field("Reasons", "reasons", Slice(Opaque({"type": "string", "enum": ["Underutilized", "Empty", "Drifted"]})),
          schema={"maxItems": 50, "x-kubernetes-list-type": "set"}),
    Field("Nodes", "nodes", STRING, required=True, default="10%",
          schema={"pattern": r"^((100|[0-9]{1,2})%|[0-9]+)$"}),
    Field("Schedule", "schedule", Ptr(STRING),
          schema={"pattern": r"^(@(annually|yearly|monthly|weekly|daily|midnight|hourly))|"
                             r"((.+)\s(.+)\s(.+)\s(.+)\s(.+))$"}),
    Field("Duration", "duration", Ptr(Opaque({"type": "string"})),
          schema={"pattern": r"^((([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?)$"}),
))
DISRUPTION = Struct("Disruption", (
    Field("ConsolidateAfter", "consolidateAfter", NODECLAIM_EXPIRE_AFTER.type, required=True),
    Field("ConsolidationPolicy", "consolidationPolicy", STRING, default="WhenEmptyOrUnderutilized",
          schema={"enum": ["WhenEmpty", "WhenEmptyOrUnderutilized", "Balanced"]}),
    Field("Budgets", "budgets", Slice(BUDGET), default=[{"nodes": "10%"}],
          schema={"maxItems": 50, "x-kubernetes-list-type": "atomic"}),
))
NODEPOOL_SPEC = Struct("NodePoolSpec", (
    Field("Template", "template", NODECLAIM_TEMPLATE, required=True),
    Field("Disruption", "disruption", DISRUPTION, default={"consolidateAfter": "0s"}),
    Field("Limits", "limits", _QUANTITY_MAP),
    Field("Weight", "weight", Ptr(Scalar("int32")), schema={"minimum": 1, "maximum": 100}),
    Field("Replicas", "replicas", Ptr(INT64), schema={"minimum": 0}),
))
NODEPOOL_STATUS = Struct("NodePoolStatus", (
    Field("Resources", "resources", _QUANTITY_MAP),
    Field("Nodes", "nodes", Ptr(INT64), default=0),
    Field("NodeClassObservedGeneration", "nodeClassObservedGeneration", INT64),
    Field("Conditions", "conditions", Slice(CONDITION), schema=_CONDITIONS_AS_MAP),
))

NODECLAIM_SPEC = Struct("NodeClaimSpec", (
    NODECLAIM_TAINTS, NODECLAIM_STARTUP_TAINTS, NODECLAIM_REQUIREMENTS,
    Field("Resources", "resources", Struct("ResourceRequirements", (Field("Requests", "requests", _QUANTITY_MAP),)),
          ignore=True),
    NODECLAIM_NODECLASS_REF, NODECLAIM_TERMINATION_GRACE, NODECLAIM_EXPIRE_AFTER,
))
NODECLAIM_STATUS = Struct("NodeClaimStatus", (
    Field("NodeName", "nodeName", STRING),
    Field("ProviderID", "providerID", STRING),
    Field("ImageID", "imageID", STRING),
    Field("Capacity", "capacity", _QUANTITY_MAP),
    Field("Allocatable", "allocatable", _QUANTITY_MAP),
    Field("Conditions", "conditions", Slice(NODECLAIM_CONDITION), schema=_CONDITIONS_AS_MAP),
    Field("LastPodEventTime", "lastPodEventTime", Time()),
))

_CR_ID = {"pattern": "^cr-[0-9a-z]+$"}
EC2NODECLASS_STATUS = Struct("EC2NodeClassStatus", (
    Field("Subnets", "subnets", Slice(Struct("Subnet", (
        Field("ID", "id", STRING, required=True), Field("Zone", "zone", STRING, required=True),
        Field("ZoneID", "zoneID", STRING))))),
    Field("SecurityGroups", "securityGroups", Slice(Struct("SecurityGroup", (
        Field("ID", "id", STRING, required=True), Field("Name", "name", STRING))))),
    Field("CapacityReservations", "capacityReservations", Slice(Struct("CapacityReservation", (
        Field("AvailabilityZone", "availabilityZone", STRING, required=True),
        Field("EndTime", "endTime", Ptr(Time())),
        Field("ID", "id", STRING, required=True, schema=_CR_ID),
        Field("InstanceMatchCriteria", "instanceMatchCriteria", STRING, required=True,
              schema={"enum": ["open", "targeted"]}),
        Field("InstanceType", "instanceType", STRING, required=True),
        Field("Interruptible", "interruptible", BOOL),
        Field("OwnerID", "ownerID", STRING, required=True, schema={"pattern": "^[0-9]{12}$"}),
        Field("ReservationType", "reservationType", STRING, default="default",
              schema={"enum": ["default", "capacity-block"]}),
        Field("State", "state", STRING, default="active", schema={"enum": ["active", "expiring"]}))))),
    Field("AMIs", "amis", Slice(Struct("AMI", (
        Field("ID", "id", STRING, required=True), Field("Name", "name", STRING),
        Field("Deprecated", "deprecated", BOOL),
        Field("Requirements", "requirements", Slice(Struct("NodeSelectorRequirement", (
            Field("Key", "key", STRING, required=True), Field("Operator", "operator", STRING, required=True),
            Field("Values", "values", Slice(STRING), schema={"x-kubernetes-list-type": "atomic"})))),
            required=True))))),
    Field("InstanceProfile", "instanceProfile", STRING),
    Field("Conditions", "conditions", Slice(CONDITION)),
))

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
            "nodewarm.io/generated-from": "nodewarm.nodeclasses.karpenterhash (Karpenter's Go types)"}},
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
