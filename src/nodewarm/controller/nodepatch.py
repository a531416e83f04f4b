"""JSON-patch builders for the controller's guarded Node writes (the NodeClaim reconciler's one write, a deleted
profile's clean-up lifting its taint, the model labels): every op that changes something comes after ``test`` ops
that make the patch fail (409/422) unless it meets the Node as it was read, so a stale cache can never touch what it
did not see."""

from __future__ import annotations

from nodewarm.api.views import NodeView


def _esc(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def guarded_taint_removal(node: NodeView, taint_key: str) -> list[dict]:
    """test-then-remove for every entry with ``taint_key``, highest index first so indexes stay valid.

    The ``test`` makes the patch fail (422) if the taint list changed since we read it; the shell then
    re-reads and re-plans. Other taints are never named, so they cannot be touched."""
    ops: list[dict] = []
    for i in reversed(range(len(node.taints))):
        t = node.taints[i]
        if t.get("key") == taint_key:
            ops += [{"op": "test", "path": f"/spec/taints/{i}", "value": t},
                    {"op": "remove", "path": f"/spec/taints/{i}"}]
    return ops


def identity_guard(node: NodeView, with_version: bool) -> list[dict]:
    """``test`` ops that make the patch fail unless it meets the very Node we planned for: same uid (not a
    re-created namesake) and, for deadline actions planned on a live read, the same resourceVersion."""
    ops = [{"op": "test", "path": "/metadata/uid", "value": node.uid}] if node.uid else []
    if with_version and node.resource_version:
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": node.resource_version})
    return ops


def set_map_ops(present: bool, root: str, values: dict[str, str]) -> list[dict]:
    """JSON-patch ``add`` for map entries; a missing map must be added whole (a pointer into it fails)."""
    if not present:
        return [{"op": "add", "path": root, "value": values}]
    return [{"op": "add", "path": f"{root}/{_esc(k)}", "value": v} for k, v in values.items()]


def remove_map_ops(root: str, keys: list[str]) -> list[dict]:
    """JSON-patch ``remove`` for map entries (each must be there: the patch is planned on the object it tests for)."""
    return [{"op": "remove", "path": f"{root}/{_esc(k)}"} for k in keys]
