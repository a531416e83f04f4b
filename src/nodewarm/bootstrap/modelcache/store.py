"""The models this node holds under ``<mount>/nodewarm/models/<view>/<model key>/`` and how room is made for another.

``plan_eviction`` is pure: least recently used first, never a protected folder (a required model, one a pod on the
node uses, the one being pulled), and nothing at all when even every unprotected folder would not make room. The
rest is I/O. Eviction is crash-safe, a whole model or nothing: one rename takes the folder out of its place (into
``<models root>/.evicting/``, on the same filesystem) and only then is it deleted; a crash in between leaves it there
for ``finish_evictions`` at the next start, and from the rename on it is simply not held. Every step walks from the
models root without following a link (confined.py): the folders are hostPath mounts of pods.

Models share files: a roll hard-links the unchanged ones (weights/linking.py). What evicting frees is therefore
counted per inode: a file's blocks come back only when every one of its links goes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from nodewarm import logs

from .. import confined
from ..confined import UnsafePath
from ..weights.manifest import MANIFEST_FILE, STATE_DIR
from ..weights.pipeline import SUMMARY_FILE

log = logs.get("bootstrap.modelstore")

GiB = 1024**3
EVICTING = ".evicting"
LAST_USED = "last-used"  # in the model's STATE_DIR: epoch seconds, as text
_KEY = re.compile(r"[0-9a-f]{12}")  # api.generation.model_key


@dataclass(frozen=True)
class Held:
    path: Path  # <models root>/<view>/<key>
    view: str
    key: str
    complete: bool  # its last pull succeeded: every file there and verified (summary ok, manifest present)
    last_used: float  # epoch seconds
    # (st_dev, st_ino) -> (allocated bytes, links in all, links inside this folder)
    inodes: dict[tuple[int, int], tuple[int, int, int]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def bytes(self) -> int:
        """Allocated on disk, each file once however many names it has here."""
        return sum(size for size, _, _ in self.inodes.values())


@dataclass(frozen=True)
class Eviction:
    ok: bool
    evict: tuple[Held, ...]  # least recently used first; empty when not ok
    frees_bytes: int
    message: str


def freed_bytes(models: list[Held] | tuple[Held, ...]) -> int:
    """What deleting all of ``models`` gives back: the files none of whose links is anywhere else. Pure."""
    links: dict[tuple[int, int], int] = {}
    sizes: dict[tuple[int, int], tuple[int, int]] = {}
    for m in models:
        for inode, (size, nlink, here) in m.inodes.items():
            links[inode] = links.get(inode, 0) + here
            sizes[inode] = (size, nlink)
    return sum(size for inode, (size, nlink) in sizes.items() if links[inode] >= nlink)


def _describe(m: Held) -> str:
    return f"{m.view}/{m.key} ({m.bytes / GiB:.2f} GiB)"


def plan_eviction(held: list[Held], need_bytes: int, free_bytes: int, protected: Mapping[Path, str]) -> Eviction:
    """Which folders to evict so that ``need_bytes`` (headroom included) fit beside ``free_bytes``. Pure.

    ``protected`` maps a folder to why it must stay (required, used by a pod, being pulled). Least recently used
    first, stopping as soon as the need fits. When even every unprotected folder would not make room, nothing is
    evicted (ok=False) and the message gives the sizes: what is needed, free, could be freed, and what is protected
    and why.
    """
    if need_bytes <= free_bytes:
        return Eviction(True, (), 0, f"{need_bytes / GiB:.2f} GiB needed, {free_bytes / GiB:.2f} GiB free")
    keep = {Path(os.path.abspath(p)): why for p, why in protected.items()}
    candidates = sorted((m for m in held if Path(os.path.abspath(m.path)) not in keep),
                        key=lambda m: (m.last_used, str(m.path)))
    chosen: list[Held] = []
    for m in candidates:
        chosen.append(m)
        frees = freed_bytes(chosen)
        if free_bytes + frees >= need_bytes:
            return Eviction(True, tuple(chosen), frees,
                            f"evicting {', '.join(map(_describe, chosen))} frees {frees / GiB:.2f} GiB: "
                            f"{need_bytes / GiB:.2f} GiB needed, {free_bytes / GiB:.2f} GiB free")
    could = freed_bytes(candidates)
    kept = [f"{m.view}/{m.key} ({m.bytes / GiB:.2f} GiB, {keep[Path(os.path.abspath(m.path))]})"
            for m in held if Path(os.path.abspath(m.path)) in keep]
    return Eviction(False, (), 0,
                    f"{need_bytes / GiB:.2f} GiB needed, {free_bytes / GiB:.2f} GiB free; evicting every model not "
                    f"protected ({len(candidates)}) would free only {could / GiB:.2f} GiB; protected: "
                    f"{', '.join(kept) or 'none'}; nothing was evicted")


def complete(summary: dict | None, has_manifest: bool) -> bool:
    """A folder whose last pull succeeded: its summary says so and its manifest, which lists what was verified,
    is there. Pure."""
    return bool(summary and summary.get("ok") is True and has_manifest)


def _inodes(folder: Path) -> dict[tuple[int, int], tuple[int, int, int]]:
    found: dict[tuple[int, int], tuple[int, int, int]] = {}
    for dirpath, _, filenames in os.walk(folder):  # never into a linked folder
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            inode = (st.st_dev, st.st_ino)
            here = found[inode][2] + 1 if inode in found else 1
            found[inode] = (st.st_blocks * 512, st.st_nlink, here)
    return found


def _last_used(folder: Path) -> float:
    state = folder / STATE_DIR
    try:
        return float((state / LAST_USED).read_text())
    except (OSError, ValueError):
        pass
    for fallback in (state / SUMMARY_FILE, folder):  # when it was warmed
        try:
            return fallback.stat().st_mtime
        except OSError:
            continue
    return 0.0


def held(models_root: Path) -> list[Held]:
    """Every model folder under ``models_root`` (``<view>/<12-hex key>``, no link followed), complete or not: an
    interrupted pull's folder holds space too. What is being evicted (``.evicting``) is never listed."""
    root = Path(os.path.abspath(models_root))
    models = []
    for view in _subdirs(root):
        if view.startswith("."):
            continue
        for key in _subdirs(root / view):
            if not _KEY.fullmatch(key):
                continue
            folder = root / view / key
            state = folder / STATE_DIR
            try:
                summary = json.loads((state / SUMMARY_FILE).read_text())
            except (OSError, ValueError):
                summary = None
            models.append(Held(folder, view, key, complete(summary, (state / MANIFEST_FILE).is_file()),
                               _last_used(folder), _inodes(folder)))
    return models


def _subdirs(folder: Path) -> list[str]:
    try:
        with os.scandir(folder) as it:
            return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def touch_used(folder: Path, at: float) -> None:
    """Record that a pod used the model in ``folder`` at ``at`` (epoch seconds): what eviction orders by."""
    fd = confined.open_dir(Path(folder), (STATE_DIR,), create=True)
    try:
        tmp = LAST_USED + ".tmp"
        wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        try:
            os.write(wfd, repr(float(at)).encode())
        finally:
            os.close(wfd)
        os.replace(tmp, LAST_USED, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def _model_parts(models_root: Path, folder: Path) -> tuple[str, str]:
    """(view, key) of a model folder directly under ``models_root``, else UnsafePath."""
    try:
        rel = Path(os.path.abspath(folder)).relative_to(Path(os.path.abspath(models_root)))
    except ValueError:
        raise UnsafePath(f"{folder} is not under the models folder {models_root}: not evicting it") from None
    if len(rel.parts) != 2 or rel.parts[0].startswith(".") or not _KEY.fullmatch(rel.parts[1]):
        raise UnsafePath(f"{folder} is not a model folder (<view>/<12-hex key>) of {models_root}: not evicting it")
    return rel.parts[0], rel.parts[1]


def evict(models_root: Path, folder: Path) -> None:
    """Delete one model folder, whole or not at all: renamed into ``.evicting`` (then it is no longer held), the
    rename made durable, then removed. A link at the view or the folder itself is refused, never followed."""
    root = Path(os.path.abspath(models_root))
    view, key = _model_parts(root, folder)
    vfd = confined.open_dir(root, (view,))
    try:
        st = os.stat(key, dir_fd=vfd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePath(f"{folder} is a symlink or not a directory: not evicting it")
        efd = confined.open_dir(root, (EVICTING,), create=True)
        try:
            n = 0
            while True:
                gone = f"{view}-{key}-{n}"
                try:
                    os.stat(gone, dir_fd=efd, follow_symlinks=False)
                    n += 1
                except FileNotFoundError:
                    break
            os.rename(key, gone, src_dir_fd=vfd, dst_dir_fd=efd)
            os.fsync(vfd)
            os.fsync(efd)
            log.info("modelstore.evicting", model=f"{view}/{key}")
            _remove_all(efd)
        finally:
            os.close(efd)
    finally:
        os.close(vfd)


def _remove_all(efd: int) -> None:
    for name in os.listdir(efd):
        st = os.stat(name, dir_fd=efd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=efd)  # fd-based on Linux: never follows a link inside
        else:
            os.unlink(name, dir_fd=efd)
        log.info("modelstore.evicted", name=name)


def finish_evictions(models_root: Path) -> None:
    """Remove what an eviction renamed away and did not get to delete (a crash or a stop in between)."""
    try:
        efd = confined.open_dir(Path(os.path.abspath(models_root)), (EVICTING,))
    except FileNotFoundError:
        return
    try:
        _remove_all(efd)
    finally:
        os.close(efd)
