"""Which nodes of the profile can feed this one: read from their Node annotations (pure).

Every agent with peers on writes PEER_ANNOTATION (nodewarm/api/names.py) on its own Node, naming every model it
serves; the others follow the profile's Nodes with one list and a watch (peering.py), so no extra service is installed
and a node that goes, or is cordoned, or drops its annotation, leaves the directory as soon as the watch says so.
"""

from __future__ import annotations

import ipaddress
import json
import time
from typing import Mapping

from nodewarm.api.names import PEER_ANNOTATION
from nodewarm.api.timeutil import fmt_time_s
from nodewarm.api.views import DISRUPTED_TAINT

from .fetch import Peer

STATES = ("pulling", "warm")


def annotation(profile: str, host: str, port: int, state: str, model: str, held: dict,
               also: Mapping[str, str] | None = None) -> str:
    """This node's entry: where it serves, for which profile; a model (api.generation.model_key: a new serving image
    keeps the weights, so peers of either generation share them) with its state and what it holds of it so far; and
    ``also``, the other models it serves, each with its state."""
    for s in (state, *(also or {}).values()):
        if s not in STATES:
            raise ValueError(f"peer state {s!r} is not one of {STATES}")
    doc = {"profile": profile, "endpoint": f"{host}:{port}", "state": state, "model": model,
           "files": held.get("files", 0), "bytes": held.get("bytes", 0), "at": fmt_time_s(time.time())}
    if also:
        doc["also"] = dict(also)
    return json.dumps(doc, separators=(",", ":"))


def leaving(node: dict) -> str | None:
    """Why this Node must neither serve nor be asked (cordoned, being drained), or None."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return "cordoned"
    if any(t.get("key") == DISRUPTED_TAINT for t in spec.get("taints") or ()):
        return "being drained (karpenter.sh/disrupted)"
    return None


def offers(node: dict, profile: str) -> dict[str, Peer]:
    """The models of ``profile`` a Node offers to feed, by model key, each as the peer to ask; none when it offers
    none, offers another profile's, is leaving, or its entry is malformed (a Node annotation is anyone's with
    `patch nodes/status` to write: it only ever names an address to ask, and what comes back is verified)."""
    meta = node.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(PEER_ANNOTATION)
    if not raw or leaving(node):
        return {}
    try:
        doc = json.loads(raw)
        host, _, port = doc["endpoint"].rpartition(":")
        ipaddress.ip_address(host)
        port = int(port)
        models = {**doc.get("also", {}), doc["model"]: doc["state"]}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
    if doc.get("profile") != profile or not 0 < port < 65536:
        return {}
    return {model: Peer(node=meta.get("name", ""), host=host, port=port, state=state)
            for model, state in models.items() if isinstance(model, str) and state in STATES}


def peer_of(node: dict, profile: str, model: str) -> Peer | None:
    """The peer a Node offers for ``profile``'s weights ``model``, or None (see ``offers``)."""
    return offers(node, profile).get(model)


def internal_ip(node: dict) -> str | None:
    """The Node's InternalIP, the one address its peer server binds to."""
    for a in (node.get("status") or {}).get("addresses") or ():
        if a.get("type") == "InternalIP" and a.get("address"):
            return a["address"]
    return None
