"""What the pull shares with other nodes, as seams it is handed: another source of its parts, and a sink for what it
holds.

The pull knows no peer. Whoever assembles it (modelcache/warmer.py, from peers/peering.py) hands it, in
WeightsConfig, a ``PartSource`` (peers/fetch.py's PeerSource) and a ``HoldingsSink`` (peers/holdings.py's Holdings).
Bytes from a part source are trusted no more than S3's: they land in the same temp file and go through the same
verification (s3pull.py); a file that fails it drops every holder that gave it a part and comes again from S3 alone.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable, Protocol

from .manifest import RemoteObject


class HolderFailed(Exception):
    """A holder failed a request in a way that says it should not be asked again in this pull (the pull drops it)."""


class NotNow(Exception):
    """A holder answered but cannot give this range now (does not hold it yet, or is busy): ask elsewhere."""


class Holder(Protocol):
    """One node a part source may read a part from (peers/fetch.py's Peer)."""

    @property
    def node(self) -> str: ...


class Choice(Protocol):
    """Where one part comes from: ``source`` "s3", "peer" (from ``peer``) or "wait" (ask again after
    ``PartSource.retry_after_s``)."""

    @property
    def source(self) -> str: ...

    @property
    def peer(self) -> Holder | None: ...


class Connections(Protocol):
    """One pull worker's connections to the source's holders, kept across parts; closed when the worker ends."""

    def close(self) -> None: ...


class PartSource(Protocol):
    """Another source of the pull's parts than S3, asked first for each part of a file S3 gives a checksum for."""

    @property
    def retry_after_s(self) -> float:
        """How long a part told to wait stays deferred before the pull asks again."""
        ...

    def connections(self) -> Connections: ...

    def choose(self, rel: str, offset: int, waited_s: float, skip: frozenset[str]) -> Choice:
        """Where the part at ``offset`` of ``rel`` comes from; ``waited_s``: how long it has waited so far,
        ``skip``: the holders that could not give this very part."""
        ...

    def fetch(self, conns: Connections, holder: Holder, rel: str, etag: str, offset: int, length: int,
              buf: memoryview, on_chunk: Callable[[memoryview, int], None], cancelled: threading.Event) -> None:
        """Read ``length`` bytes at ``offset`` of ``rel`` (at ``etag``) from ``holder`` into
        ``on_chunk(chunk, bytes_before_it)``, over the worker's ``conns``. Raises NotNow, HolderFailed or
        s3client.Cancelled; the pull undoes the part's progress on any of them."""
        ...

    def drop(self, node: str, why: str) -> None:
        """Ask ``node`` nothing more in this pull."""
        ...

    def from_s3(self) -> None:
        """One part the pull takes from S3 (no holder could give it)."""
        ...

    def discarded(self, nbytes: int) -> None:
        """Bytes from holders thrown away with a file that failed verification."""
        ...

    def summary(self) -> dict:
        """What came from where, for the pull's summary (WeightsSummary.peers)."""
        ...


class HoldingsSink(Protocol):
    """What this node holds of the model, told as the pull learns it (peers serve exactly that)."""

    def set_objects(self, objects: Iterable[RemoteObject]) -> None:
        """The model's objects as listed (replaces any earlier list); none of them verified here yet."""
        ...

    def mark_verified(self, rel_path: str) -> None:
        """``rel_path`` is in place and verified (kept, linked or landed)."""
        ...
