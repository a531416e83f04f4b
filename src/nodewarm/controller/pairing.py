"""Which cached Node is a NodeClaim's: an index by providerID on both sides, as nodewarm.api.lifecycle pairs them
(Karpenter's NodeForNodeClaim), kept up to date by the manager as each event arrives, before its watches run."""

from __future__ import annotations

import threading

from nodewarm.api.views import ClaimView, NodeView


class ProviderIndex:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._node_by_pid: dict[str, str] = {}
        self._claim_by_pid: dict[str, str] = {}

    def claim_changed(self, kind: str, old: ClaimView | None, new: ClaimView | None) -> None:
        with self._lock:
            _reindex(self._claim_by_pid, kind, old, new)

    def node_changed(self, kind: str, old: NodeView | None, new: NodeView | None) -> None:
        with self._lock:
            _reindex(self._node_by_pid, kind, old, new)

    def claim_name(self, node: NodeView) -> str | None:
        """The name of the cached NodeClaim the Node belongs to (a deleted Node's too: claims are indexed apart)."""
        with self._lock:
            return self._claim_by_pid.get(node.provider_id) if node.provider_id else None

    def node_name(self, claim: ClaimView) -> str | None:
        with self._lock:
            return self._node_by_pid.get(claim.provider_id) if claim.provider_id else None


def _reindex(by_pid: dict[str, str], kind: str, old, new) -> None:
    if old is not None and old.provider_id and by_pid.get(old.provider_id) == old.name:
        del by_pid[old.provider_id]
    if kind != "DELETED" and new is not None and new.provider_id:
        by_pid[new.provider_id] = new.name
