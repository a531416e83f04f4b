"""Go's encoding/json, both ways: JSON decoded into the Go types (``gotypes``) as ``json.Unmarshal`` fills them, after
the CRD defaults the API server applies, with Go's own parsers for the strings some types take (time.ParseDuration,
RFC 3339 times); and ``json.Marshal``'s text of a JSON value, which Karpenter hashes as a string where a field is
an open map (the v6 kubelet).

The decoding is where drift is decided on the edges: a field left out is a nil pointer, slice or map (Go's zero
value, skipped by the hash), while ``false``, ``""``, ``[]`` or ``{}`` written out are not. A JSON field the Go
type does not declare is dropped, as Go drops it, and reported back (``unknown``) so a caller can say the value
may be inexact.
"""

from __future__ import annotations

import copy
import math
import re
from datetime import datetime, timezone
from decimal import Decimal

from .gotypes import GoStruct, HashInputError, Map, Opaque, Ptr, Scalar, Slice, Struct, Time, zero

_NANOS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9,
          "h": 3600 * 10**9}
_DUR_PART = re.compile(r"(\d*)(?:\.(\d*))?(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(s: str, where: str) -> int:
    """time.ParseDuration, in nanoseconds (fractions scaled in float64 as Go does)."""
    orig, neg = s, False
    if s[:1] in "+-":
        neg, s = s[0] == "-", s[1:]
    if s == "0":
        return 0
    if not s:
        raise HashInputError(f"{where}: {orig!r} is not a duration (write e.g. 720h, 30m or 90s)")
    total, pos = 0, 0
    while pos < len(s):
        m = _DUR_PART.match(s, pos)
        if not m or (not m.group(1) and not m.group(2)):
            raise HashInputError(f"{where}: {orig!r} is not a duration (write e.g. 720h, 30m or 90s)")
        whole, frac, unit = int(m.group(1) or 0), m.group(2) or "", _NANOS[m.group(3)]
        v = whole * unit
        if frac:
            v += int(float(int(frac)) * (float(unit) / float(10 ** len(frac))))
        total, pos = total + v, m.end()
    if total >= 1 << 63:
        raise HashInputError(f"{where}: {orig!r} overflows a Go duration")
    return -total if neg else total


def decode(t, v, where: str, unknown: list[str]):
    """JSON value -> the Go value encoding/json would produce (None = nil pointer/slice/map)."""
    if isinstance(t, Ptr):
        return None if v is None else decode(t.elem, v, where, unknown)
    if isinstance(t, Slice):
        if v is None:
            return None
        if not isinstance(v, list):
            raise HashInputError(f"{where}: expected a list, got {type(v).__name__}")
        return [decode(t.elem, x, f"{where}[{i}]", unknown) for i, x in enumerate(v)]
    if isinstance(t, Map):
        if v is None:
            return None
        if not isinstance(v, dict):
            raise HashInputError(f"{where}: expected a map, got {type(v).__name__}")
        return {str(k): decode(t.elem, x, f"{where}.{k}", unknown) for k, x in v.items()}
    if isinstance(t, Struct):
        if t.decode is not None:
            return t.decode(v, where)
        if v is None:
            return GoStruct(t)
        if not isinstance(v, dict):
            raise HashInputError(f"{where}: expected an object, got {type(v).__name__}")
        out = GoStruct(t)
        for f in t.fields:
            if f.json:
                raw = v.get(f.json)
                if raw is None and f.default is not None:
                    raw = copy.deepcopy(f.default)
                # A hash:"ignore" field is never walked; only whether it is nil counts, so it stays as JSON.
                out.values[f.name] = (copy.deepcopy(raw) if f.ignore
                                      else decode(f.type, raw, f"{where}.{f.json}", unknown))
        known = {f.json for f in t.fields}
        unknown.extend(f"{where}.{k}" for k in v if k not in known)
        return out
    if isinstance(t, Opaque):
        return copy.deepcopy(v)
    if isinstance(t, Time):
        if v is None:
            return None
        try:
            return datetime.fromisoformat(str(v).replace("Z", "+00:00")).astimezone(timezone.utc)
        except ValueError:
            raise HashInputError(f"{where}: {v!r} is not an RFC 3339 time") from None
    return _scalar(t, v, where)


def _scalar(t: Scalar, v, where: str):
    if v is None:
        return zero(t)
    if t.kind == "string":
        if not isinstance(v, str):
            raise HashInputError(f"{where}: expected a string, got {v!r} (quote it)")
        return v
    if t.kind == "bool":
        if not isinstance(v, bool):
            raise HashInputError(f"{where}: expected true or false, got {v!r}")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise HashInputError(f"{where}: expected an integer, got {v!r}")
    n = int(v)
    bits = 32 if t.kind == "int32" else 64
    if not -(1 << (bits - 1)) <= n < (1 << (bits - 1)):
        raise HashInputError(f"{where}: {n} does not fit the field's Go type {t.kind}")
    return n


def _go_json_string(s: str) -> str:
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\n\r\t\b\f":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}[ch])
        elif o < 0x20 or ch in "<>&" or o in (0x2028, 0x2029):
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _go_json_float(f: float) -> str:
    if math.isnan(f) or math.isinf(f):
        raise HashInputError(f"{f!r} cannot be written as JSON")
    if f == 0:
        return "0" if math.copysign(1, f) > 0 else "-0"
    d = Decimal(repr(f)).normalize()
    if 1e-6 <= abs(f) < 1e21:
        return format(d, "f")
    sign, digits, exp = d.as_tuple()
    mant = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    e = exp + len(digits) - 1
    es = f"{'-' if e < 0 else '+'}{abs(e):02d}"
    if es.startswith("-0"):
        es = "-" + es[2:]
    return f"{'-' if sign else ''}{mant}e{es}"


def go_json(v) -> str:
    """json.Marshal of a decoded JSON value as Go writes it: keys sorted, compact, HTML characters escaped."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _go_json_float(v)
    if isinstance(v, str):
        return _go_json_string(v)
    if isinstance(v, list):
        return "[" + ",".join(go_json(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{_go_json_string(str(k))}:{go_json(v[k])}" for k in sorted(v, key=str)) + "}"
    raise HashInputError(f"{v!r} is not a JSON value")
