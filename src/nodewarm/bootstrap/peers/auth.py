"""Who may read from a peer: a request signed with the profile's shared key, bound to its method, path, range and time.

A request names one object of the model's listing by its path and ETag (``object_path``): the client signs that
target and the server parses it, so both take it from here.

The key never travels: a request carries ``Authorization: NodewarmPeer node=<name>, ts=<unix s>, sig=<hex>``, the
HMAC-SHA256 of those fields and the request line under the key. Someone who sees the traffic on the node network can
replay one request for at most MAX_SKEW_S, for the very same bytes, and forge none. The controller rotates the key
(docs/peers.md); a server accepts the current and the previous one, so a rotation never drops a pull in flight.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from dataclasses import dataclass
from urllib.parse import quote

from nodewarm.api.errors import NodewarmError

SCHEME = "NodewarmPeer"
PREFIX = "/v1/objects/"
# A signature older or newer than this is refused: generous for clock skew between nodes (chrony keeps EC2 within
# milliseconds), short for a replay.
MAX_SKEW_S = 60
_HEADER = re.compile(rf"{SCHEME} node=([A-Za-z0-9.\-]{{1,253}}), ts=(\d{{1,12}}), sig=([0-9a-f]{{64}})")


class PeerAuthFailed(NodewarmError):
    reason = "PeerAuthFailed"


@dataclass(frozen=True)
class PeerKeys:
    """The profile's keys as the agent read them from the Secret: ``current`` signs, both verify."""
    current: bytes
    previous: bytes | None = None

    def __post_init__(self):
        if len(self.current) < 16:
            raise PeerAuthFailed("the peers' key is shorter than 16 bytes; the controller mints 32")


def object_path(obj_rel_path: str, etag: str) -> str:
    """The request target for one object. The client signs exactly this string (path + query) together with
    method "GET" and the Range header value."""
    return f"{PREFIX}{quote(obj_rel_path, safe='/')}?etag={quote(etag, safe='')}"


def _mac(key: bytes, node: str, ts: int, method: str, path: str, byte_range: str) -> str:
    msg = "\n".join((node, str(ts), method, path, byte_range)).encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def sign(keys: PeerKeys, node: str, method: str, path: str, byte_range: str, now: float | None = None) -> str:
    """The Authorization header value for one request from ``node``."""
    ts = int(time.time() if now is None else now)
    return f"{SCHEME} node={node}, ts={ts}, sig={_mac(keys.current, node, ts, method, path, byte_range)}"


def verify(keys: PeerKeys, header: str | None, method: str, path: str, byte_range: str,
           now: float | None = None) -> str:
    """The requesting node's name when ``header`` signs this request under either key; else PeerAuthFailed."""
    m = _HEADER.fullmatch(header or "")
    if m is None:
        raise PeerAuthFailed("no NodewarmPeer authorization")
    node, ts, sig = m[1], int(m[2]), m[3]
    if abs((time.time() if now is None else now) - ts) > MAX_SKEW_S:
        raise PeerAuthFailed(f"signature time {ts} is more than {MAX_SKEW_S}s away")
    for key in (keys.current, keys.previous):
        if key is not None and hmac.compare_digest(_mac(key, node, ts, method, path, byte_range), sig):
            return node
    raise PeerAuthFailed("bad signature")
