"""Karpenter's API types as its Go code declares them: NodePool and NodeClaim (kubernetes-sigs/karpenter
``pkg/apis/v1``, karpenter.sh/v1), EC2NodeClass (aws/karpenter-provider-aws ``pkg/apis/v1``, karpenter.k8s.aws/v1),
and the Kubernetes types their fields use (metav1.Duration, metav1.Time, resource.Quantity, the conditions).

(Over 300 lines: it is data, a line or two per field of the three kinds and of the types in them, in upstream's
declaration order, so that it reads side by side with the Go files it copies.)

Each field is written as the Go source declares it (``gotypes.Field``): Go name, JSON name, Go type, ``hash`` tag,
and its kubebuilder markers (+kubebuilder:validation:Enum, Pattern, MaxItems, Minimum, +kubebuilder:default,
+required) as OpenAPI. ``drifthash`` walks the hashed types (``NODECLAIM_TEMPLATE``, ``EC2NODECLASS_SPEC``),
``crds`` turns the specs and statuses into the CRDs' schemas, so the hash and the schema cannot disagree on a field,
a type or a default. The methods the hash calls are here too: ``EC2NodeClass.AMIFamily()`` (``ami_family``),
``KubeletConfiguration.String()`` (``kubelet_string``) and ``Quantity.String()`` (``quantity_string``).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from .gojson import decode, go_json, parse_go_duration
from .gotypes import (
    BOOL, DURATION_NS, INT32, INT64, STRING, Field, GoStruct, HashInputError, Map, Opaque, Ptr, Scalar, Slice,
    Struct, Time,
)

EC2NODECLASS_VERSIONS = ("v5", "v6")   # EC2NodeClassHashVersion: v5 at v1.14.1, v6 on main
DEFAULT_EC2NODECLASS_VERSION = "v5"    # the latest release


# --- value types: quantities, durations, times, taints, conditions ------------------------------------------------

QUANTITY_PATTERN = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
QUANTITY = {"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}     # resource.Quantity
QUALIFIED_NAME = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(\/))?"
                  r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
DURATION_OR_NEVER = r"^(([0-9]+(s|m|h))+|Never)$"
TAINT_EFFECTS = ["NoSchedule", "PreferNoSchedule", "NoExecute"]
DATE_TIME = {"type": "string", "format": "date-time"}

# resource.Quantity.String() (k8s.io/apimachinery/pkg/api/resource/quantity.go): an EBS volume size is hashed as it.
_BIN = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DEC = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QTY = re.compile(r"^([+-]?)(\d+\.?\d*|\.\d+)(.*)$")


def quantity_string(v, where: str = "quantity") -> str:
    """The canonical form ``Quantity.String()`` gives a parsed quantity: ``2G``, ``100Gi``, ``1536``, ``500m``."""
    s = str(v).strip() if not isinstance(v, bool) else ""
    m = _QTY.match(s)
    if not m:
        raise HashInputError(f"{where}: {v!r} is not a quantity (write e.g. 100Gi or 20G)")
    sign, num, suffix = m.groups()
    if suffix in _BIN:
        fmt, amount = "BinarySI", Fraction(num) * 2 ** _BIN[suffix]
    elif suffix in _DEC:
        fmt, amount = "DecimalSI", Fraction(num) * Fraction(10) ** _DEC[suffix]
    elif re.fullmatch(r"[eE][+-]?\d+", suffix):
        fmt, amount = "DecimalExponent", Fraction(num) * Fraction(10) ** int(suffix[1:])
    else:
        raise HashInputError(f"{where}: {v!r} has an unknown suffix {suffix!r} (use Ki, Mi, Gi, k, M, G, ...)")
    if sign == "-":
        amount = -amount
    # Quantities keep at most nanounit precision, rounding away from zero.
    nanos = amount * 10**9
    if nanos.denominator != 1:
        nanos = Fraction(math.ceil(abs(nanos)) * (1 if nanos > 0 else -1))
    amount = nanos / 10**9
    if fmt == "BinarySI" and 0 < abs(amount) < 1:
        fmt = "DecimalSI"
    if amount == 0:
        return "0"
    if fmt == "BinarySI" and (-1024 < amount < 1024 or amount.denominator != 1):
        fmt = "DecimalSI"
    if fmt == "BinarySI":
        n, e = int(amount), 0
        while n % 1024 == 0 and e < 6:
            n, e = n // 1024, e + 1
        return f"{n}{next((k for k, x in _BIN.items() if x == e * 10), '')}"
    # decimal: an integer mantissa times 10^e, e a multiple of 3 (trailing zeros moved into e first)
    e = 0
    while amount.denominator != 1:
        amount, e = amount * 10, e - 1
    n = int(amount)
    while n != 0 and n % 10 == 0:
        n, e = n // 10, e + 1
    while e % 3 != 0:
        n, e = n * 10, e - 1
    if fmt == "DecimalExponent":
        return f"{n}" if e == 0 else f"{n}e{e}"
    suffix = next((k for k, x in _DEC.items() if x == e), None)
    if suffix is None:        # beyond E: apimachinery falls back to the exponent form
        return f"{n}e{e}"
    return f"{n}{suffix}"


def _metav1_duration(v, where):
    # metav1.Duration{Duration time.Duration}, JSON "30m" (UnmarshalJSON: time.ParseDuration).
    t = METAV1_DURATION
    if v is None:
        return GoStruct(t)
    if not isinstance(v, str):
        raise HashInputError(f"{where}: expected a duration string such as 30m, got {v!r}")
    return GoStruct(t, {"Duration": parse_go_duration(v, where)})


def _nillable_duration(v, where):
    # karpenter NillableDuration{*time.Duration; Raw []byte `hash:"ignore"`}: "Never" leaves both nil.
    t = NILLABLE_DURATION
    if v is None or v == "Never":
        return GoStruct(t)
    if not isinstance(v, str):
        raise HashInputError(f"{where}: expected a duration such as 720h or Never, got {v!r}")
    return GoStruct(t, {"Duration": parse_go_duration(v, where), "Raw": v})


METAV1_DURATION = Struct("Duration", (Field("Duration", "", DURATION_NS),), decode=_metav1_duration,
                         schema={"type": "string"})
NILLABLE_DURATION = Struct("NillableDuration", (Field("Duration", "", Ptr(DURATION_NS)),
                                                Field("Raw", "", Opaque(), ignore=True)), decode=_nillable_duration,
                           schema={"type": "string", "pattern": DURATION_OR_NEVER})

def _metav1_time(v, where):
    # metav1.Time is struct{time.Time}; its JSON is the RFC 3339 string of the embedded time.
    return GoStruct(METAV1_TIME, {} if v is None else {"Time": decode(Time(), v, where, [])})


METAV1_TIME = Struct("Time", (Field("Time", "", Time()),), decode=_metav1_time, schema=DATE_TIME)
TAINT = Struct("Taint", (
    Field("Key", "key", STRING, required=True, schema={"minLength": 1, "pattern": QUALIFIED_NAME}),
    Field("Value", "value", STRING, schema={"pattern": QUALIFIED_NAME}),
    Field("Effect", "effect", STRING, required=True, schema={"enum": TAINT_EFFECTS}),
    Field("TimeAdded", "timeAdded", Ptr(METAV1_TIME))))
_TAINTS = {"x-kubernetes-list-type": "atomic"}

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


# --- NodePool and NodeClaim (karpenter.sh/v1) ---------------------------------------------------------------------

REQUIREMENT = Struct("NodeSelectorRequirementWithMinValues", (
    Field("Key", "key", STRING, required=True, schema={"maxLength": 316, "pattern": QUALIFIED_NAME}),
    Field("Operator", "operator", STRING, required=True,
          schema={"enum": ["Gte", "Lte", "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]}),
    Field("Values", "values", Slice(STRING), schema={"x-kubernetes-list-type": "atomic"}),
    Field("MinValues", "minValues", Ptr(Scalar("int")), schema={"minimum": 1, "maximum": 50}),
))
NODECLASS_REFERENCE = Struct("NodeClassReference", (
    Field("Kind", "kind", STRING, required=True), Field("Name", "name", STRING, required=True),
    Field("Group", "group", STRING, required=True, schema={"pattern": r"^[^/]*$"})))

# The fields NodeClaimTemplateSpec (NodePool) and NodeClaimSpec share, in declaration order.
NODECLAIM_TAINTS = Field("Taints", "taints", Slice(TAINT), schema=_TAINTS)
NODECLAIM_STARTUP_TAINTS = Field("StartupTaints", "startupTaints", Slice(TAINT), schema=_TAINTS)
NODECLAIM_REQUIREMENTS = Field("Requirements", "requirements", Slice(REQUIREMENT), ignore=True, required=True,
                               schema={"maxItems": 100, "x-kubernetes-list-type": "atomic"})
NODECLAIM_NODECLASS_REF = Field("NodeClassRef", "nodeClassRef", Ptr(NODECLASS_REFERENCE), required=True)
NODECLAIM_TERMINATION_GRACE = Field("TerminationGracePeriod", "terminationGracePeriod", Ptr(METAV1_DURATION),
                                   schema={"pattern": r"^([0-9]+(s|m|h))+$"})
NODECLAIM_EXPIRE_AFTER = Field("ExpireAfter", "expireAfter", NILLABLE_DURATION, default="720h")

NODECLAIM_TEMPLATE = Struct("NodeClaimTemplate", (
    Field("ObjectMeta", "metadata", Struct("ObjectMeta", (
        Field("Labels", "labels", Map(STRING), schema={"maxProperties": 100, "x-kubernetes-map-type": "atomic",
                                                       "additionalProperties": {"maxLength": 63,
                                                                                "pattern": LABEL_VALUE}}),
        Field("Annotations", "annotations", Map(STRING), schema={"x-kubernetes-map-type": "granular"})))),
    Field("Spec", "spec", Struct("NodeClaimTemplateSpec", (
        NODECLAIM_TAINTS, NODECLAIM_STARTUP_TAINTS, NODECLAIM_REQUIREMENTS, NODECLAIM_NODECLASS_REF,
        NODECLAIM_TERMINATION_GRACE, NODECLAIM_EXPIRE_AFTER,
    )), required=True),
))
# NodeClaimTemplateSpec has no resources in the NodePool (the CRD has none); NodeClaimSpec's is hash:"ignore".

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
    Field("ConsolidateAfter", "consolidateAfter", NILLABLE_DURATION, required=True),
    Field("ConsolidationPolicy", "consolidationPolicy", STRING, default="WhenEmptyOrUnderutilized",
          schema={"enum": ["WhenEmpty", "WhenEmptyOrUnderutilized", "Balanced"]}),
    Field("Budgets", "budgets", Slice(BUDGET), default=[{"nodes": "10%"}],
          schema={"maxItems": 50, "x-kubernetes-list-type": "atomic"}),
))
NODEPOOL_SPEC = Struct("NodePoolSpec", (
    Field("Template", "template", NODECLAIM_TEMPLATE, required=True),
    Field("Disruption", "disruption", DISRUPTION, default={"consolidateAfter": "0s"}),
    Field("Limits", "limits", _QUANTITY_MAP),
    Field("Weight", "weight", Ptr(INT32), schema={"minimum": 1, "maximum": 100}),
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


# --- EC2NodeClass (karpenter.k8s.aws/v1) --------------------------------------------------------------------------

_STRING_MAP = Map(STRING)
_TAGS = Field("Tags", "tags", _STRING_MAP, schema={"maxProperties": 20})
_CR_ID, _OWNER_ID = {"pattern": "^cr-[0-9a-z]+$"}, {"pattern": "^[0-9]{12}$"}
_MATCH_CRITERIA = {"enum": ["open", "targeted"]}
# Selector terms are hash:"ignore": they drift by the values they resolve to (status), not by how they are written.
SUBNET_SELECTOR_TERM = Struct("SubnetSelectorTerm", (
    _TAGS, Field("ID", "id", STRING, schema={"pattern": "subnet-[0-9a-z]+"})))
SECURITY_GROUP_SELECTOR_TERM = Struct("SecurityGroupSelectorTerm", (
    _TAGS, Field("ID", "id", STRING, schema={"pattern": "sg-[0-9a-z]+"}), Field("Name", "name", STRING)))
CAPACITY_RESERVATION_SELECTOR_TERM = Struct("CapacityReservationSelectorTerm", (
    _TAGS, Field("ID", "id", STRING, schema=_CR_ID), Field("OwnerID", "ownerID", STRING, schema=_OWNER_ID),
    Field("InstanceMatchCriteria", "instanceMatchCriteria", STRING, schema=_MATCH_CRITERIA)))
AMI_SELECTOR_TERM = Struct("AMISelectorTerm", (
    Field("Alias", "alias", STRING, schema={"maxLength": 30}), _TAGS,
    Field("ID", "id", STRING, schema={"pattern": "ami-[0-9a-z]+"}), Field("Name", "name", STRING),
    Field("Owner", "owner", STRING), Field("SSMParameter", "ssmParameter", STRING)))

_RESERVED = {"additionalProperties": {"pattern": QUANTITY_PATTERN}}
_EVICTION_SIGNAL = {"additionalProperties": {                         # a percentage, empty, or a quantity
    "pattern": r"^((\d{1,2}(\.\d{1,2})?|100(\.0{1,2})?)%||" + QUANTITY_PATTERN[1:-1] + ")$"}}
_PERCENT = {"minimum": 0, "maximum": 100}
KUBELET_V5 = Struct("KubeletConfiguration", (
    Field("ClusterDNS", "clusterDNS", Slice(STRING)),
    Field("MaxPods", "maxPods", Ptr(INT32), schema={"minimum": 0}),
    Field("PodsPerCore", "podsPerCore", Ptr(INT32), schema={"minimum": 0}),
    Field("SystemReserved", "systemReserved", _STRING_MAP, schema=_RESERVED),
    Field("KubeReserved", "kubeReserved", _STRING_MAP, schema=_RESERVED),
    Field("EvictionHard", "evictionHard", _STRING_MAP, schema=_EVICTION_SIGNAL),
    Field("EvictionSoft", "evictionSoft", _STRING_MAP, schema=_EVICTION_SIGNAL),
    Field("EvictionSoftGracePeriod", "evictionSoftGracePeriod", Map(METAV1_DURATION)),
    Field("EvictionMaxPodGracePeriod", "evictionMaxPodGracePeriod", Ptr(INT32)),
    Field("ImageGCHighThresholdPercent", "imageGCHighThresholdPercent", Ptr(INT32), schema=_PERCENT),
    Field("ImageGCLowThresholdPercent", "imageGCLowThresholdPercent", Ptr(INT32), schema=_PERCENT),
    Field("CPUCFSQuota", "cpuCFSQuota", Ptr(BOOL)),
))
EBS_VOLUME_SIZE = (r"^((?:[1-9][0-9]{0,3}|[1-4][0-9]{4}|[5][0-8][0-9]{3}|59000)Gi|"
                   r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|[6][0-3][0-9]{3}|64000)G|"
                   r"([1-9]||[1-5][0-7]|58)Ti|([1-9]||[1-5][0-9]|6[0-3]|64)T)$")
BLOCK_DEVICE_MAPPING = Struct("BlockDeviceMapping", (
    Field("DeviceName", "deviceName", Ptr(STRING)),
    Field("EBS", "ebs", Ptr(Struct("BlockDevice", (
        Field("DeleteOnTermination", "deleteOnTermination", Ptr(BOOL)),
        Field("Encrypted", "encrypted", Ptr(BOOL)),
        Field("IOPS", "iops", Ptr(INT64)),
        Field("KMSKeyID", "kmsKeyID", Ptr(STRING)),
        Field("SnapshotID", "snapshotID", Ptr(STRING)),
        Field("Throughput", "throughput", Ptr(INT64)),
        Field("VolumeInitializationRate", "volumeInitializationRate", Ptr(INT32),
              schema={"minimum": 100, "maximum": 300}),
        Field("VolumeSize", "volumeSize", Ptr(Opaque({"type": "string", "pattern": EBS_VOLUME_SIZE})),
              stringer=quantity_string),                                                    # *resource.Quantity
        Field("VolumeType", "volumeType", Ptr(STRING),
              schema={"enum": ["standard", "io1", "io2", "gp2", "sc1", "st1", "gp3"]}),
    )))),
    Field("RootVolume", "rootVolume", BOOL),
))
METADATA_OPTIONS_DEFAULT = {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled", "httpPutResponseHopLimit": 1,
                            "httpTokens": "required"}
_ENABLED_DISABLED = {"enum": ["enabled", "disabled"]}
METADATA_OPTIONS = Struct("MetadataOptions", (
    Field("HTTPEndpoint", "httpEndpoint", Ptr(STRING), default="enabled", schema=_ENABLED_DISABLED),
    Field("HTTPProtocolIPv6", "httpProtocolIPv6", Ptr(STRING), default="disabled", schema=_ENABLED_DISABLED),
    Field("HTTPPutResponseHopLimit", "httpPutResponseHopLimit", Ptr(INT64), default=1,
          schema={"minimum": 1, "maximum": 64}),
    Field("HTTPTokens", "httpTokens", Ptr(STRING), default="required", schema={"enum": ["required", "optional"]}),
))
AMI_FAMILIES = ["AL2", "AL2023", "Bottlerocket", "Custom", "Windows2019", "Windows2022", "Windows2025"]


def _ec2nodeclass_spec(version: str) -> Struct:
    # v6 (main) made kubelet an open map the hash skips and folds in as a string; v5 is the typed struct above.
    kubelet = (Field("Kubelet", "kubelet", Ptr(KUBELET_V5)) if version == "v5"
               else Field("Kubelet", "kubelet", ignore=True,
                          type=Opaque({"type": "object", "x-kubernetes-preserve-unknown-fields": True})))
    return Struct("EC2NodeClassSpec", (
        Field("SubnetSelectorTerms", "subnetSelectorTerms", Slice(SUBNET_SELECTOR_TERM), ignore=True, required=True,
              schema={"maxItems": 30}),
        Field("SecurityGroupSelectorTerms", "securityGroupSelectorTerms", Slice(SECURITY_GROUP_SELECTOR_TERM),
              ignore=True, required=True, schema={"maxItems": 30}),
        Field("CapacityReservationSelectorTerms", "capacityReservationSelectorTerms",
              Slice(CAPACITY_RESERVATION_SELECTOR_TERM), ignore=True, schema={"maxItems": 30}),
        Field("PlacementGroupSelector", "placementGroupSelector", Ptr(Struct("PlacementGroupSelector", (
            Field("Name", "name", Ptr(STRING), schema={"minLength": 1}),
            Field("ID", "id", Ptr(STRING), schema={"pattern": "^pg-[0-9a-z]+$"}))))),
        Field("AssociatePublicIPAddress", "associatePublicIPAddress", Ptr(BOOL)),
        Field("IPPrefixCount", "ipPrefixCount", Ptr(INT32), ignore=True, schema={"minimum": 0}),
        Field("AMISelectorTerms", "amiSelectorTerms", Slice(AMI_SELECTOR_TERM), ignore=True, required=True,
              schema={"minItems": 1, "maxItems": 30}),
        Field("AMIFamily", "amiFamily", Ptr(STRING), ignore=True, schema={"enum": AMI_FAMILIES}),
        Field("UserData", "userData", Ptr(STRING)),
        Field("Role", "role", STRING),
        Field("InstanceProfile", "instanceProfile", Ptr(STRING)),
        Field("Tags", "tags", _STRING_MAP),
        kubelet,
        Field("BlockDeviceMappings", "blockDeviceMappings", Slice(Ptr(BLOCK_DEVICE_MAPPING)), schema={"maxItems": 50}),
        Field("InstanceStorePolicy", "instanceStorePolicy", Ptr(STRING), schema={"enum": ["RAID0"]}),
        Field("NetworkInterfaces", "networkInterfaces", Slice(Ptr(Struct("NetworkInterface", (
            Field("NetworkCardIndex", "networkCardIndex", INT32, required=True, schema={"minimum": 0}),
            Field("DeviceIndex", "deviceIndex", INT32, required=True, schema={"minimum": 0}),
            Field("InterfaceType", "interfaceType", STRING, required=True,
                  schema={"enum": ["interface", "efa-only"]}))))), schema={"maxItems": 150}),
        Field("DetailedMonitoring", "detailedMonitoring", Ptr(BOOL)),
        Field("MetadataOptions", "metadataOptions", Ptr(METADATA_OPTIONS), default=METADATA_OPTIONS_DEFAULT),
        Field("ConnectionTracking", "connectionTracking", Ptr(Struct("ConnectionTracking", (
            Field("TCPEstablishedTimeout", "tcpEstablishedTimeout", Ptr(INT32),
                  schema={"minimum": 60, "maximum": 432000}),
            Field("UDPStreamTimeout", "udpStreamTimeout", Ptr(INT32), schema={"minimum": 60, "maximum": 180}),
            Field("UDPTimeout", "udpTimeout", Ptr(INT32), schema={"minimum": 30, "maximum": 60}))))),
        Field("Context", "context", Ptr(STRING)),
        Field("CPUOptions", "cpuOptions", Ptr(Struct("CPUOptions", (
            Field("NestedVirtualization", "nestedVirtualization", Ptr(STRING), schema=_ENABLED_DISABLED),)))),
    ))


EC2NODECLASS_SPEC = {v: _ec2nodeclass_spec(v) for v in EC2NODECLASS_VERSIONS}

# EC2NodeClass.AMIFamily(): the alias family names (labels.go AMIFamily* constants), matched in lower case.
ALIAS_FAMILIES = ("AL2", "AL2023", "Bottlerocket", "Windows2019", "Windows2022", "Windows2025")
AMI_FAMILY_CUSTOM = "Custom"


def ami_family(spec: dict) -> str:
    """``EC2NodeClass.AMIFamily()``: ``spec.amiFamily`` when set, else the family of the first alias term, else
    ``Custom`` (the value that is hashed, so moving between ``amiFamily`` and the alias drifts nothing)."""
    if spec.get("amiFamily") is not None:
        return spec["amiFamily"]
    for term in spec.get("amiSelectorTerms") or ():
        alias = (term or {}).get("alias") if isinstance(term, dict) else None
        if alias:
            parts = alias.split("@")
            family = next((f for f in ALIAS_FAMILIES if len(parts) == 2 and f.lower() == parts[0]), None)
            if family is None:
                raise HashInputError(f"spec.amiSelectorTerms: alias {alias!r} is not FAMILY@VERSION with FAMILY one "
                                     f"of {', '.join(f.lower() for f in ALIAS_FAMILIES)}")
            return family
    return AMI_FAMILY_CUSTOM


def kubelet_string(kubelet) -> str:
    """``KubeletConfiguration.String()`` on main: ``null`` when empty, else the config as Go's JSON."""
    return "null" if not kubelet else go_json(kubelet)


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
        Field("InstanceMatchCriteria", "instanceMatchCriteria", STRING, required=True, schema=_MATCH_CRITERIA),
        Field("InstanceType", "instanceType", STRING, required=True),
        Field("Interruptible", "interruptible", BOOL),
        Field("OwnerID", "ownerID", STRING, required=True, schema=_OWNER_ID),
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
