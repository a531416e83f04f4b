"""What the model is (the S3 listing), what we already have (the local manifest), and what to fetch.

Pure except for loading and saving the local manifest. The local manifest records, per file, the S3
identity (ETag, VersionId, size, checksum) it was verified against and the file's size and mtime when
we wrote it, so a restart on the same node plans nothing and an object replaced at the same key is
fetched again. Its paths are data the agent (root) unlinks and renames onto: every one is checked to be
a plain relative path inside DEST before it is used (and confined.py never follows a link on the way).
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nodewarm import logs
from nodewarm.api.errors import NodewarmError

from ..confined import UnsafePath, check_rel
from ..s3client import S3Uri

log = logs.get("bootstrap.weights")

MANIFEST_VERSION = 1
STATE_DIR = ".nodewarm"  # nodewarm's own folder inside each model's folder
MANIFEST_FILE = "manifest.json"  # in STATE_DIR

# With safetensors present these are redundant copies of the same weights that vLLM never reads.
REDUNDANT_WEIGHT_FORMATS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.gguf")


class InvalidModelSource(NodewarmError):
    reason = "InvalidModelSource"


def parse_s3_uri(uri: str) -> S3Uri:
    if not uri.startswith("s3://"):
        raise InvalidModelSource(f"--uri {uri!r} is not an s3://BUCKET/PREFIX/ URI")
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    if not bucket:
        raise InvalidModelSource(f"--uri {uri!r} has no bucket")
    if prefix and not prefix.endswith("/"):
        prefix += "/"  # a model is a folder; 'models/llama' must not also match 'models/llama-70b/...'
    return S3Uri(bucket, prefix)


@dataclass(frozen=True)
class RemoteObject:
    """One object of the model, as S3 describes it (listing + HEAD with ChecksumMode)."""

    key: str
    rel_path: str
    size: int
    etag: str  # without quotes
    version_id: str | None = None
    checksum_algorithm: str | None = None  # CRC32 | CRC32C | CRC64NVME | SHA1 | SHA256
    checksum: str | None = None  # base64, "-N" suffix when composite
    checksum_type: str | None = None  # FULL_OBJECT | COMPOSITE
    first_part_size: int | None = None  # multipart objects: size of part 1, to recompute "-N" values
    encrypted_etag: bool = False  # SSE-KMS / SSE-C: the ETag is not an MD5 of the bytes

    @property
    def parts_count(self) -> int | None:
        for value in (self.etag, self.checksum or ""):
            if "-" in value:
                return int(value.rsplit("-", 1)[1])
        return None


@dataclass(frozen=True)
class LocalEntry:
    """A file we wrote and verified: which S3 identity it matches, and what it looked like on disk."""

    rel_path: str
    key: str
    size: int
    etag: str
    version_id: str | None
    checksum: str | None
    verified_by: str
    mtime_ns: int
    sha256: str | None = None  # computed while downloading (hex); the only record when S3 had no checksum

    def same_object(self, obj: RemoteObject) -> bool:
        return (self.key, self.size, self.etag, self.version_id, self.checksum) == (
            obj.key, obj.size, obj.etag, obj.version_id, obj.checksum)


@dataclass(frozen=True)
class Fetch:
    obj: RemoteObject
    why: str  # "new" | "changed" | "missing-locally" | "modified-locally"


@dataclass(frozen=True)
class Plan:
    fetch: tuple[Fetch, ...]
    keep: tuple[RemoteObject, ...]
    remove: tuple[str, ...]  # rel paths we wrote earlier whose object is gone from S3

    @property
    def fetch_bytes(self) -> int:
        return sum(f.obj.size for f in self.fetch)

    @property
    def changed(self) -> int:
        return sum(1 for f in self.fetch if f.why == "changed")


@dataclass
class LocalManifest:
    uri: str
    entries: dict[str, LocalEntry] = field(default_factory=dict)
    # Files an earlier run wrote for another model URI into the same DEST: removed unless the new model
    # has a file of the same name, so vLLM never sees a mix of two models.
    previous: tuple[str, ...] = ()


def rel_path_for(key: str, prefix: str) -> str:
    """The path under DEST for ``key``; refuses keys that would escape DEST."""
    rel = key[len(prefix):]
    norm = posixpath.normpath(rel) if rel else ""
    if not rel or rel.startswith("/") or norm != rel or norm.startswith("../") or norm == ".." or "\\" in rel:
        raise InvalidModelSource(f"object key {key!r} does not map to a safe path under the destination")
    if rel.split("/", 1)[0] == ".nodewarm":
        raise InvalidModelSource(f"object key {key!r} collides with nodewarm's own .nodewarm/ folder")
    return rel


def select(keys: list[str], prefix: str, exclude: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """Split listed keys into (wanted, skipped). Folder markers and redundant weight formats are skipped."""
    keys = [k for k in keys if not k.endswith("/")]
    names = [posixpath.basename(k) for k in keys]
    patterns = tuple(exclude)
    if any(n.endswith(".safetensors") for n in names):
        patterns += REDUNDANT_WEIGHT_FORMATS
    wanted, skipped = [], []
    for key, name in zip(keys, names):
        rel = key[len(prefix):]
        (skipped if any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(rel, p) for p in patterns) else wanted).append(key)
    return wanted, skipped


def plan(remote: list[RemoteObject], local: LocalManifest, on_disk: dict[str, tuple[int, int]]) -> Plan:
    """Decide per object: keep (same S3 identity, file untouched since we verified it) or fetch.

    ``on_disk`` maps rel path -> (size, mtime_ns) of the files present now.
    """
    fetch, keep = [], []
    for obj in remote:
        entry = local.entries.get(obj.rel_path)
        if entry is None:
            fetch.append(Fetch(obj, "new"))
        elif not entry.same_object(obj):
            fetch.append(Fetch(obj, "changed"))
        elif obj.rel_path not in on_disk:
            fetch.append(Fetch(obj, "missing-locally"))
        elif on_disk[obj.rel_path] != (entry.size, entry.mtime_ns):
            fetch.append(Fetch(obj, "modified-locally"))
        else:
            keep.append(obj)
    return Plan(tuple(fetch), tuple(keep), removals({o.rel_path for o in remote}, local))


def removals(wanted: set[str], local: LocalManifest) -> tuple[str, ...]:
    """Rel paths we wrote earlier (this model's or a previous URI's) that are not wanted now: to delete."""
    return tuple(sorted(p for p in set(local.entries) | set(local.previous) if p not in wanted))


def likely_unchanged(listed_key: str, size: int, etag: str, rel: str, local: LocalManifest,
                     on_disk: dict[str, tuple[int, int]]) -> bool:
    """What the listing alone says (no VersionId or checksum yet): the file we verified earlier is still
    this key's, untouched on disk. Sizes the pull and checks capacity before the HEADs; ``plan`` decides."""
    entry = local.entries.get(rel)
    return (entry is not None and (entry.key, entry.size, entry.etag) == (listed_key, size, etag)
            and on_disk.get(rel) == (entry.size, entry.mtime_ns))


LINKED = "linked:"  # verified_by of a file hard-linked from another model's folder: "linked:<how that was verified>"
# verify.py's label for a file S3 gave nothing to check against: here, as this module also judges it.
UNVERIFIED = "unverified-sha256"
_MD5_HEX = frozenset("0123456789abcdef")


def original_method(verified_by: str) -> str:
    """How a file's bytes were verified against S3 when they were downloaded, through any number of links."""
    return verified_by.removeprefix(LINKED) if verified_by.startswith(LINKED) else verified_by


def may_link_from(entry: LocalEntry, on_disk: tuple[int, int] | None) -> bool:
    """A file of another model's folder may give its bytes: verified against S3 (not only its SHA-256 recorded)
    and untouched on disk since (``on_disk``: (size, mtime_ns) now, None when absent or not a plain file)."""
    return original_method(entry.verified_by) != UNVERIFIED and on_disk == (entry.size, entry.mtime_ns)


def same_content(entry: LocalEntry, obj: RemoteObject) -> bool:
    """The verified file of ``entry`` holds ``obj``'s bytes, by S3's own evidence, never by name. Pure.

    Same size, and: the same additional checksum (algorithm and value) when both have one of one algorithm, the
    file having been verified by it; else the same single-part, unencrypted ETag, which is the MD5 of the bytes (a
    "-N" ETag depends on the upload's part layout, an SSE-KMS/SSE-C one is no digest of the bytes at all).
    """
    if entry.size != obj.size:
        return False
    method = original_method(entry.verified_by)
    if method.startswith("checksum-") and entry.checksum and obj.checksum and obj.checksum_algorithm:
        if method.split("-")[1] == obj.checksum_algorithm.lower():
            return entry.checksum == obj.checksum
    etag = obj.etag.lower()
    return (not obj.encrypted_etag and len(etag) == 32 and set(etag) <= _MD5_HEX
            and entry.etag.lower() == etag)


def local_rel_path(rel: str) -> str:
    """``rel`` when it may name a file of the model under DEST, else raise UnsafePath. Pure."""
    check_rel(rel, "manifest path")
    if rel.split("/", 1)[0] == ".nodewarm":
        raise UnsafePath(f"manifest path {rel!r} is inside nodewarm's own .nodewarm/ folder")
    return rel


def read_local(path: Path) -> tuple[str | None, dict[str, LocalEntry]] | None:
    """The URI and entries of a manifest on disk, whatever its URI; None when absent or unreadable.
    Entries whose path is not a plain relative path inside its folder are dropped (logged): nothing outside it is
    ever unlinked or linked on a manifest's word."""
    try:
        doc = json.loads(path.read_text())
        if doc.get("version") != MANIFEST_VERSION:
            return None
        entries = {}
        for e in doc["files"]:
            try:
                entries[local_rel_path(e["rel_path"])] = LocalEntry(**e)
            except UnsafePath as bad:
                log.warning("weights.manifest.unsafe_entry", manifest=str(path), error=str(bad))
        return doc.get("uri"), entries
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def load_local(path: Path, uri: str) -> LocalManifest:
    """The manifest of an earlier run into the same DEST; empty when absent or unreadable. For another
    URI its files become ``previous`` (to remove)."""
    read = read_local(path)
    if read is None:
        return LocalManifest(uri)
    found, entries = read
    if found != uri:
        # Removed before this manifest is saved for the new URI: a crash in between finds the old one again.
        return LocalManifest(uri, previous=tuple(sorted(entries)))
    return LocalManifest(uri, entries)


def save_local(path: Path, manifest: LocalManifest) -> None:
    """Atomically replace the manifest (temp, fsync, rename) so a crash never leaves half of one."""
    doc = {"version": MANIFEST_VERSION, "uri": manifest.uri,
           "files": [asdict(e) for _, e in sorted(manifest.entries.items())]}
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
