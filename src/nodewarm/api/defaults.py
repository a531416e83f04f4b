"""The WarmProfile's defaults, read from the one schema (``warmprofile.schema.json``) that declares them.

A profile that leaves a field out means the schema's default, wherever the profile is read: the loader (profile.py),
`nodewarm status` reading the live object, the controller. So none of them spells a default; each asks here.
"""

from __future__ import annotations

from functools import cache

from .schema import profile_schema


@cache
def default(path: str):
    """The schema's default at a dotted path under ``spec`` ("readiness.deadline" -> "20m"). A path without one is a
    programming error, raised at once. A list's items are stepped into ("models.priority")."""
    node = profile_schema()["properties"]["spec"]
    for part in path.split("."):
        node = node["properties"][part]
        node = node.get("items", node)   # "models.priority": a field of each item of spec.models
    if "default" not in node:
        raise KeyError(f"the WarmProfile schema declares no default for spec.{path}")
    return node["default"]


TAINT_KEY: str = default("readiness.taintKey")
DEADLINE: str = default("readiness.deadline")
ON_DEADLINE: str = default("readiness.onDeadline")
