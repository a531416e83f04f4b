"""Just enough RFC 6902 (test/add/remove) to apply the controller's JSON patches as the API server would."""

from __future__ import annotations

import copy


def apply_json_patch(doc: dict, ops: list[dict]) -> dict:
    """``doc`` with ``ops`` applied (a copy); a failing ``test`` op raises AssertionError, as the server answers 422."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, leaf = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = doc
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        key = int(leaf) if isinstance(target, list) else leaf
        if op["op"] == "test":
            assert target[key] == op["value"], f"test failed at {op['path']}"
        elif op["op"] == "remove":
            del target[key]
        elif op["op"] == "add":
            if isinstance(target, list):
                target.insert(key, op["value"])
            else:
                target[key] = op["value"]
    return doc
