"""Warm the node with the model: NVMe proof, listing, plan, capacity, pull + verify, load check.

(Over 300 lines: the order of the weights phases and what each hands the next (listing, plan, capacity, pull and
verify, load check, summary) is one sequence; the phases themselves live in their own modules, and this file is
their orchestration, the lock that guards it and the record it leaves.)

``warm_weights`` is what the node agent calls (``nodewarm bootstrap weights`` is a thin CLI over it).
It returns a ``WeightsSummary`` on success and raises a NodewarmError whose ``reason`` becomes the Node
condition reason on failure; either way the summary is also written to DEST/.nodewarm/summary.json.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from nodewarm import logs
from nodewarm.api.errors import NodewarmError

from .. import confined, s3client
from ..localwrite import write_error
from . import capacity, listing, manifest, mounts, partial, s3pull
from .linking import Linker
from .loadcheck import LoadCheck, LoadCheckFailed, StreamerTuning, check_header, check_loadable
from .manifest import MANIFEST_FILE, STATE_DIR
from .verify import UNVERIFIED
from .progress import Progress
from .sharing import HoldingsSink, PartSource

log = logs.get("bootstrap.weights")

SUMMARY_FILE = "summary.json"
MANIFEST_SAVE_S = 2.0  # how often the manifest is rewritten while files land (see _download)


@dataclass(frozen=True)
class WeightsConfig:
    uri: str
    dest: Path
    allow_non_nvme: bool = False
    mount_wait_s: float = 300.0
    host_root: Path = Path("/")  # where /proc and /sys are read from (tests replay fixture trees)
    headroom: capacity.Headroom = field(default_factory=capacity.Headroom)
    # Fields of s3pull.PullConfig to force; the rest derive from the model's size.
    pull_overrides: dict = field(default_factory=dict)
    load_check: bool = True
    # None: header checks only; set: the first file is also streamed, tuned as the vLLM pod's loader is.
    streamer: StreamerTuning | None = None
    exclude: tuple[str, ...] = ()
    progress_interval_s: float = 5.0
    # Set by whoever runs the pull in a thread (the agent, on SIGTERM): the pull ends as PullStopped.
    stop: threading.Event | None = field(default=None, compare=False)
    # Peers before S3 (sharing.py; the caller hands them in, e.g. from peers/peering.py): where parts may come from,
    # and what this node serves to peers.
    peers: PartSource | None = field(default=None, compare=False)
    holdings: HoldingsSink | None = field(default=None, compare=False)
    # Folders of other models this node holds (on DEST's filesystem): a file of theirs verified with the same bytes
    # as an object to fetch is hard-linked instead (linking.py).
    link_from: tuple[Path, ...] = ()


@dataclass
class WeightsSummary:
    ok: bool
    reason: str  # "WeightsReady", or the failure's CamelCase reason
    message: str
    uri: str
    dest: str
    files: int = 0  # objects of the model, all present and verified when ok
    bytes: int = 0
    downloaded_files: int = 0
    downloaded_bytes: int = 0  # object bytes transferred by this run (resumed parts not counted)
    skipped: int = 0  # unchanged since an earlier run: not transferred
    linked_files: int = 0  # the same bytes held verified in another model's folder: hard-linked, not transferred
    linked_bytes: int = 0
    changed: int = 0  # same key, new ETag/VersionId/checksum: transferred again
    removed: int = 0  # gone from S3, or files of a previous model URI: deleted locally
    unverified: int = 0  # no S3 checksum or MD5 ETag to check against: SHA-256 recorded, not verified
    excluded: list[str] = field(default_factory=list)
    seconds: float = 0.0
    throughput_mb_s: float = 0.0  # downloaded_bytes over the download phase
    phases: dict[str, float] = field(default_factory=dict)
    # Summed over files, inside the download phase (overlapped with other files' transfers). verify_s is
    # the final check only: whole-file hashes are computed while the bytes arrive.
    fsync_s: float = 0.0
    verify_s: float = 0.0
    verified: dict[str, int] = field(default_factory=dict)  # method -> files verified by this run
    storage: dict = field(default_factory=dict)
    load_check: dict | None = None
    pull: dict = field(default_factory=dict)
    peers: dict | None = None  # with peers on: bytes and parts from peers and from S3, peers dropped and why
    first_byte_at: float | None = None  # epoch seconds of the first downloaded byte (None: nothing to fetch)
    first_request_at: float | None = None  # epoch seconds of the first GET sent
    started_at: float | None = None  # epoch seconds warm_weights began (after the process's imports)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


class _Phases:
    def __init__(self, summary: WeightsSummary):
        self.summary = summary

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.summary.phases[name] = round(time.monotonic() - start, 3)


@contextmanager
def _dest_lock(state: Path) -> Iterator[None]:
    # Two agents on one node (a restarted unit racing the old one) must not write the same temp files;
    # the second waits, then finds nothing left to do.
    with open(state / "lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _storage(cfg: WeightsConfig, dest: Path) -> mounts.Storage:
    expected = mounts.cache_mount_for(str(dest))
    if expected and mounts.wait_for_mount(expected, cfg.host_root, cfg.mount_wait_s) is None:
        log.warning("weights.mount_missing", mount_point=expected, waited_s=cfg.mount_wait_s)
    storage = mounts.inspect_storage(str(dest), cfg.host_root)
    log.info("weights.storage", **asdict(storage))
    return storage


def _on_disk(dest: Path, rel_paths: set[str]) -> dict[str, tuple[int, int]]:
    found = {}
    for rel in rel_paths:
        try:
            st = (dest / rel).stat()
        except OSError:
            continue
        found[rel] = (st.st_size, st.st_mtime_ns)
    return found


def _allocated(path: Path) -> int:
    try:
        return path.stat().st_blocks * 512
    except OSError:
        return 0


def warm_weights(cfg: WeightsConfig) -> WeightsSummary:
    """Make DEST hold every object under the S3 prefix, verified, and prove the safetensors load."""
    dest = Path(os.path.abspath(cfg.dest))
    summary = WeightsSummary(ok=False, reason="Failed", message="", uri=cfg.uri, dest=str(dest), started_at=time.time())
    phase = _Phases(summary)
    start = time.monotonic()
    try:
        try:
            _warm(cfg, dest, summary, phase)
        except OSError as e:
            # S3's OSErrors are classified where they happen; one that gets here is the local disk's.
            raise write_error(e, e.filename or dest) from e
        summary.ok, summary.reason = True, "WeightsReady"
        summary.message = (f"{summary.files} files, {summary.bytes / 1e9:.2f} GB in {dest} "
                           f"({summary.downloaded_files} downloaded, {summary.linked_files} linked from other "
                           f"models, {summary.skipped} unchanged)")
        if summary.unverified:
            summary.message += (f"; {summary.unverified} file(s) had no S3 checksum or MD5 ETag: SHA-256 "
                                "recorded, NOT verified against S3 (upload them with a checksum algorithm)")
    except NodewarmError as e:
        summary.reason, summary.message = e.reason, str(e)
        e.summary = summary
        raise
    except BaseException as e:
        summary.reason, summary.message = "Failed", f"{type(e).__name__}: {e}"
        raise
    finally:
        summary.seconds = round(time.monotonic() - start, 3)
        _write_summary(dest, summary)
        log.info("weights.done" if summary.ok else "weights.failed", ok=summary.ok, reason=summary.reason,
                 message=summary.message, files=summary.files, bytes=summary.bytes,
                 downloaded_bytes=summary.downloaded_bytes, seconds=summary.seconds,
                 throughput_mb_s=summary.throughput_mb_s)
    return summary


def _write_summary(dest: Path, summary: WeightsSummary) -> None:
    state = dest / STATE_DIR
    if not state.is_dir():
        return  # failed before anything was written (e.g. not NVMe): create nothing
    tmp = state / (SUMMARY_FILE + ".tmp")
    try:
        tmp.write_text(summary.to_json())
        os.replace(tmp, state / SUMMARY_FILE)
    except OSError as e:  # a full disk must not hide the failure being summarised
        log.warning("weights.summary_not_written", error=str(e))


def _warm(cfg: WeightsConfig, dest: Path, summary: WeightsSummary, phase: _Phases) -> None:
    uri = manifest.parse_s3_uri(cfg.uri)
    with phase("storage"):
        storage = _storage(cfg, dest)
        summary.storage = asdict(storage)  # also on refusal: the node condition reports what backs DEST
        mounts.require_instance_store(storage, cfg.allow_non_nvme)

    base = s3pull.PullConfig(**cfg.pull_overrides)  # timeouts and retries; sizing waits for the listing
    with phase("list"):
        # One client for the listing and the pull: it only lists and signs (the bytes and the HEADs go over
        # rangeget's connections), and each new botocore session costs ~0.1 CPU-s of handler registration.
        client = s3client.make_client(4, base.connect_timeout_s, base.stall_timeout_s)
        listed, summary.excluded = listing.list_keys(client, uri, base.retry, exclude=cfg.exclude)
    rels = {o.key: manifest.rel_path_for(o.key, uri.prefix) for o in listed}
    summary.files, summary.bytes = len(listed), sum(o.size for o in listed)
    if cfg.holdings is not None:  # a peer asks with the ETag it listed: what this node may serve, by that
        cfg.holdings.set_objects([manifest.RemoteObject(o.key, rels[o.key], o.size, o.etag) for o in listed])
    log.info("weights.listed", uri=str(uri), files=summary.files, bytes=summary.bytes,
             excluded=len(summary.excluded))
    tensors = [rel for rel in rels.values() if rel.endswith(".safetensors")]
    if cfg.load_check and not tensors:
        # vLLM's runai_streamer load format reads only safetensors: fail now, not after the download.
        names = list(rels.values())
        raise LoadCheckFailed(f"{uri} has no *.safetensors file (listed: {', '.join(names[:8])}"
                              f"{', ...' if len(names) > 8 else ''}); vLLM's runai_streamer loader reads only "
                              "safetensors: convert the model or point --uri at its safetensors export",
                              reason="NoSafetensors")

    state = dest / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    with _dest_lock(state):
        with phase("plan"):
            local = manifest.load_local(state / MANIFEST_FILE, str(uri))
            remove = manifest.removals(set(rels.values()), local)
            for rel in remove:
                confined.unlink(dest, rel)  # never through a link: the path came from a file on disk
                local.entries.pop(rel, None)
            local.previous = ()
            manifest.save_local(state / MANIFEST_FILE, local)
            on_disk = _on_disk(dest, set(rels.values()) | set(local.entries))
            # The listing sizes the pull and the capacity check before any HEAD; the HEADs then decide each
            # object (manifest.plan: VersionId and checksum too) while the pull already runs.
            likely = [o for o in listed if not manifest.likely_unchanged(o.key, o.size, o.etag, rels[o.key], local, on_disk)]
            _discard_stale_partials(dest, {rels[o.key] for o in likely})
            linker = Linker(dest, cfg.link_from)
            # Linked files take no space and no transfer: neither the capacity check nor the pull's sizing counts them.
            download = [o for o in likely if not linker.likely(o.size, o.etag)]
        summary.removed = len(remove)

        with phase("capacity"):
            # Preallocated partials from an interrupted run already hold their space.
            held = sum(_allocated(partial.partial_paths(dest, rels[o.key])[0]) for o in download)
            need = max(0, sum(o.size for o in download) - held)
            if download:
                capacity.check_fits(capacity.free_space(str(dest)), need, cfg.headroom)

        pull_cfg = s3pull.default_config(sum(o.size for o in download), max((o.size for o in download), default=0),
                                         os.cpu_count() or 1, **cfg.pull_overrides)
        summary.pull = {"concurrency": pull_cfg.concurrency, "part_size": pull_cfg.part_size}
        entries_lock = threading.Lock()  # local.entries: written as files are linked and as they land
        decided = _Decisions(local, on_disk, linker, entries_lock)
        checker = _LoadChecker(dest, cfg.streamer) if cfg.load_check else None
        try:
            objects = listing.heads(client, uri, [o.key for o in listed], base.retry,
                                    (base.connect_timeout_s, base.stall_timeout_s, base.low_speed_time_s))
            # Files this run does not fetch are checked as each is decided; fetched ones as each lands.
            on_keep = _both(checker.submit_one if checker else None,
                            cfg.holdings.mark_verified if cfg.holdings is not None else None)
            with phase("download"):
                _download(client, uri, dest, state, decided.fetching(objects, on_keep), sum(o.size for o in download),
                          local, entries_lock, pull_cfg, summary, cfg.progress_interval_s,
                          on_ready=_both(checker.submit_one if checker else None,
                                         cfg.holdings.mark_verified if cfg.holdings is not None else None),
                          stop=cfg.stop, peers=cfg.peers)
            fetch = decided.fetch
            summary.skipped, summary.changed = len(decided.keep), sum(1 for f in fetch if f.why == "changed")
            summary.linked_files, summary.linked_bytes = len(decided.linked), sum(o.size for o in decided.linked)
            log.info("weights.plan", fetch=len(fetch), fetch_bytes=sum(f.obj.size for f in fetch),
                     unchanged=len(decided.keep), linked=summary.linked_files, linked_bytes=summary.linked_bytes,
                     changed=summary.changed, removed=len(remove),
                     why=dict(Counter(f.why for f in fetch)))
            download_s = summary.phases["download"]
            if summary.downloaded_bytes and download_s > 0:
                summary.throughput_mb_s = round(summary.downloaded_bytes / download_s / 1e6, 1)
            if checker:
                with phase("load_check_tail"):
                    check = checker.result()
                summary.load_check = {**check, "streamer": asdict(cfg.streamer) if cfg.streamer else None,
                                      "overlapped": True}
                log.info("weights.load_check", **summary.load_check)
        finally:
            if checker:
                checker.close()


def _both(*calls):
    """One callback that calls each of ``calls`` that is set (None: none is)."""
    calls = [c for c in calls if c is not None]
    if not calls:
        return None

    def call(*args) -> None:
        for c in calls:
            c(*args)
    return call


class _Decisions:
    """Each object's plan (keep, link from another model's folder, or fetch and why) as its HEAD arrives."""

    def __init__(self, local: manifest.LocalManifest, on_disk: dict[str, tuple[int, int]], linker: Linker,
                 entries_lock: threading.Lock):
        self.local, self.on_disk, self.linker, self.entries_lock = local, on_disk, linker, entries_lock
        self.fetch: list[manifest.Fetch] = []
        self.keep: list[manifest.RemoteObject] = []
        self.linked: list[manifest.RemoteObject] = []

    def fetching(self, objects: Iterator[manifest.RemoteObject], on_keep=None) -> Iterator[manifest.RemoteObject]:
        try:
            for obj in objects:
                plan = manifest.plan([obj], self.local, self.on_disk)
                linked = self.linker.link(obj) if plan.fetch else None
                if linked is not None:
                    with self.entries_lock:
                        self.local.entries[obj.rel_path] = linked
                    self.linked.append(obj)
                    log.info("weights.file_linked", file=obj.rel_path, bytes=obj.size, verified_by=linked.verified_by)
                    if on_keep is not None:
                        on_keep(obj.rel_path)
                elif plan.fetch:
                    self.fetch.append(plan.fetch[0])
                    yield obj
                else:
                    self.keep.append(obj)
                    if on_keep is not None:
                        on_keep(obj.rel_path)
        finally:
            objects.close()


class _LoadChecker:
    """The load check as files land, on its own thread: every safetensors file gets the header check and,
    when ``streamer`` is set, the first one also the streamer read (loadcheck.py says why at most one). Both
    run while the download still fills the page cache with the other files, so after the last byte only that
    file's header check is left (the ``load_check_tail`` phase). Failures surface in ``result()``, naming
    the file."""

    def __init__(self, dest: Path, streamer: StreamerTuning | None):
        from concurrent.futures import ThreadPoolExecutor

        self.dest, self.streamer = dest, streamer
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="load-check")
        self.futures = []
        self.streamed: str | None = None

    def submit(self, rel_paths: list[str]) -> None:
        for rel in rel_paths:
            self.futures.append(self.pool.submit(self._check, rel))

    def submit_one(self, rel_path: str) -> None:
        if rel_path.endswith(".safetensors"):
            self.submit([rel_path])

    def _check(self, rel: str) -> tuple[int, LoadCheck | None]:
        path = self.dest / rel
        tensor_bytes = check_header(path)
        if self.streamer is None or self.streamed is not None:
            return tensor_bytes, None
        self.streamed = rel
        return tensor_bytes, check_loadable([path], self.streamer)

    def result(self) -> dict:
        done = [f.result() for f in self.futures]  # the first failure raises, naming its file
        stream = next((s for _, s in done if s is not None), None)
        return {"files": len(done), "bytes": sum(b for b, _ in done), "header_checked": len(done),
                "streamed_file": self.streamed, "streamed_bytes": stream.bytes if stream else 0,
                "seconds": round(stream.seconds, 3) if stream else 0.0,
                "gb_per_s": round(stream.gb_per_s, 3) if stream else 0.0}

    def close(self) -> None:
        for f in self.futures:
            f.cancel()
        self.pool.shutdown(wait=True)


def _discard_stale_partials(dest: Path, fetching: set[str]) -> None:
    """Remove partial files of objects this run will not fetch (deleted from S3, or complete since):
    nothing else would ever remove them, and they hold their full preallocated size."""
    root = dest / partial.PARTIAL_DIR
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        base = Path(dirpath)
        for name in filenames:
            rel = partial.partial_rel_path(str((base / name).relative_to(root)))
            if rel not in fetching:
                (base / name).unlink(missing_ok=True)
                log.info("weights.partial_removed", file=str((base / name).relative_to(dest)))
        for name in dirnames:
            try:
                (base / name).rmdir()
            except OSError:
                pass  # not empty: partials of a file still to fetch


def _download(client, uri: manifest.S3Uri, dest: Path, state: Path, fetch: Iterator[manifest.RemoteObject],
              expected_bytes: int, local: manifest.LocalManifest, lock: threading.Lock, pull_cfg: s3pull.PullConfig,
              summary: WeightsSummary, interval_s: float, on_ready=None,
              stop: threading.Event | None = None, peers: PartSource | None = None) -> None:
    verified: Counter = Counter()
    saved_at = [time.monotonic()]

    def on_file(done: s3pull.PulledFile) -> None:
        st = done.path.stat()
        entry = manifest.LocalEntry(rel_path=done.obj.rel_path, key=done.obj.key, size=done.obj.size,
                                    etag=done.obj.etag, version_id=done.obj.version_id,
                                    checksum=done.obj.checksum, verified_by=done.verified_by,
                                    mtime_ns=st.st_mtime_ns, sha256=done.sha256)
        with lock:
            local.entries[done.obj.rel_path] = entry
            # Rewritten at most every MANIFEST_SAVE_S and once at the end, not per file: each save writes
            # every entry and fsyncs, so per file it was quadratic (0.9 CPU-s for 256 files here). A crash
            # in between costs only re-fetching the files verified since the last save (a file on disk
            # without its entry is fetched again, never trusted).
            if time.monotonic() - saved_at[0] >= MANIFEST_SAVE_S:
                manifest.save_local(state / MANIFEST_FILE, local)
                saved_at[0] = time.monotonic()
            verified[done.verified_by] += 1
            summary.unverified += done.verified_by == UNVERIFIED
            summary.downloaded_files += 1
            summary.downloaded_bytes += done.obj.size - done.resumed_bytes
            summary.fsync_s = round(summary.fsync_s + done.fsync_s, 3)
            summary.verify_s = round(summary.verify_s + done.verify_s, 3)
        log.info("weights.file_ready", file=done.obj.rel_path, bytes=done.obj.size, verified_by=done.verified_by,
                 resumed_bytes=done.resumed_bytes)
        if on_ready is not None:
            on_ready(done.obj.rel_path)

    log.info("weights.download", bytes=expected_bytes, concurrency=pull_cfg.concurrency, part_size=pull_cfg.part_size)
    try:
        with Progress("download", expected_bytes, interval_s) as progress:
            try:
                s3pull.pull(client, uri.bucket, fetch, dest, pull_cfg, progress, on_file, stop, peers)
            finally:
                if peers is not None:
                    summary.peers = peers.summary()
                    log.info("weights.peers", **summary.peers)
                summary.first_byte_at, summary.first_request_at = progress.first_byte_at, progress.first_request_at
    finally:
        summary.verified = dict(verified)
        with lock:  # the pull's threads have stopped; a failed run keeps what it verified, too
            manifest.save_local(state / MANIFEST_FILE, local)
