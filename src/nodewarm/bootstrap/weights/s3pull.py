"""The transfer: parallel ranged GETs across and within files into preallocated temp files.

(Over 300 lines: the transfer is one concurrency design. The shared part queue, each file's state, the journaled
resume and the verification on the way all coordinate on the same locks and part bookkeeping; split, the invariants
below would be spread over modules.)

Each file is split into parts; one shared pool of threads works through all parts of all files, so a
model of one huge file and one of many shards both keep every connection busy. Each thread owns one
connection and one buffer (rangeget.py): bytes go socket -> buffer -> pwrite, hashed on the way.

Verification comes out of the download itself. Parts follow the object's upload parts when S3's check
is built from parts (composite checksums, "-N" MD5 ETags), and each part is hashed with the check's own
algorithm as it lands, in the thread that fetched it; a full-object CRC is combined from its parts'
CRCs. Whole-file hashes that cannot be split (a single-part MD5 ETag, SHA checksums) are fed in order
from the page cache as the contiguous prefix grows. Either way nothing is read back after the transfer.

Finished parts are journaled next to the temp file with their digest, so a restart resumes at part
granularity; a journaled part is trusted again only when its bytes still have that digest (after a host
crash the journal can be durable while the data is not: zero-filled ranges of the preallocated file).
A torn journal line is ignored. A file that fails verification is fetched again, a bounded number of
times. A file becomes visible under its real name only after fsync and verification (verify.py), by
rename; nothing half-written ever has a final name.
"""

from __future__ import annotations

import ctypes
import heapq
import json
import math
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from nodewarm import logs
from nodewarm.api.errors import NodewarmError

from .. import confined
from ..localwrite import InsufficientNVMe, write_error
from ..s3client import Cancelled, ObjectChanged, RetryPolicy, S3Unavailable, call_with_retries
from . import rangeget, throttle
from .manifest import RemoteObject
from .partial import parse_journal, partial_paths
from .progress import Progress
from .sharing import Connections, HolderFailed, NotNow, PartSource
from .verify import (
    UNVERIFIED, StreamHash, VerifyFailed, aligned_part_size, hasher_factory, method_for, part_digest_algorithm,
    verify_file,
)

log = logs.get("bootstrap.weights")

MiB = 1024**2
# Per-thread buffer: pwrite and hashing run once per chunk, so per-chunk Python work stays negligible.
READ_CHUNK = 4 * MiB
# How long one presigned URL serves an object's parts (see _Pull._url).
URL_REUSE_S = 300.0
# How often the feeding thread looks at ``stop`` while the workers run: a stopped agent leaves within this.
STOP_POLL_S = 0.25


@dataclass(frozen=True)
class PullConfig:
    concurrency: int = 32
    part_size: int = 16 * MiB
    connect_timeout_s: float = 5.0
    stall_timeout_s: float = 10.0  # no byte for this long on a connection: drop it and retry the part
    request_timeout_s: float = 120.0  # one ranged GET may take no longer than this
    low_speed_limit_bps: float = 1e6  # like the streamer's S3_LOW_SPEED_LIMIT: slower than this ...
    low_speed_time_s: float = 10.0  # ... for this long: drop the connection and retry the part
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    verify_workers: int = 4
    verify_attempts: int = 3  # downloads of one file whose bytes fail verification, before giving up
    # A pull while the node serves (spec.weights.background): bytes/s over all its connections together (S3 and
    # peers), and the CPU nice (with the idle I/O class) of its threads; see throttle.py.
    max_bps: float | None = None
    nice: int = 0


def default_config(total_bytes: int, largest_bytes: int, cpus: int, **overrides) -> PullConfig:
    """Part size and concurrency from the model's size and the CPU count (pure).

    Start from the reference's concurrency = ceil(size / part), capped at 4 connections per CPU and 64
    in all: the threads share one GIL, and measured on 2 cores (bench/weights.py) 8 connections moved
    as much as 16 or 32 for less CPU. 8-16 MiB parts are S3's sweet spot for ranged GETs; a file whose
    S3 check is built from its upload parts is fetched in those parts instead (verify.aligned_part_size).
    """
    part = 8 * MiB if largest_bytes <= 1024 * MiB else 16 * MiB
    concurrency = max(1, min(64, 4 * cpus, math.ceil(total_bytes / part)))
    return PullConfig(**{"concurrency": concurrency, "part_size": part, **overrides})


@dataclass(frozen=True)
class PulledFile:
    obj: RemoteObject
    path: Path
    verified_by: str
    resumed_bytes: int
    fsync_s: float
    verify_s: float
    sha256: str | None = None  # hex, recorded for files S3 gave no checksum for (verified_by UNVERIFIED)


class _File:
    """One object being written: its temp file, which parts are still missing, its journal."""

    def __init__(self, obj: RemoteObject, dest: Path, part_size: int):
        self.obj, self.final = obj, dest / obj.rel_path
        self.temp, self.journal_path = partial_paths(dest, obj.rel_path)
        self.lock = threading.Lock()
        self.method = method_for(obj)
        self.part_algorithm = part_digest_algorithm(self.method)
        self.new_part_hash = hasher_factory(self.part_algorithm)
        self.header = {"key": obj.key, "etag": obj.etag, "version_id": obj.version_id, "size": obj.size,
                       "part_size": aligned_part_size(self.method) or part_size,
                       "part_digest": self.part_algorithm}
        journaled = self._load_journal()
        if journaled is None:
            journaled = {}
            self._reset()
        self.part_size = self.header["part_size"]
        self.n_parts = math.ceil(obj.size / self.part_size)
        # part -> digest of its bytes (part_algorithm), for every part on disk
        self.done = self._still_intact({i: d for i, d in journaled.items() if i < self.n_parts})
        self.missing = [i for i in range(self.n_parts) if i not in self.done]
        self.remaining = len(self.missing)
        self.resumed_bytes = sum(self.part_len(i) for i in self.done)
        # The part source (sharing.py, e.g. peers/fetch.py): which parts came from which peer, when each part began
        # to wait for its owner, and whether this file now comes from S3 alone (a file with a peer's part failed
        # verification).
        self.from_peer: dict[int, str] = {}
        self.waiting_since: dict[int, float] = {}
        self.s3_only = self.method.expected is None  # bytes nothing could check never come from a peer
        self.hash_lock = threading.Lock()
        self._start_hash()
        self._open()

    def _open(self) -> None:
        try:
            self.fd = os.open(self.temp, os.O_RDWR)
            self.journal = open(self.journal_path, "a")
        except OSError as e:
            raise write_error(e, self.temp) from e

    def _start_hash(self) -> None:
        self.stream = StreamHash(self.method) if StreamHash.applies(self.method) else None
        self.hashed_to = 0  # bytes fed to self.stream, always at a part boundary
        self.finishing = False

    def hash_ready_parts(self) -> None:
        """Feed the stream hash every part that now continues the hashed prefix (from the page cache).

        Whoever holds hash_lock hashes; a thread that finds it taken leaves its part to the holder,
        which looks again after releasing, so no landed part is left behind.
        """
        if self.stream is None:
            return
        while self.hash_lock.acquire(blocking=False):
            try:
                while (i := self._next_to_hash()) is not None:
                    self.stream.update_from(self.fd, self.hashed_to, self.part_len(i))
                    self.hashed_to += self.part_len(i)
            finally:
                self.hash_lock.release()
            if self._next_to_hash() is None:
                return

    def _next_to_hash(self) -> int | None:
        with self.lock:
            if self.hashed_to >= self.obj.size:
                return None
            i = self.hashed_to // self.part_size
            return i if i in self.done else None

    def claim_finish(self) -> bool:
        """True exactly once: when every part is on disk and hashed."""
        with self.lock:
            hashed = self.stream is None or self.hashed_to == self.obj.size
            if self.remaining or not hashed or self.finishing:
                return False
            self.finishing = True
            return True

    def part_digests(self) -> tuple[list[bytes], list[int]] | None:
        """Every part's digest and size, in order, when they make up the method's check."""
        if self.part_algorithm != self.method.algorithm or self.method.expected is None:
            return None
        return [self.done[i] for i in range(self.n_parts)], [self.part_len(i) for i in range(self.n_parts)]

    def _load_journal(self) -> dict[int, bytes] | None:
        """Parts an earlier run journaled for the very same object version and layout (part -> digest),
        else None."""
        try:
            parsed = parse_journal(self.journal_path.read_text().splitlines(keepends=True))
            if parsed is None or self.temp.stat().st_size != self.obj.size:
                return None
        except (OSError, ValueError):
            return None
        header, parts = parsed
        same = ("key", "etag", "version_id", "size", "part_digest")
        if {k: header.get(k) for k in same} != {k: self.header[k] for k in same}:
            return None
        try:
            self.header["part_size"] = int(header["part_size"])  # resume needs the earlier layout
        except (KeyError, TypeError, ValueError):
            return None
        if self.header["part_size"] < 1:
            return None
        return parts

    def _still_intact(self, journaled: dict[int, bytes]) -> dict[int, bytes]:
        """The journaled parts whose bytes still have the digest written with them."""
        if not journaled:
            return {}
        intact = {}
        fd = os.open(self.temp, os.O_RDONLY)
        try:
            for i, want in sorted(journaled.items()):
                h, off, left = self.new_part_hash(), i * self.part_size, self.part_len(i)
                while left:
                    data = os.pread(fd, min(left, 8 * MiB), off)
                    if not data:
                        break
                    h.update(data)
                    off, left = off + len(data), left - len(data)
                if not left and h.digest() == want:
                    intact[i] = want
        finally:
            os.close(fd)
        if len(intact) < len(journaled):
            log.warning("weights.resume_parts_lost", file=self.obj.rel_path, journaled=len(journaled),
                        intact=len(intact))
        return intact

    def _reset(self) -> None:
        try:
            self.temp.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                if self.obj.size:
                    # Claim the space now: a full disk fails here, before any download, not midway.
                    os.posix_fallocate(fd, 0, self.obj.size)
            finally:
                os.close(fd)
            self.journal_path.write_text(json.dumps(self.header) + "\n")
        except OSError as e:
            raise write_error(e, self.temp) from e

    def journal_part(self, i: int, digest: bytes) -> None:
        try:
            self.journal.write(f"{i} {digest.hex()}\n")
            self.journal.flush()
        except OSError as e:
            raise write_error(e, self.journal_path) from e

    def part_len(self, i: int) -> int:
        return min(self.part_size, self.obj.size - i * self.part_size)

    def restart(self) -> None:
        """Forget every part (verification failed): download the whole file again."""
        self.close()
        self._reset()
        self.done = {}
        self.missing = list(range(self.n_parts))
        self.remaining = len(self.missing)
        self.resumed_bytes = 0
        self.from_peer, self.waiting_since = {}, {}
        self._start_hash()
        self._open()

    def close(self) -> None:
        # Idempotent: closing a stale fd number twice could close a socket that reused it.
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.journal.close()


class _Landing:
    """One part's bytes as they arrive, from S3 or a peer: written in place, hashed, counted; undone on failure."""

    def __init__(self, pull: "_Pull", f: _File, offset: int):
        self.pull, self.f, self.offset = pull, f, offset
        self.hash, self.got = f.new_part_hash(), 0

    def __call__(self, chunk: memoryview, before: int) -> None:
        self.pull._write(self.f, chunk, self.offset + before)
        self.hash.update(chunk)
        self.got += len(chunk)
        self.pull.progress.add(len(chunk))
        # Not reading the socket meanwhile is the cap: TCP flow control holds the sender back.
        if self.pull.throttle is not None and not self.pull.throttle.take(len(chunk)):
            raise Cancelled()

    def undo(self) -> None:
        self.pull.progress.add(-self.got)


_sync_file_range = getattr(ctypes.CDLL(None), "sync_file_range", None)
_SYNC_FILE_RANGE_WRITE = 2


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Queue a finished part for writeback now, without waiting (Linux sync_file_range), so the file's
    fsync before rename finds little left to flush: measured here, fsync time fell from ~0.6 s to
    ~0.03 s per GiB and the verified pull got ~1.6x faster. Advisory: errors are ignored."""
    if _sync_file_range is not None:
        _sync_file_range(fd, ctypes.c_int64(offset), ctypes.c_int64(length), _SYNC_FILE_RANGE_WRITE)


class _Pull:
    def __init__(self, client, bucket: str, dest: Path, config: PullConfig,
                 progress: Progress, on_file: Callable[[PulledFile], None], stop: threading.Event | None = None,
                 peers: PartSource | None = None):
        self.client, self.bucket, self.dest, self.cfg = client, bucket, dest, config
        self.stop, self.peers = stop, peers
        self.ssl_context = rangeget.ssl_context_for(client) if client.meta.endpoint_url.startswith("https") else None
        self.progress, self.on_file = progress, on_file
        self.cancelled = threading.Event()
        self.throttle = (throttle.TokenBucket(config.max_bps, time.monotonic, self.cancelled.wait)
                         if config.max_bps is not None else None)
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.all_done = threading.Event()
        self.tasks: queue.Queue = queue.Queue()
        # Parts waiting for the peer that owns them (the part source said "wait"): (when to ask again, seq, file,
        # part), taken only when no other part is queued, so a worker never idles while there is work it can do.
        self.deferred: list[tuple[float, int, _File, int]] = []
        self._deferred_seq = 0
        self.files: list[_File] = []
        self.urls: dict[str, tuple[str, float]] = {}  # key -> (presigned URL, monotonic time signed)
        self.verify_failures: dict[str, int] = {}
        self.pending = 0  # files added and not yet renamed into place
        self.feeding = True  # more files may still be added

    def add(self, obj: RemoteObject, verifier: ThreadPoolExecutor) -> None:
        """Prepare one object's temp file (preallocated: a full disk fails here, before its GETs) and queue
        its missing parts; the workers may already be busy with earlier files."""
        try:
            f = _File(obj, self.dest, self.cfg.part_size)
        except InsufficientNVMe:
            _discard_partials(self.dest, [obj])  # the others' go when run() stops (they are in self.files)
            raise
        with self.lock:
            self.files.append(f)
            self.pending += 1
        self.progress.add(f.resumed_bytes)
        if f.done or f.remaining == 0:
            verifier.submit(self._resume, f)  # hash what an earlier run left (or an empty file)
        for i in f.missing:
            self.tasks.put((f, i))

    def _file_done(self) -> None:
        with self.lock:
            self.pending -= 1
            if self.pending == 0 and not self.feeding:
                self.all_done.set()

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if self.error is None:
                self.error = exc
        self.cancelled.set()
        self.all_done.set()

    def _stopped(self) -> bool:
        """``stop`` set: fail the pull as PullStopped (every worker stops at its next chunk)."""
        if self.stop is None or not self.stop.is_set():
            return False
        self.fail(NodewarmError("the pull was stopped (the agent is shutting down); verified files stay, partial "
                                "ones resume on the next run", reason="PullStopped"))
        return True

    def _close_all(self) -> None:
        for f in self.files:
            f.close()

    def _url(self, obj: RemoteObject) -> str:
        """A presigned GET for ``obj``, shared by all its parts while it is younger than URL_REUSE_S.

        Signing costs ~0.7 ms of CPU in botocore, once per part before (~10% of the pull's CPU per GB). A
        presigned URL signs the host, not the Range header, so one serves every part. Reuse stays far
        inside what the signing credentials are still valid for: botocore refreshes temporary credentials
        before their last 10 minutes, and a URL outlives neither them nor ExpiresIn."""
        now = time.monotonic()
        cached = self.urls.get(obj.key)
        if cached is not None and now - cached[1] < URL_REUSE_S:
            return cached[0]
        params = {"Bucket": self.bucket, "Key": obj.key}
        if obj.version_id:
            params["VersionId"] = obj.version_id  # a new upload mid-run cannot mix into this file
        url = self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=3600)
        self.urls[obj.key] = (url, now)  # racing threads may both sign: harmless, the last one is kept
        return url

    def _get_part(self, f: _File, i: int, conn: "_Conn", buf: memoryview) -> bytes:
        """Fetch part ``i`` into place; returns the digest (f.part_algorithm) of the bytes written."""
        off, length = i * f.part_size, f.part_len(i)
        what = f"GET s3://{self.bucket}/{f.obj.key} bytes {off}-{off + length - 1}"
        headers = {"Range": f"bytes={off}-{off + length - 1}"}
        if not f.obj.version_id and f.obj.etag:
            headers["If-Match"] = f'"{f.obj.etag}"'
        cfg = self.cfg

        def attempt() -> bytes:
            landing = _Landing(self, f, off)
            try:
                url = self._url(f.obj)
                self.progress.request_sent()
                resp = conn.get(url, headers)
                etag = resp.headers.get("etag", "").strip('"')
                if etag and f.obj.etag and etag != f.obj.etag:
                    # Servers that ignore If-Match (and unversioned buckets) still tell us via the ETag.
                    raise ObjectChanged(f"s3://{self.bucket}/{f.obj.key} changed while we were pulling it "
                                        f"(ETag {f.obj.etag} -> {etag}); run again to fetch the new version")
                served = resp.headers.get("content-range", f"bytes 0-{f.obj.size - 1}/{f.obj.size}")
                if not served.startswith(f"bytes {off}-{off + length - 1}/") or resp.remaining != length:
                    raise S3Unavailable(f"s3://{self.bucket}/{f.obj.key}: asked for bytes {off}-{off + length - 1}, "
                                        f"the server sent {served!r} ({resp.remaining} bytes); it does not honour "
                                        "Range requests")
                rangeget.read_body(resp, buf, length, landing, self.cancelled,
                                   (cfg.low_speed_limit_bps, cfg.low_speed_time_s), cfg.request_timeout_s)
                return landing.hash.digest()
            except BaseException:
                conn.close()  # mid-body: the connection's position in the stream is unknown
                landing.undo()  # those bytes are fetched again
                raise

        return call_with_retries(attempt, what, cfg.retry, self.cancelled)

    def _fetch(self, f: _File, i: int, conn: "_Conn", peer_conns: Connections | None,
               buf: memoryview) -> bytes | None:
        """Part ``i`` from a peer when one may give it (the part source, sharing.py), else from S3; its digest, or
        None: wait for its owner and come back to it."""
        if self.peers is not None and not f.s3_only:
            off, length, skip = i * f.part_size, f.part_len(i), set()
            while True:
                now = time.monotonic()
                choice = self.peers.choose(f.obj.rel_path, off, now - f.waiting_since.get(i, now), frozenset(skip))
                if choice.source == "wait":
                    f.waiting_since.setdefault(i, now)
                    return None
                if choice.source == "s3":
                    break
                peer, landing = choice.peer, _Landing(self, f, off)
                try:
                    self.peers.fetch(peer_conns, peer, f.obj.rel_path, f.obj.etag, off, length, buf,
                                     landing, self.cancelled)
                except BaseException as e:
                    landing.undo()  # not kept: those bytes come again
                    if isinstance(e, HolderFailed):
                        self.peers.drop(peer.node, str(e))
                    elif not isinstance(e, NotNow):
                        raise
                    skip.add(peer.node)
                    continue
                with f.lock:
                    f.from_peer[i] = peer.node
                return landing.hash.digest()
            self.peers.from_s3()
        return self._get_part(f, i, conn, buf)

    def _write(self, f: _File, data: memoryview, offset: int) -> None:
        try:
            while data:
                n = os.pwrite(f.fd, data, offset)
                data, offset = data[n:], offset + n
        except OSError as e:
            raise write_error(e, f.temp) from e

    def _worker(self, verifier: ThreadPoolExecutor) -> None:
        throttle.lower_thread_priority(self.cfg.nice)
        conn = _Conn(self.cfg, self.ssl_context)
        peer_conns = self.peers.connections() if self.peers is not None else None
        buf = memoryview(bytearray(READ_CHUNK))
        try:
            self._work(verifier, conn, peer_conns, buf)
        finally:
            conn.close()
            if peer_conns is not None:
                peer_conns.close()

    def _work(self, verifier: ThreadPoolExecutor, conn: "_Conn", peer_conns: Connections | None,
              buf: memoryview) -> None:
        while True:
            item = self._next_task()
            if item is None or self.cancelled.is_set():
                return
            f, i = item
            try:
                digest = self._fetch(f, i, conn, peer_conns, buf)
                if digest is None:  # its owner does not hold it yet: ask again a little later
                    with self.lock:
                        self._deferred_seq += 1
                        heapq.heappush(self.deferred, (time.monotonic() + self.peers.retry_after_s,
                                                       self._deferred_seq, f, i))
                    continue
                _start_writeback(f.fd, i * f.part_size, f.part_len(i))
                with f.lock:
                    f.journal_part(i, digest)
                    f.done[i] = digest
                    f.remaining -= 1
                f.hash_ready_parts()
                if f.claim_finish():
                    verifier.submit(self._finish, f)
            except Cancelled:
                return
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                self.fail(e)
                return

    def _next_task(self) -> tuple[_File, int] | None:
        """The next queued part; a deferred one once it is due and nothing else is queued."""
        while True:
            with self.lock:
                due = self.deferred[0][0] if self.deferred else None
                if due is not None and due <= time.monotonic() and self.tasks.empty():
                    _, _, f, i = heapq.heappop(self.deferred)
                    return f, i
            if due is not None:
                wait = max(0.005, due - time.monotonic())
            else:  # with peers, a part another worker defers meanwhile must not wait for that worker alone
                wait = None if self.peers is None else self.peers.retry_after_s
            try:
                return self.tasks.get(timeout=wait)
            except queue.Empty:
                if self.cancelled.is_set():
                    return None

    def _resume(self, f: _File) -> None:
        try:
            f.hash_ready_parts()
            if f.claim_finish():
                self._finish(f)
        except BaseException as e:  # noqa: BLE001
            self.fail(e)

    def _finish(self, f: _File) -> None:
        """fsync, verify, rename: the only way a file gets its final name."""
        try:
            start = time.monotonic()
            try:
                os.fsync(f.fd)
            except OSError as e:
                raise write_error(e, f.temp) from e
            synced = time.monotonic()
            try:
                method = verify_file(f.temp, f.obj, streamed=f.stream, part_digests=f.part_digests())
            except VerifyFailed as e:
                if f.from_peer:
                    # A peer's bytes in a file that failed: every peer that gave a part is dropped (the check is
                    # over the whole file, so which part lied is unknown) and the file comes again from S3 alone.
                    # Not counted against the S3 attempts: S3's bytes were not the ones on trial.
                    from_peers = sum(f.part_len(i) for i in f.from_peer)
                    for node in sorted(set(f.from_peer.values())):
                        self.peers.drop(node, f"a file with its parts failed verification ({f.obj.rel_path}: {e})")
                    self.peers.discarded(from_peers)
                    self.progress.add(-f.obj.size)
                    f.restart()
                    f.s3_only = True
                    for i in f.missing:
                        self.tasks.put((f, i))
                    return
                # Corrupted in transit (or on disk): fetch the whole file again, a bounded number of times.
                failures = self.verify_failures[f.obj.rel_path] = self.verify_failures.get(f.obj.rel_path, 0) + 1
                if failures >= self.cfg.verify_attempts:
                    raise VerifyFailed(f"{e} ({failures} downloads failed verification)") from None
                log.warning("weights.verify_retry", file=f.obj.rel_path, error=str(e), attempt=failures)
                self.progress.add(-f.obj.size)  # resumed and fetched bytes alike: all of it comes again
                f.restart()
                for i in f.missing:
                    self.tasks.put((f, i))
                return
            verified = time.monotonic()
            sha256 = f.stream.hexdigest() if method == UNVERIFIED and f.stream is not None else None
            f.close()
            try:
                # Never through a link: DEST's subfolders are not ours alone to trust.
                parent = confined.replace(f.temp, self.dest, f.obj.rel_path)
                try:
                    os.fsync(parent)
                finally:
                    os.close(parent)
                f.journal_path.unlink(missing_ok=True)
            except OSError as e:
                raise write_error(e, f.final) from e
            self.on_file(PulledFile(f.obj, f.final, method, f.resumed_bytes, synced - start, verified - synced,
                                    sha256))
            self._file_done()
        except BaseException as e:  # noqa: BLE001
            self.fail(e)

    def run(self, objects: Iterable[RemoteObject]) -> None:
        verifier = ThreadPoolExecutor(max_workers=self.cfg.verify_workers, thread_name_prefix="verify",
                                      initializer=throttle.lower_thread_priority, initargs=(self.cfg.nice,))
        threads = [threading.Thread(target=self._worker, args=(verifier,), name=f"s3get-{n}", daemon=True)
                   for n in range(self.cfg.concurrency)]
        try:
            if self._stopped():
                objects = ()
            if isinstance(objects, (list, tuple)):
                # All known up front: every file is preallocated before the first GET.
                for obj in objects:
                    self.add(obj, verifier)
                objects = ()
            for t in threads:
                t.start()
            for obj in objects:  # a stream (the HEADs still under way): each file's GETs start at once
                if self._stopped() or self.cancelled.is_set():
                    break
                self.add(obj, verifier)
            with self.lock:
                self.feeding = False
                if self.pending == 0:
                    self.all_done.set()
            while not self.all_done.wait(STOP_POLL_S):
                self._stopped()
        except BaseException as e:  # KeyboardInterrupt: stop the workers, keep partials for resume
            self.fail(e)
        finally:
            close = getattr(objects, "close", None)
            if close is not None:
                close()  # a stream left early (a failure): cancel the HEADs it has not sent yet
            for _ in threads:
                self.tasks.put(None)
            for t in threads:
                if t.ident is not None:  # started
                    t.join()
            verifier.shutdown(wait=True)
            self._close_all()
        if self.error is not None:
            if isinstance(self.error, InsufficientNVMe):
                _discard_partials(self.dest, [f.obj for f in self.files])
            raise self.error


class _Conn:
    """A worker's connection, opened for the endpoint of the URL it is asked for (one bucket: one host)."""

    def __init__(self, cfg: PullConfig, ssl_context):
        self.cfg, self.ssl_context = cfg, ssl_context
        self.conn: rangeget.Connection | None = None

    def get(self, url: str, headers: dict[str, str]) -> rangeget.Response:
        endpoint = rangeget.endpoint_of(url)
        if self.conn is None or self.conn.endpoint != endpoint:
            self.close()
            self.conn = rangeget.Connection(endpoint, self.cfg.connect_timeout_s, self.cfg.stall_timeout_s,
                                            self.ssl_context)
        return self.conn.get(url, headers, self.cfg.low_speed_time_s)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def _discard_partials(dest: Path, objects: list[RemoteObject]) -> None:
    # The RAID also holds kubelet, containerd and pod logs: give the space back rather than keep
    # partial files for a resume that cannot fit anyway.
    for obj in objects:
        for p in partial_paths(dest, obj.rel_path):
            p.unlink(missing_ok=True)


def pull(client, bucket: str, objects: Iterable[RemoteObject], dest: Path, config: PullConfig,
         progress: Progress, on_file: Callable[[PulledFile], None], stop: threading.Event | None = None,
         peers: PartSource | None = None) -> None:
    """Download ``objects`` into ``dest`` (their rel paths), calling ``on_file`` as each one is verified.

    ``objects`` may be a list (every file is preallocated before the first GET) or an iterator still
    producing them (the pipeline's HEADs): then each file's GETs start as soon as it arrives, and an error
    raised by the iterator stops the pull like any other.
    Raises the first fatal error (NodewarmError with a reason) after stopping every worker; files that
    were already verified stay, partial ones stay under .nodewarm/partial/ for the next run (except on
    a full disk). ``stop`` set (the agent is being stopped) ends the pull the same way, as PullStopped.
    ``peers`` set: parts come from that other source first (sharing.PartSource, e.g. peers/fetch.py's PeerSource),
    verified all the same.
    """
    _Pull(client, bucket, dest, config, progress, on_file, stop, peers).run(objects)
