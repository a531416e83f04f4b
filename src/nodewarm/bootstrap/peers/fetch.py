"""Peers before S3: which source a part of the pull comes from, and reading it from a peer.

``PeerSource`` is the pull's other source of parts (weights/sharing.py's PartSource), handed to it by whoever
assembles the pull (modelcache/warmer.py, from peering.py). A pull asks ``PeerSource.choose`` for each part. The
answer is S3, a peer, or "wait": peers of the same profile that are warm hold every file; peers still pulling split
the model between them and this node, so that nodes scaling up together read each byte from S3 about once. The split
is rendezvous hashing over the pulling members (this node included): each part has one owner, which fetches it from
S3 while the others wait for it and then read it from the owner (a peer serves the verified parts of a file it is
still pulling, serve.py). A member that joins or leaves moves only its own share. A part whose owner has not got it
yet waits at most ``wait_s``, then comes from S3.

Nothing a peer sends is trusted: the bytes land in the same temp file and go through the same verification against
S3's checksums as S3's own (s3pull.py); a file that fails it drops every peer that gave it a part and comes again
from S3 alone. Files S3 gives no checksum for are never taken from a peer (their bytes could not be checked). A
peer that fails a request (refused, reset, too slow, a short body) is dropped for the rest of the pull; one that is
busy (503) or lacks a part is only skipped for that part. With no peer in the directory, every part comes from S3
and the pull is exactly the pull without peers.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from botocore.exceptions import ClientError

from nodewarm import logs

from ..s3client import Retryable
from ..weights import rangeget, sharing
from . import auth
from .auth import PeerKeys, object_path

log = logs.get("bootstrap.weights.peers")

# How long a part waits for the peer that owns it before it comes from S3. Nodes scaling up together fetch their
# shares at the same time, so an owner gets to a part within about one share's transfer time; a part not there by
# then is taken from S3 rather than risk the node's readiness on a slow peer.
WAIT_S = 120.0
# Between two asks for a part its owner did not have yet: short against a part's transfer time, long enough that
# the waiting costs no CPU to speak of.
RETRY_AFTER_S = 0.2
# A peer on the node network answers within these or is dropped (S3's own limits are longer: it is farther away).
CONNECT_TIMEOUT_S, STALL_TIMEOUT_S = 2.0, 5.0
LOW_SPEED_BPS, LOW_SPEED_TIME_S = 5e6, 5.0


@dataclass(frozen=True)
class Peer:
    """One other node of the profile, as its Node annotation says (nodewarm/api/names.py PEER_ANNOTATION)."""
    node: str
    host: str
    port: int
    state: str  # "pulling" | "warm"


@dataclass(frozen=True)
class Choice:
    source: str  # "s3" | "peer" | "wait"
    peer: Peer | None = None


S3, WAIT = Choice("s3"), Choice("wait")


def _score(node: str, rel: str, offset: int) -> bytes:
    return hashlib.blake2b(f"{node}\0{rel}\0{offset}".encode(), digest_size=8).digest()


def owner(members: list[str], rel: str, offset: int) -> str:
    """The member that fetches this part from S3 (rendezvous hashing; pure)."""
    return max(members, key=lambda m: _score(m, rel, offset))


def choose(me: str, peers: list[Peer], rel: str, offset: int, waited_s: float, wait_s: float,
           inflight: Counter, skip: frozenset[str] = frozenset()) -> Choice:
    """Where one part comes from (pure): the least busy warm peer or the pulling owner, else S3, or wait.

    ``peers`` are the live ones (dropped peers already left out); ``skip`` those that could not give this very
    part (busy, or did not hold it); ``waited_s`` how long this part has waited for its owner so far."""
    pulling = [p for p in peers if p.state == "pulling"]
    the_owner = owner([me] + [p.node for p in pulling], rel, offset)
    candidates = [p for p in peers if p.node not in skip and (p.state == "warm" or p.node == the_owner)]
    if candidates:
        least = min(inflight[p.node] for p in candidates)
        return Choice("peer", random.choice([p for p in candidates if inflight[p.node] == least]))
    if the_owner != me and waited_s < wait_s:
        return WAIT  # the owner was asked and does not hold it yet (or is busy): ask again shortly
    return S3


class PeerFailed(sharing.HolderFailed):
    """The peer failed this request in a way that says it should not be asked again in this pull."""


class NotThere(sharing.NotNow):
    """The peer answered but cannot give this range now (does not hold it yet, or is busy)."""

    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.status = status


class PeerSource:
    """The peers one pull may read from: the directory's view, minus those this pull dropped, and the stats (the
    pull's sharing.PartSource)."""

    retry_after_s = RETRY_AFTER_S

    def __init__(self, me: str, directory: Callable[[], list[Peer]], keys: Callable[[], PeerKeys | None],
                 wait_s: float = WAIT_S, low_speed: tuple[float, float] = (LOW_SPEED_BPS, LOW_SPEED_TIME_S)):
        self.me, self._directory, self._keys, self.wait_s = me, directory, keys, wait_s
        self.low_speed_bps, self.low_speed_time_s = low_speed
        self.lock = threading.Lock()
        self.dropped: dict[str, str] = {}  # node -> why
        self.inflight: Counter = Counter()
        self.bytes_from: Counter = Counter()  # node -> verified-later bytes written from it
        self.parts_from: Counter = Counter()
        self.bytes_discarded = 0  # from peers, in files that failed verification
        self.s3_parts = 0

    def live(self) -> list[Peer]:
        if self._keys() is None:
            return []
        with self.lock:
            return [p for p in self._directory() if p.node != self.me and p.node not in self.dropped]

    def choose(self, rel: str, offset: int, waited_s: float, skip: frozenset[str]) -> Choice:
        peers = self.live()
        if not peers:
            return S3
        with self.lock:
            return choose(self.me, peers, rel, offset, waited_s, self.wait_s, self.inflight, skip)

    def drop(self, node: str, why: str) -> None:
        with self.lock:
            if node in self.dropped:
                return
            self.dropped[node] = why
        log.warning("weights.peer_dropped", peer=node, why=why, then="its parts come from S3 or other peers")

    def connections(self) -> PeerConnections:
        """A pull worker's own connections to the peers (``fetch``'s ``conns``)."""
        return PeerConnections()

    def fetch(self, conns: PeerConnections, peer: Peer, rel: str, etag: str, offset: int, length: int,
              buf: memoryview, on_chunk: Callable[[memoryview, int], None], cancelled: threading.Event) -> None:
        """Read ``length`` bytes at ``offset`` of ``rel`` from ``peer`` into ``on_chunk(chunk, bytes_before_it)``, over
        the pull worker's connection to it (``conns``).

        Raises NotThere (ask elsewhere), PeerFailed (drop the peer; the caller has undone its progress) or
        Cancelled."""
        conn = conns.for_peer(peer)
        keys = self._keys()
        if keys is None:
            raise NotThere(401)
        target = object_path(rel, etag)
        rng = f"bytes={offset}-{offset + length - 1}"
        headers = {"Range": rng, "Authorization": auth.sign(keys, self.me, "GET", target, rng)}
        with self.lock:
            self.inflight[peer.node] += 1
        try:
            try:
                resp = conn.get(f"http://{peer.host}:{peer.port}{target}", headers, self.low_speed_time_s)
            except ClientError as e:
                status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if status in (404, 416, 503):
                    raise NotThere(status) from None
                # 401: it does not take this node's key (it has none yet, or a rotation has not reached one of us):
                # asking it again in this pull would only delay the parts it owns.
                raise PeerFailed(f"HTTP {status}") from None
            served = resp.headers.get("content-range", "")
            if not served.startswith(f"bytes {offset}-{offset + length - 1}/") or resp.remaining != length:
                conn.close()
                raise PeerFailed(f"asked for {rng}, got {served!r} ({resp.remaining} bytes)")
            rangeget.read_body(resp, buf, length, on_chunk, cancelled, (self.low_speed_bps, self.low_speed_time_s))
            with self.lock:
                self.bytes_from[peer.node] += length
                self.parts_from[peer.node] += 1
        except (Retryable, OSError) as e:
            conn.close()
            raise PeerFailed(f"{type(e).__name__}: {e}") from None
        except BaseException:
            conn.close()
            raise
        finally:
            with self.lock:
                self.inflight[peer.node] -= 1

    def from_s3(self) -> None:
        """One part the pull takes from S3 (no peer could give it)."""
        with self.lock:
            self.s3_parts += 1

    def discarded(self, nbytes: int) -> None:
        with self.lock:
            self.bytes_discarded += nbytes

    def summary(self) -> dict:
        with self.lock:
            return {"bytesFromPeers": sum(self.bytes_from.values()) - self.bytes_discarded,
                    "bytesDiscarded": self.bytes_discarded,
                    "partsFromPeers": sum(self.parts_from.values()), "partsFromS3": self.s3_parts,
                    "byPeer": dict(self.bytes_from), "dropped": dict(self.dropped)}


class PeerConnections:
    """A pull worker's connections, one per peer (kept alive across parts)."""

    def __init__(self):
        self.conns: dict[tuple[str, int], rangeget.Connection] = {}

    def for_peer(self, peer: Peer) -> rangeget.Connection:
        key = (peer.host, peer.port)
        conn = self.conns.get(key)
        if conn is None:
            conn = self.conns[key] = rangeget.Connection(
                rangeget.Endpoint("http", peer.host, peer.port, f"{peer.host}:{peer.port}"),
                CONNECT_TIMEOUT_S, STALL_TIMEOUT_S, direct=True)
        return conn

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
