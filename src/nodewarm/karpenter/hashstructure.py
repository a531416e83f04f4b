"""mitchellh/hashstructure v2.0.2 (``hashstructure.go``), the walk Karpenter's drift hashes are: ``Hash(v, FormatV2,
&HashOptions{SlicesAsSets: true, IgnoreZeroValue: true, ZeroNil: true})`` over a value decoded into the Go types
(``gotypes``, ``gojson``).

With those options: FNV-1 64 (``fnv.New64``, not 1a) of a string's bytes or of a number's little-endian bytes at its
Go width (bool as one byte); a slice is the XOR of its elements (so order does not count and a duplicated pair
cancels); a map the XOR of ``H(H(k)||H(v))``, hashed once more; a struct starts from the hash of its type name and
folds in each field ``H(H(name)||H(value))`` then re-hashes, in declaration order, skipping ``hash:"ignore"`` fields
and fields whose Go value is the zero value (a ``hash:"string"`` field is hashed as its String()); a nil pointer is
hashed as the zero value it points to; a time.Time as its MarshalBinary bytes.
"""

from __future__ import annotations

import struct
from datetime import datetime, timezone

from .gotypes import Map, Opaque, Ptr, Slice, Struct, Time, is_zero, zero

_FNV_OFFSET, _FNV_PRIME, _MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def fnv64(data: bytes) -> int:
    """FNV-1 64 (multiply, then xor), Go's ``hash/fnv.New64``."""
    h = _FNV_OFFSET
    for b in data:
        h = ((h * _FNV_PRIME) & _MASK) ^ b
    return h


def _ordered(a: int, b: int) -> int:
    return fnv64(struct.pack("<QQ", a, b))


def _finish(a: int) -> int:
    return fnv64(struct.pack("<Q", a))


def _go_time_binary(t: datetime) -> bytes:
    # time.Time.MarshalBinary, version 1: seconds since year 1, nanoseconds, zone offset in minutes. metav1.Time
    # parses into Local, which is UTC (offset 0, not the -1 marker of time.UTC) in Karpenter's container.
    secs = int((t - datetime(1, 1, 1, tzinfo=timezone.utc)).total_seconds())
    return struct.pack(">bqih", 1, secs, t.microsecond * 1000, 0)


def visit(t, v) -> int:
    """The hash of ``v``, a value of Go type ``t``."""
    if isinstance(t, Ptr):
        return visit(t.elem, zero(t.elem) if v is None else v)      # ZeroNil
    if isinstance(t, Slice):
        h = 0
        for x in v or ():
            h ^= visit(t.elem, x)
        return h
    if isinstance(t, Map):
        h = 0
        for k, x in (v or {}).items():
            h ^= _ordered(fnv64(k.encode()), visit(t.elem, x))
        return _finish(h)
    if isinstance(t, Struct):
        h = fnv64(t.name.encode())
        for f in t.fields:
            if f.ignore:
                continue
            x = v.values.get(f.name, zero(f.type))
            if is_zero(f.type, x):
                continue
            if f.stringer is not None:
                vh = fnv64(f.stringer(x).encode())
            else:
                vh = visit(f.type, x)
            h = _finish(h ^ _ordered(fnv64(f.name.encode()), vh))
        return h
    if isinstance(t, Time):
        return fnv64(_go_time_binary(v or datetime(1, 1, 1, tzinfo=timezone.utc)))
    if isinstance(t, Opaque):
        raise TypeError("an opaque value is never hashed")
    if t.kind == "string":
        return fnv64(v.encode())
    if t.kind == "bool":
        return fnv64(b"\x01" if v else b"\x00")
    fmt = {"int32": "<i", "int64": "<q", "int": "<q", "uint64": "<Q"}[t.kind]
    return fnv64(struct.pack(fmt, v))


def visit_any_list(items: list[tuple[object, object]]) -> int:
    """``[]any{...}`` with SlicesAsSets: the XOR of the elements' hashes (no finishing hash for a slice)."""
    h = 0
    for t, v in items:
        h ^= visit(t, v)
    return h
