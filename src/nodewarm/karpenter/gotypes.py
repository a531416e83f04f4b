"""Go's types as data: what a Go struct declares (field names, JSON names, ``hash`` tags, kubebuilder markers) and
Go's zero values, which decide both what encoding/json leaves unset and what hashstructure skips.

``apis`` describes Karpenter's structs with these; ``gojson`` fills them from JSON, ``hashstructure`` walks them and
``crds`` writes their OpenAPI.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nodewarm.api.errors import NodewarmError


class HashInputError(NodewarmError):
    """A value that is not one of its Go type (or of Karpenter's): the field path names where."""
    reason = "InvalidHashInput"
    exit_code = 2


@dataclass(frozen=True)
class Scalar:
    kind: str            # "string", "bool", "int" (Go int, 64-bit), "int32", "int64", "uint64"


@dataclass(frozen=True)
class Ptr:
    elem: object


@dataclass(frozen=True)
class Slice:
    elem: object


@dataclass(frozen=True)
class Map:
    elem: object         # keys are strings in every map Karpenter hashes


@dataclass(frozen=True)
class Field:
    name: str            # Go field name (hashed); an embedded field is named after its type
    json: str            # "": not a JSON field of its own (set by the type's own decoder)
    type: object
    ignore: bool = False          # hash:"ignore"
    stringer: object = None       # hash:"string": a function giving the value's String()
    default: object = None        # the CRD default the API server applies when the field is absent
    required: bool = False        # +required (the JSON tag has no omitempty)
    schema: dict | None = None    # the field's other validation markers, as OpenAPI (enum, pattern, maxItems, ...)


@dataclass(frozen=True)
class Struct:
    name: str                     # Go type name: the first thing hashed
    fields: tuple[Field, ...]
    decode: object = None         # JSON -> {field: value} when the type has its own UnmarshalJSON
    schema: dict | None = None    # the OpenAPI of its JSON form, when that is not an object of its fields


@dataclass(frozen=True)
class Opaque:
    """A value decoded from JSON that is never hashed (only whether it is zero matters); ``schema`` is its OpenAPI."""
    schema: dict | None = None


@dataclass(frozen=True)
class Time:
    """time.Time: hashed as its MarshalBinary bytes."""


STRING, BOOL, INT32, INT64 = Scalar("string"), Scalar("bool"), Scalar("int32"), Scalar("int64")
DURATION_NS = Scalar("int64")   # time.Duration


@dataclass
class GoStruct:
    """A struct value as encoding/json fills it."""
    type: Struct
    values: dict = field(default_factory=dict)   # Go field name -> value; a missing field holds its zero value


def zero(t):
    """Go's zero value of ``t`` (None: a nil pointer, slice or map, or the zero time)."""
    if isinstance(t, Struct):
        return GoStruct(t)
    if isinstance(t, Scalar):
        return {"string": "", "bool": False}.get(t.kind, 0)
    return None


def is_zero(t, v) -> bool:
    """reflect.Value.IsZero for a decoded value."""
    if isinstance(t, (Ptr, Slice, Map, Time, Opaque)):
        return v is None
    if isinstance(t, Struct):
        return all(v.values.get(f.name) is None if f.ignore else is_zero(f.type, v.values.get(f.name, zero(f.type)))
                   for f in t.fields)
    return v == zero(t) and type(v) is type(zero(t))
