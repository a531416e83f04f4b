"""Restore this node's compile caches from the bucket, or say exactly why compile will be cold.

Runs in the bootstrap after the weights. Never fails the bootstrap for a cache problem: a missing,
mismatched, unsigned, tampered or unsafe bundle yields ``status="cold"`` with a CamelCase reason and a
message for the node condition, and the node still warms its weights.

Order of trust: the envelope's signature (profile verify key) -> every factor in the manifest equals
this node's -> enough free space for the archive and what it unpacks to -> the downloaded archive's
size and sha256 equal the signed ones -> each archive entry is safe -> extracted into a staging dir on
the caches' filesystem (beside the pod-writable folder, not in it) -> renamed into place without
following any link. A local write failure is InsufficientNVMe or LocalWriteFailed, never an S3 reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from nodewarm import logs
from nodewarm.api.errors import NodewarmError
from nodewarm.api.servingspec import ServingSpec

from ..localwrite import write_error
from ..weights import capacity
from . import bundle, cachekey, hardware, hitcheck, runtimedesc, signing
from .cachestore import ENVELOPE_SUFFIX, CacheStore, envelope_key, parse_uri

log = logs.get("bootstrap.compilecache")

RestoreStatus = Literal["restored", "cold"]
_MAX_CANDIDATES = 8


class CacheNotFound(NodewarmError):
    reason = "CacheNotFound"


class CacheKeyMismatch(NodewarmError):
    reason = "CacheKeyMismatch"

    def __init__(self, message: str, mismatches: list[cachekey.Mismatch]):
        super().__init__(message)
        self.mismatches = mismatches


@dataclass(frozen=True)
class RestoreSettings:
    limits: bundle.Limits = bundle.Limits()
    max_archive_bytes: int = 32 << 30
    # On top of the archive plus what it unpacks to (both are on disk while it extracts); the node's own
    # margin was kept when the weights were pulled.
    headroom: capacity.Headroom = capacity.Headroom(fraction=0.05, minimum_bytes=64 << 20)


@dataclass(frozen=True)
class RestoreResult:
    status: RestoreStatus
    reason: str                          # "Restored" or why compile will be cold
    message: str
    envelope_key: str = ""
    sha256: str = ""
    files: int = 0
    bytes: int = 0
    hash_dirs: tuple[str, ...] = ()
    mismatches: tuple[cachekey.Mismatch, ...] = ()
    seconds: float = 0.0
    generation: int = 0
    hardware: hardware.NodeHardware | None = None
    baseline: hitcheck.TreeSnapshot = field(default_factory=hitcheck.TreeSnapshot)  # for verify_hit

    def as_baseline(self) -> hitcheck.Baseline:
        return hitcheck.Baseline(self.baseline, self.status == "restored", self.reason, self.envelope_key,
                                 self.generation)

    def condition_message(self) -> str:
        """One line for the node condition the caller sets."""
        if self.status == "restored":
            return (f"compile cache restored ({self.files} files, {self.bytes} bytes) from {self.envelope_key} "
                    f"generation {self.generation}; the hit is proven once vLLM serves")
        return f"compile will be cold: {self.reason}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status, "reason": self.reason, "message": self.message,
            "envelopeKey": self.envelope_key, "sha256": self.sha256, "files": self.files, "bytes": self.bytes,
            "hashDirs": list(self.hash_dirs), "mismatches": [dataclasses.asdict(m) for m in self.mismatches],
            "seconds": round(self.seconds, 3), "generation": self.generation,
            "hardware": dataclasses.asdict(self.hardware) if self.hardware else None,
        }


def _verified(store: CacheStore, key: str, verify_key: Ed25519PublicKey) -> cachekey.BundleManifest:
    manifest = signing.open_envelope(store.get_small(key), verify_key)
    try:
        return cachekey.BundleManifest.from_dict(manifest)
    except (ValueError, TypeError) as e:
        raise signing.BundleTampered(f"signed manifest {key} is malformed: {e}") from None


def choose(store: CacheStore, factors: cachekey.Factors, verify_key: Ed25519PublicKey) -> cachekey.BundleManifest:
    """The verified bundle for exactly these factors; otherwise raise naming what is wrong."""
    prefix = cachekey.prefix(factors, store.root)
    want = envelope_key(prefix, cachekey.key_id(factors))
    envelopes = [k for k in store.list(prefix) if k.endswith(ENVELOPE_SUFFIX)]
    if want in envelopes:
        manifest = _verified(store, want, verify_key)
        mismatches = cachekey.compare(factors, manifest.factors)
        if mismatches:
            raise CacheKeyMismatch(f"bundle {want} differs from this node in "
                                   + "; ".join(map(str, mismatches)), mismatches)
        if not manifest.blob_key.startswith(prefix + "blobs/"):
            raise signing.BundleTampered(f"bundle {want} points outside its prefix: {manifest.blob_key}")
        return manifest
    if not envelopes:
        # Same software and model built on other hardware sits beside this prefix: name how it differs.
        parent = prefix.rstrip("/").rpartition("/")[0] + "/"
        envelopes = [k for d in store.list_dirs(parent)[:_MAX_CANDIDATES] if d != prefix
                     for k in store.list(d) if k.endswith(ENVELOPE_SUFFIX)]
        if not envelopes:
            raise CacheNotFound(f"no compile-cache bundle under s3://{store.uri.bucket}/{prefix} (first node for "
                                "this runtime and model: it will compile and publish)")
    # Same readable prefix, different fine factors (ISA, paths, env, engine flags): name them.
    best: list[cachekey.Mismatch] | None = None
    best_key = ""
    for key in envelopes[:_MAX_CANDIDATES]:
        try:
            other = _verified(store, key, verify_key)
        except NodewarmError:
            continue
        mismatches = cachekey.compare(factors, other.factors)
        if best is None or len(mismatches) < len(best):
            best, best_key = mismatches, key
    if best is None:
        raise CacheNotFound(f"no bundle for this key under s3://{store.uri.bucket}/{prefix}, and none of the "
                            f"{len(envelopes)} there verifies with the profile's key")
    raise CacheKeyMismatch(f"no bundle for this node's key; nearest {best_key} differs in "
                           + "; ".join(map(str, best)), best)


def _download_verified(store: CacheStore, manifest: cachekey.BundleManifest, dest: Path, limit: int) -> None:
    if manifest.size > limit:
        raise bundle.UnsafeArchive(f"bundle {manifest.blob_key} is {manifest.size} bytes, over the {limit} limit")
    try:
        n = store.download(manifest.blob_key, dest, manifest.size)
    except NodewarmError as e:
        if e.reason == "ObjectTooLarge":
            raise signing.BundleTampered(f"archive {manifest.blob_key} is larger than the signed "
                                         f"{manifest.size} bytes") from None
        raise
    digest = hashlib.sha256()
    with open(dest, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if n != manifest.size or digest.hexdigest() != manifest.sha256:
        raise signing.BundleTampered(f"archive {manifest.blob_key} is {n} bytes with sha256 {digest.hexdigest()}; "
                                     f"the signed manifest says {manifest.size} bytes, {manifest.sha256}")


def _staging_parent(roots: Mapping[str, Path], base: Path | None) -> Path:
    # On the caches' filesystem, so the final step is a rename. Beside the pod-writable base, not in it:
    # a pod must not reach into what is being extracted.
    parent = Path(base).parent if base is not None else Path(roots[sorted(roots)[0]]).parent
    parent.mkdir(parents=True, exist_ok=True)
    return parent


def _check_space(where: Path, manifest: cachekey.BundleManifest, headroom: capacity.Headroom) -> None:
    need = manifest.size + manifest.unpacked_bytes
    try:
        capacity.check_fits(capacity.free_space(str(where)), need, headroom)
    except capacity.InsufficientNVMe as e:
        raise capacity.InsufficientNVMe(f"compile-cache bundle {manifest.blob_key} ({manifest.size} bytes, "
                                        f"{manifest.unpacked_bytes} unpacked) does not fit: {e}") from None


def restore(store: CacheStore, factors: cachekey.Factors, roots: Mapping[str, Path],
            verify_key: Ed25519PublicKey, settings: RestoreSettings = RestoreSettings(),
            base: Path | None = None) -> RestoreResult:
    """Find, verify, extract and install the bundle for this node; never raises for cache problems.
    ``base``: the trusted folder holding the roots (CacheDirs.base); nothing below it is followed."""
    if not roots:
        raise ValueError("restore needs at least one cache root")
    start = time.monotonic()
    roots = {n: Path(p) for n, p in roots.items()}
    try:
        manifest = choose(store, factors, verify_key)
        parent = _staging_parent(roots, base)
        _check_space(parent, manifest, settings.headroom)
        try:
            staging = Path(tempfile.mkdtemp(prefix=".nodewarm-restore-", dir=parent))
        except OSError as e:
            raise write_error(e, parent) from e
        try:
            archive = staging / "bundle.tar.zst"
            _download_verified(store, manifest, archive, settings.max_archive_bytes)
            extracted = bundle.extract(archive, staging / "tree", settings.limits)
            wanted = {n: p for n, p in roots.items() if n in extracted.roots}
            skipped = sorted(set(extracted.roots) - set(wanted))
            try:
                moved = bundle.install(staging / "tree", wanted, base)
            except OSError as e:
                raise write_error(e, e.filename or base or parent) from e
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except NodewarmError as e:
        result = RestoreResult("cold", e.reason, " ".join(str(e).split()),
                               mismatches=tuple(getattr(e, "mismatches", ())),
                               seconds=time.monotonic() - start, baseline=hitcheck.snapshot(roots))
        log.warning("compilecache.restore.cold", reason=result.reason, message=result.message)
        return result
    result = RestoreResult(
        "restored", "Restored", f"restored {extracted.files} files into {', '.join(sorted(wanted))}"
        + (f"; bundle roots with no local dir skipped: {skipped}" if skipped else ""),
        envelope_key=envelope_key(cachekey.prefix(factors, store.root), manifest.key_id), sha256=manifest.sha256,
        files=extracted.files, bytes=extracted.bytes, hash_dirs=manifest.hash_dirs,
        seconds=time.monotonic() - start, generation=manifest.generation, baseline=hitcheck.snapshot(roots),
    )
    log.info("compilecache.restore.done", key=result.envelope_key, files=result.files, bytes=result.bytes,
             moved={k: v[0] for k, v in moved.items()}, kept={k: v[1] for k, v in moved.items()},
             hash_dirs=list(result.hash_dirs), seconds=round(result.seconds, 3))
    return result


def restore_for_node(uri: str, verify_key: str, spec: ServingSpec, dirs: bundle.CacheDirs,
                     runtime: tuple[cachekey.RuntimeProbe, Mapping[str, str]] | None = None, *,
                     host_root: Path = Path("/"), node_labels: Mapping[str, str] | None = None,
                     settings: RestoreSettings = RestoreSettings()) -> RestoreResult:
    """The node agent's entry point, after the weights: profile values in, a result for the condition out.

    ``uri`` and ``verify_key`` are the profile's compileCache.uri and compileCache.verifyKey. ``runtime`` is
    the serving image's software and env (from `compile-cache key --runtime-only` run in that image); by
    default the image's signed descriptor (runtimedesc) is read: the agent never keys with its own
    process's torch, which is not the serving image's. Hardware is always this node's (``host_root``, the
    Node's labels). Any problem, a bad URI or key included, is a cold result: the weights still warm.
    """
    roots = dirs.roots()
    try:
        store = CacheStore(parse_uri(uri))
        key = signing.load_public(verify_key)
        probe, env = runtime if runtime is not None else runtimedesc.read(store, spec.image, key)
    except NodewarmError as e:
        return RestoreResult("cold", e.reason, " ".join(str(e).split()), baseline=hitcheck.snapshot(roots))
    hw = hardware.probe(host_root, node_labels, env)
    factors = cachekey.build_factors(probe, hw, spec, env)
    return dataclasses.replace(restore(store, factors, roots, key, settings, dirs.base), hardware=hw)

