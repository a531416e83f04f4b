"""Snapshots on the node's disk: one slot per serving container, root-only, whole or absent, checked before use.

    <root>/                    0700, root's
      criu.conf                CRIU's options for every dump and restore here (CRIU_CONFIG_FILE)
      context.json             the agent's part of every key here: the generation and compile cache it warmed
      <slot>/                  a published snapshot: key.json, manifest.json, images/ (CRIU's)
      .staging-<slot>-<rand>/  one being taken; a crash leaves it, ``sweep`` removes it
      restored/<id>            containers the handler restored: their ``start`` is already done
      outcomes/<id>.json       what the handler decided for a container, and why (the agent's Event)

A slot is replaced by a rename, so a reader sees the old snapshot or the new one, never half of either. The
manifest holds every file's size and CRC64-NVME: CRIU reads memory pages as they are, and a flipped byte restored
is a process that answers wrongly, so a snapshot that does not match its manifest is never restored. A CRC, not a
cryptographic digest: what it guards against is the disk and a crash, and the store is root's alone (whoever could
forge a matching file could as well change the handler); computed on the CPU's carry-less multiply, it reads the
2.5 GB of a tiny model's engine in about a second where SHA-256 took over three, on the restore's critical path.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from awscrt import checksums

from nodewarm.api.snapshot import CONTEXT_FILE

# link-remap: vLLM's worker holds a POSIX semaphore in /dev/shm that is already unlinked; CRIU saves such a file
# only when it may link it back under a temporary name.
CRIU_OPTIONS = "link-remap\n"
_MANIFEST = "manifest.json"
_CONTEXT = CONTEXT_FILE
_CHUNK = 8 << 20
_KEY = "key.json"
_NOT_SLOTS = frozenset({"restored", "outcomes"})


class SnapshotUnusable(Exception):
    """A snapshot that must not be restored; the message says why (it goes to the pod's log and an Event)."""


@dataclass(frozen=True)
class Snapshot:
    path: Path
    key: dict[str, Any]

    @property
    def images(self) -> Path:
        return self.path / "images"


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)

    @property
    def criu_config(self) -> Path:
        return self.root / "criu.conf"

    def open(self) -> "Store":
        """Make the root (0700) and CRIU's options. Every user of the store opens it (the handler on each create),
        so this never touches a snapshot being taken: ``sweep`` is for the one component that takes them."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        (self.root / "restored").mkdir(mode=0o700, exist_ok=True)
        if not self.criu_config.exists() or self.criu_config.read_text() != CRIU_OPTIONS:
            write_file(self.criu_config, CRIU_OPTIONS)
        return self

    def sweep(self) -> None:
        """Remove what a crash left half-written. Only while no checkpoint runs (the agent, as it starts): a
        staging directory of a checkpoint in progress looks the same."""
        for leftover in (*self.root.glob(".staging-*"), *self.root.glob(".old-*")):
            shutil.rmtree(leftover, ignore_errors=True)

    def context(self) -> dict[str, str]:
        """The agent's part of every key (key.py): empty until the agent records one, and when unreadable (a key
        with an empty context never matches the agent's snapshots, so the container boots)."""
        try:
            doc = json.loads((self.root / _CONTEXT).read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}

    def set_context(self, context: dict[str, str]) -> list[str]:
        """Record ``context`` and remove every snapshot taken under another: a snapshot is removed when its key
        changes, not only refused. Returns the slots removed."""
        write_file(self.root / _CONTEXT, json.dumps(context, sort_keys=True))
        want = sorted([k, v] for k, v in context.items())
        gone = []
        for slot in self.slots():
            found = self.lookup(slot)
            if found is None or sorted(map(list, found.key.get("context") or ())) != want:
                self.remove(slot)
                gone.append(slot)
        return gone

    def record_outcome(self, container_id: str, doc: dict[str, Any]) -> None:
        """What the handler decided for a container, for the agent's Event."""
        out = self.root / "outcomes"
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_file(out / f"{_safe_id(container_id)}.json", json.dumps(doc, sort_keys=True))

    def stage(self, slot: str) -> Path:
        """A fresh directory to take a snapshot into (images/ made)."""
        path = Path(tempfile.mkdtemp(prefix=f".staging-{slot}-", dir=self.root))
        (path / "images").mkdir()
        return path

    def publish(self, staging: Path, slot: str, key: dict[str, Any]) -> Snapshot:
        """Seal ``staging`` (manifest, key) and make it the slot's snapshot, replacing any other in one rename."""
        manifest = {rel: [size, digest] for rel, size, digest in _files(staging)}
        write_file(staging / _MANIFEST, json.dumps(manifest, sort_keys=True, indent=1))
        write_file(staging / _KEY, json.dumps(key, sort_keys=True, indent=1))
        _fsync_tree(staging)
        target = self.root / slot
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".old-{slot}-", dir=self.root))
            os.rename(target, old / "x")
        os.rename(staging, target)
        _fsync_dir(self.root)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        return Snapshot(target, key)

    def lookup(self, slot: str) -> Snapshot | None:
        path = self.root / slot
        try:
            key = json.loads((path / _KEY).read_text())
        except (OSError, ValueError):
            return None
        return Snapshot(path, key)

    def remove(self, slot: str) -> bool:
        path = self.root / slot
        if not path.exists():
            return False
        gone = Path(tempfile.mkdtemp(prefix=f".old-{slot}-", dir=self.root))
        os.rename(path, gone / "x")
        shutil.rmtree(gone, ignore_errors=True)
        return True

    def slots(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")
                      and p.name not in _NOT_SLOTS)

    def mark_restored(self, container_id: str) -> None:
        write_file(self.root / "restored" / _safe_id(container_id), "")

    def was_restored(self, container_id: str) -> bool:
        return (self.root / "restored" / _safe_id(container_id)).exists()

    def forget(self, container_id: str) -> None:
        (self.root / "restored" / _safe_id(container_id)).unlink(missing_ok=True)


def verify(snapshot: Snapshot) -> None:
    """Raise SnapshotUnusable unless every file is there, with its recorded size and digest, and no other."""
    try:
        manifest = json.loads((snapshot.path / _MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise SnapshotUnusable(f"its manifest cannot be read ({e})") from None
    seen = set()
    for rel, size, digest in _files(snapshot.path, want=manifest):
        seen.add(rel)
        if rel not in manifest:
            raise SnapshotUnusable(f"{rel} is not in its manifest")
        if [size, digest] != list(manifest[rel]):
            raise SnapshotUnusable(f"{rel} is {size} bytes with another digest than recorded "
                                   f"({manifest[rel][0]} bytes): corrupt or truncated")
    missing = sorted(set(manifest) - seen)
    if missing:
        raise SnapshotUnusable(f"{missing[0]} is missing ({len(missing)} file(s) in all)")


def _files(base: Path, want: dict | None = None):
    """(relative path, size, CRC64-NVME in hex) of every file under images/. With ``want``, a file whose size is
    already wrong is not read through: its digest is reported empty."""
    for top in ("images",):
        for dirpath, _dirs, names in os.walk(base / top):
            for name in sorted(names):
                path = Path(dirpath) / name
                rel = str(path.relative_to(base))
                size = path.stat().st_size
                if want is not None and (rel not in want or want[rel][0] != size):
                    yield rel, size, ""
                    continue
                yield rel, size, _crc(path)


def _crc(path: Path) -> str:
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            value = checksums.crc64nvme(chunk, value)
    return f"crc64nvme:{value:016x}"


def _safe_id(container_id: str) -> str:
    if not container_id or "/" in container_id or container_id.startswith("."):
        raise ValueError(f"not a container id: {container_id!r}")
    return container_id


def write_file(path: Path, text: str) -> None:
    """``path`` replaced whole by ``text`` (0600, synced): a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_tree(base: Path) -> None:
    for dirpath, _dirs, names in os.walk(base):
        for name in names:
            fd = os.open(Path(dirpath) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
