"""Publish a node's compile caches: once per key, and again when the current bundle is proven stale.

(Over 300 lines: the publish protocol is one piece. When to publish, the generation and staleness rules and the
conditional or claimed commit each rely on what the others guarantee about the envelope; split, the argument below
that two publishers cannot both win would span files.)

The publisher (a sidecar next to vLLM) watches the cache roots with watchdog. When a compile has finished
(new compiled artifacts on disk, then no file activity for ``quiet_s``) it packs the roots into a
deterministic bundle, uploads it under its content hash, and commits it by writing the signed envelope
``<prefix>/<key_id>.json``, whose manifest carries a *generation*:

* no envelope yet: generation 1, written with ``PUT If-None-Match: *`` where the server honours it;
* the envelope's generation N is stale (a ``.stale/N`` marker from a proven miss in serving, a vLLM hash
  dir this node has and the bundle lacks, or a bundle that no longer verifies): generation N+1 replaces it
  with ``PUT If-Match: <ETag read>``, so of two publishers replacing N exactly one wins;
* servers that ignore preconditions (rclone, probed at start): the *claim* protocol. Each writer PUTs a
  uniquely named claim ``<key_id>.json.claims/g<N>/<epoch-ms>-<uuid>``, waits ``settle_s`` for the listing
  to catch up, and only the writer with the oldest live claim (younger than ``claim_ttl_s``, so a crashed
  writer cannot block forever) writes, after checking the envelope is still at the generation it read,
  then reads it back. Two writers can only both win with clocks skewed by more than ``settle_s`` and a race
  inside that window; even then readers stay safe, because an envelope always names its own immutable,
  content-addressed blob: the worst case is one envelope replaced by another valid one.
"""

from __future__ import annotations

import json
import re
import socket
import tempfile
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from watchdog.events import (EVENT_TYPE_CLOSED_NO_WRITE, EVENT_TYPE_OPENED, FileSystemEvent,
                             FileSystemEventHandler)
from watchdog.observers import Observer

from nodewarm import logs
from nodewarm.api.errors import NodewarmError

from . import bundle, cachekey, hitcheck, runtimedesc, signing
from .cachestore import CacheStore, blob_key, envelope_key, stale_key

log = logs.get("bootstrap.compilecache")

# watchdog's inotify backend warns when a directory created during a burst of writes (a compile) is
# registered twice; it then keeps one watch, which is all we need.
warnings.filterwarnings("ignore", message="Callback with id", category=RuntimeWarning, module="watchdog")

_CLAIM = re.compile(r"^(\d{15})-[0-9a-f]{32}$")
PublishStatus = Literal["published", "replaced", "exists", "empty", "timeout"]


@dataclass(frozen=True)
class PublishSettings:
    quiet_s: float = 30.0        # no file activity for this long after new artifacts = compile done
    poll_s: float = 1.0
    timeout_s: float | None = None
    settle_s: float = 5.0        # claim protocol: listing lag to wait out (rclone caches dirs ~1 s)
    claim_ttl_s: float = 900.0


@dataclass(frozen=True)
class PublishResult:
    status: PublishStatus
    message: str
    envelope_key: str = ""
    blob_key: str = ""
    sha256: str = ""
    size: int = 0
    files: int = 0
    protocol: str = ""           # "conditional" | "claim"
    generation: int = 0


class QuietDetector:
    """Pure: has there been activity, and none for ``quiet_s``? Times come from the caller."""

    def __init__(self, quiet_s: float):
        self.quiet_s = quiet_s
        self._last: float | None = None
        self._lock = threading.Lock()

    def touch(self, now: float) -> None:
        with self._lock:
            self._last = now

    def due(self, now: float) -> bool:
        with self._lock:
            return self._last is not None and now - self._last >= self.quiet_s

    def reset(self) -> None:
        with self._lock:
            self._last = None


class _Touch(FileSystemEventHandler):
    def __init__(self, detector: QuietDetector, clock: Callable[[], float]):
        self.detector, self.clock = detector, clock

    def on_any_event(self, event: FileSystemEvent) -> None:
        # Reads (ours while packing, vLLM's on a hit) are not compile activity.
        if event.event_type not in (EVENT_TYPE_OPENED, EVENT_TYPE_CLOSED_NO_WRITE):
            self.detector.touch(self.clock())


def wait_for_compile(roots: Mapping[str, Path], baseline: hitcheck.TreeSnapshot, settings: PublishSettings,
                     clock: Callable[[], float] = time.monotonic) -> hitcheck.TreeSnapshot | None:
    """Block until the roots hold new compiled artifacts and have been quiet; None on timeout."""
    detector = QuietDetector(settings.quiet_s)
    observer = Observer()
    for path in roots.values():
        Path(path).mkdir(parents=True, exist_ok=True)  # watchdog needs the dir; vLLM creates it lazily
        observer.schedule(_Touch(detector, clock), str(path), recursive=True)
    observer.start()
    deadline = None if settings.timeout_s is None else clock() + settings.timeout_s
    try:
        while deadline is None or clock() < deadline:
            time.sleep(settings.poll_s)
            if not detector.due(clock()):
                continue
            snap = hitcheck.snapshot(roots)
            if snap.artifacts - baseline.artifacts:
                return snap
            detector.reset()  # activity without compiled output (locks, logs): keep waiting
        return None
    finally:
        observer.stop()
        observer.join()


def producer_info(env: Mapping[str, str]) -> dict[str, str]:
    return {
        "node": env.get("NODE_NAME") or socket.gethostname(),
        "instanceType": env.get("NODEWARM_INSTANCE_TYPE", ""),
        "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


@dataclass(frozen=True)
class Current:
    """The key's envelope as it is now: what a replacement must be conditional on."""

    etag: str
    generation: int
    manifest: cachekey.BundleManifest | None     # None: does not verify (tampered, malformed, other key)
    stale_reason: str = ""                        # why a publisher may replace it; "" while it is good


def read_current(store: CacheStore, env_key: str, key: Ed25519PrivateKey,
                 local: hitcheck.TreeSnapshot | None = None) -> Current | None:
    """The current envelope and whether it is stale; None when the key has none."""
    got = store.get_with_etag(env_key)
    if got is None:
        return None
    data, etag = got
    try:
        manifest = cachekey.BundleManifest.from_dict(signing.open_envelope(data, key.public_key()))
    except (NodewarmError, ValueError, TypeError) as e:
        # Generation unknown: whatever replaces it starts above any generation a reader trusted.
        return Current(etag, _unverified_generation(data), None, f"current envelope does not verify: {e}")
    if store.exists(stale_key(env_key, manifest.generation)):
        return Current(etag, manifest.generation, manifest, "proven to miss in serving")
    if not store.exists(manifest.blob_key):
        return Current(etag, manifest.generation, manifest, f"its archive {manifest.blob_key} is missing")
    new_dirs = sorted((local.hash_dirs if local else frozenset()) - set(manifest.hash_dirs))
    if new_dirs:
        return Current(etag, manifest.generation, manifest, f"vLLM hash dirs {new_dirs} are not in it")
    return Current(etag, manifest.generation, manifest)


def _unverified_generation(data: bytes) -> int:
    try:
        g = json.loads(data)["manifest"]["generation"]
        return g if isinstance(g, int) and g > 0 else 1
    except (ValueError, KeyError, TypeError):
        return 1


def mark_stale(store: CacheStore, env_key: str, generation: int, reason: str) -> str:
    """Record that ``generation`` of this key missed in serving; the next publisher replaces it."""
    k = stale_key(env_key, generation)
    store.put(k, json.dumps({"generation": generation, "reason": reason,
                             "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode())
    log.info("compilecache.publish.marked_stale", key=env_key, generation=generation, reason=reason)
    return k


def _claim_and_write(store: CacheStore, env_key: str, envelope: bytes, settings: PublishSettings,
                     generation: int, current: Current | None) -> bool:
    claims = f"{env_key}.claims/g{generation}/"
    mine = f"{claims}{int(time.time() * 1000):015d}-{uuid.uuid4().hex}"
    store.put(mine, b"")
    try:
        time.sleep(settings.settle_s)
        now_ms = time.time() * 1000
        stamps = {k: _CLAIM.match(k[len(claims):]) for k in store.list(claims, delimiter=None)}
        live = [k for k, m in stamps.items() if m and now_ms - int(m.group(1)) < settings.claim_ttl_s * 1000]
        if mine not in live or min(live) != mine:
            log.info("compilecache.publish.claim_lost", key=env_key, claims=len(live), generation=generation)
            return False
        now = store.get_with_etag(env_key)
        if (now is None) != (current is None) or (now is not None and now[1] != current.etag):
            return False        # someone committed this generation (or another) since we read it
        store.put(env_key, envelope)
        return store.get_small(env_key) == envelope
    finally:
        store.tidy(mine)


def publish_once(store: CacheStore, roots: Mapping[str, Path], factors: cachekey.Factors,
                 key: Ed25519PrivateKey, producer: Mapping[str, str], settings: PublishSettings = PublishSettings(),
                 workdir: Path | None = None, runtime: cachekey.RuntimeProbe | None = None) -> PublishResult:
    """Pack the roots as they are now and commit them for this key, unless a good bundle is already there.

    ``runtime`` is the serving image's software (this process's, in the serving image); with it the image's
    runtime descriptor is (re)written for nodes that cannot import that image's torch.
    """
    prefix = cachekey.prefix(factors, store.root)
    kid = cachekey.key_id(factors)
    env_key = envelope_key(prefix, kid)
    snap = hitcheck.snapshot(roots)
    if runtime is not None and factors.image:
        runtimedesc.write(store, factors.image, runtime, factors.env, key)
    current = read_current(store, env_key, key, snap)
    if current is not None and not current.stale_reason:
        return PublishResult("exists", f"a bundle for this key is already published at {env_key} "
                             f"(generation {current.generation})", env_key, generation=current.generation)
    if not snap.artifacts:
        # An empty bundle would win the key and keep every later node cold.
        return PublishResult("empty", f"no compiled artifacts under {sorted(map(str, roots.values()))}; "
                             "nothing to publish", env_key)
    generation = current.generation + 1 if current else 1
    with tempfile.TemporaryDirectory(prefix="nodewarm-publish-", dir=workdir) as tmp:
        packed = bundle.pack({n: Path(p) for n, p in roots.items()}, Path(tmp) / f"{kid}.tar.zst")
        blob = blob_key(prefix, packed.sha256)
        manifest = cachekey.BundleManifest(
            factors=factors.to_dict(), key_id=kid, blob_key=blob, sha256=packed.sha256, size=packed.size,
            files=packed.files, unpacked_bytes=packed.unpacked_bytes,
            roots=tuple(sorted(n for n, p in roots.items() if Path(p).is_dir())),
            hash_dirs=tuple(sorted(snap.hash_dirs)), graphs=tuple(sorted(snap.graphs)), producer=dict(producer),
            generation=generation,
        )
        if not store.exists(blob):
            store.put(blob, packed.path)
    envelope = signing.seal(manifest.to_dict(), key)
    conditional = store.conditional_writes()
    protocol = "conditional" if conditional else "claim"
    if not conditional:
        won = _claim_and_write(store, env_key, envelope, settings, generation, current)
    elif current is None:
        won = store.put_if_absent(env_key, envelope)
    else:
        won = store.put_if_match(env_key, envelope, current.etag)
    facts = dict(envelope_key=env_key, blob_key=blob, sha256=packed.sha256, size=packed.size,
                 files=packed.files, protocol=protocol, generation=generation)
    if not won:
        # A claim winner commits a moment after we lose; a conditional-write winner already has.
        _drop_if_unreferenced(store, env_key, blob, wait_s=0 if conditional else settings.settle_s,
                              before=current.etag if current else None)
        log.info("compilecache.publish.lost", **facts)
        return PublishResult("exists", f"another node published {env_key} generation {generation} first "
                             "(or holds the claim to)", **facts)
    status: PublishStatus = "replaced" if current else "published"
    log.info("compilecache.publish.done", status=status, hash_dirs=list(manifest.hash_dirs),
             stale_reason=current.stale_reason if current else "", **facts)
    what = f"replaced generation {current.generation} ({current.stale_reason}) with" if current else "published"
    return PublishResult(status, f"{what} {packed.files} files ({packed.size} bytes) at {env_key} "
                         f"generation {generation}", **facts)


def _drop_if_unreferenced(store: CacheStore, env_key: str, blob: str, wait_s: float, before: str | None) -> None:
    """Delete our blob once the winning envelope is there and names other bytes.

    Without the envelope we cannot know whether the winner will name our blob (identical caches
    pack to identical bytes), so the blob stays.
    """
    deadline = time.monotonic() + wait_s
    while True:
        got = store.get_with_etag(env_key)
        if got is not None and got[1] != before:
            break
        if time.monotonic() >= deadline:
            return
        time.sleep(0.25)
    try:
        winner = json.loads(got[0])["manifest"]["blob_key"]
    except (NodewarmError, ValueError, KeyError, TypeError):
        return  # cleanup only: a stray blob costs storage, never correctness
    if winner != blob:
        store.tidy(blob)


def watch_and_publish(store: CacheStore, roots: Mapping[str, Path], factors: cachekey.Factors,
                      key: Ed25519PrivateKey, producer: Mapping[str, str],
                      settings: PublishSettings = PublishSettings(), workdir: Path | None = None,
                      runtime: cachekey.RuntimeProbe | None = None) -> PublishResult:
    """Without a readiness URL: wait for one finished compile, then publish it (servedcheck proves hits)."""
    env_key = envelope_key(cachekey.prefix(factors, store.root), cachekey.key_id(factors))
    current = read_current(store, env_key, key, hitcheck.snapshot(roots))
    if current is not None and not current.stale_reason:
        return PublishResult("exists", f"a bundle for this key is already published at {env_key}", env_key,
                             generation=current.generation)
    baseline = hitcheck.snapshot(roots)
    log.info("compilecache.publish.watching", roots={k: str(v) for k, v in roots.items()},
             quiet_s=settings.quiet_s, key=env_key)
    snap = wait_for_compile(roots, baseline, settings)
    if snap is None:
        return PublishResult("timeout", f"no finished compile within {settings.timeout_s} s", env_key)
    return publish_once(store, roots, factors, key, producer, settings, workdir, runtime)
