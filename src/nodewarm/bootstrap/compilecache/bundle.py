"""Compile-cache bundles on disk: a deterministic ``.tar.zst`` of named cache roots, and a safe extract.

(Over 300 lines: pack, extract and install are the two sides of one archive format; what extract refuses mirrors
what pack writes, and install's descriptor-based walk is the last step of the same safe extract.)

An archive holds one top-level folder per cache root (``vllm/`` = ``$VLLM_CACHE_ROOT/torch_compile_cache``,
``inductor/``, ``triton/``, ``pch/``). Packing the same tree twice gives the same bytes (sorted names, zeroed
owners and times, normalised modes, single-threaded zstd), so the archive's sha256 names it.

Extraction trusts nothing in the archive even after the signature checked out (a signing key can
leak): it refuses absolute names, ``..``, links leaving the root, devices and FIFOs, duplicate names,
oversize entries and too many files, and writes into a staging folder that ``install`` then renames
into place, so a half-extracted cache is never visible to vLLM. The install walks the cache tree
through directory fds opened with O_NOFOLLOW: the serving pod can write there, and a link it leaves
is never followed by this root process.
"""

from __future__ import annotations

import errno
import getpass
import hashlib
import os
import shutil
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterator, Mapping

import zstandard

from nodewarm import logs
from nodewarm.api.errors import NodewarmError

from .. import confined
from ..localwrite import write_error

log = logs.get("bootstrap.compilecache")

ROOT_NAMES = ("vllm", "inductor", "triton", "pch")
# Level 3: a 148 MiB precompiled header packs to 20 MiB in 0.35 s; level 10 saves 5 % for 7x the CPU.
_ZSTD_LEVEL = 3
# Inductor's per-process file locks and half-written temp files are not cache content.
_SKIP_DIRS = frozenset({"locks", "__pycache__"})
_SKIP_SUFFIXES = (".lock", ".tmp")


class UnsafeArchive(NodewarmError):
    reason = "UnsafeArchive"


@dataclass(frozen=True)
class Limits:
    """Bounds on what an archive may unpack to (a signed bundle can still be hostile)."""

    max_files: int = 200_000
    max_entry_bytes: int = 4 << 30
    max_total_bytes: int = 64 << 30


@dataclass(frozen=True)
class CacheDirs:
    """Where this node's compile caches live. ``vllm_root`` is ``$VLLM_CACHE_ROOT``.

    ``pch`` is Inductor's precompiled C++ headers dir, ``$TMPDIR/torchinductor_$USER/precompiled_headers``:
    Inductor keeps it there whatever TORCHINDUCTOR_CACHE_DIR says, and loads it even on a full cache
    hit. Measured on CPU: a restored cache without it still spends ~5 s building a 148 MiB ``.gch``
    on the first call (7.0 s instead of 1.9 s).
    """

    vllm_root: Path | None = None
    inductor: Path | None = None
    triton: Path | None = None
    pch: Path | None = None
    # The trusted folder the roots lie in (the node agent's: the serving pod's compile-cache hostPath).
    # Its contents are the pod's to change, so restore follows no link below it and stages beside it.
    base: Path | None = None

    def roots(self) -> dict[str, Path]:
        """Root name -> directory, for the roots this node uses."""
        out = {}
        if self.vllm_root:
            out["vllm"] = Path(self.vllm_root) / "torch_compile_cache"
        if self.inductor:
            out["inductor"] = Path(self.inductor)
        if self.triton:
            out["triton"] = Path(self.triton)
        if self.pch:
            out["pch"] = Path(self.pch)
        return out

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "CacheDirs":
        """The locations vLLM, Inductor and Triton would use with this environment (the user for the
        headers dir from USER/LOGNAME, else this process's, as Inductor's getpass.getuser() does)."""
        home = env.get("HOME", os.path.expanduser("~"))
        xdg = env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
        vllm_root = env.get("VLLM_CACHE_ROOT") or os.path.join(xdg, "vllm")
        user = env.get("USER") or env.get("LOGNAME") or getpass.getuser()
        tmp = env.get("TMPDIR") or "/tmp"
        return cls(
            vllm_root=Path(vllm_root),
            inductor=Path(env["TORCHINDUCTOR_CACHE_DIR"]) if env.get("TORCHINDUCTOR_CACHE_DIR") else None,
            triton=Path(env["TRITON_CACHE_DIR"]) if env.get("TRITON_CACHE_DIR") else None,
            pch=Path(tmp) / f"torchinductor_{user}" / "precompiled_headers",
        )


@dataclass(frozen=True)
class PackResult:
    path: Path
    sha256: str
    size: int
    files: int
    unpacked_bytes: int


@dataclass(frozen=True)
class ExtractResult:
    roots: tuple[str, ...]
    files: int
    bytes: int


def _walk(root: Path) -> Iterator[Path]:
    """Every path under root in a stable order, skipping lock and temp files."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        base = Path(dirpath)
        for d in dirnames:
            yield base / d
        for f in sorted(filenames):
            if not f.endswith(_SKIP_SUFFIXES):
                yield base / f


def _tarinfo(name: str, path: Path) -> tarfile.TarInfo | None:
    st = path.lstat()
    ti = tarfile.TarInfo(name)
    ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
    if stat.S_ISDIR(st.st_mode):
        ti.type, ti.mode = tarfile.DIRTYPE, 0o755
    elif stat.S_ISREG(st.st_mode):
        ti.type, ti.size = tarfile.REGTYPE, st.st_size
        ti.mode = 0o755 if st.st_mode & 0o111 else 0o644
    elif stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        if not _downward(target):
            log.warning("compilecache.pack.skip_link", path=str(path), target=target)
            return None
        ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, target, 0o777
    else:
        return None  # sockets and FIFOs are never cache content
    return ti


def pack(roots: Mapping[str, Path], out: Path) -> PackResult:
    """Write a deterministic ``.tar.zst`` of the given roots (name -> dir) to ``out``."""
    unknown = set(roots) - set(ROOT_NAMES)
    if unknown:
        raise ValueError(f"unknown cache roots {sorted(unknown)}; use {ROOT_NAMES}")
    files = unpacked = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    with open(tmp, "wb") as raw:
        # threads=0 keeps the frame layout independent of the CPU count: same tree, same bytes.
        with zstandard.ZstdCompressor(level=_ZSTD_LEVEL, threads=0).stream_writer(raw, closefd=False) as zw:
            with tarfile.open(fileobj=zw, mode="w|", format=tarfile.GNU_FORMAT) as tar:
                for name in sorted(roots):
                    root = Path(roots[name])
                    if not root.is_dir():
                        continue
                    tar.addfile(_tarinfo(name, root))
                    for path in _walk(root):
                        ti = _tarinfo(f"{name}/{path.relative_to(root).as_posix()}", path)
                        if ti is None:
                            continue
                        if ti.isreg():
                            with open(path, "rb") as f:
                                tar.addfile(ti, f)
                            files += 1
                            unpacked += ti.size
                        else:
                            tar.addfile(ti)
    digest = hashlib.sha256()
    with open(tmp, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    os.replace(tmp, out)
    return PackResult(out, digest.hexdigest(), out.stat().st_size, files, unpacked)


def _check_name(name: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if not name or p.is_absolute() or name.startswith("/") or "\\" in name:
        raise UnsafeArchive(f"archive entry {name!r} has an absolute or odd path")
    if any(part in ("..", "") for part in name.rstrip("/").split("/")):
        raise UnsafeArchive(f"archive entry {name!r} contains '..' or an empty component")
    if p.parts[0] not in ROOT_NAMES:
        raise UnsafeArchive(f"archive entry {name!r} is outside the known cache roots {ROOT_NAMES}")
    return p


def _downward(linkname: str) -> bool:
    """A relative link target without '..': it resolves below its own directory wherever it sits,
    so no chain of such links can leave the cache root. Cache trees hold no other kind of link."""
    return bool(linkname) and not linkname.startswith("/") and ".." not in linkname.split("/")


def extract(archive: Path, dest: Path, limits: Limits = Limits()) -> ExtractResult:
    """Extract a bundle into ``dest`` (created, must be empty), refusing anything unsafe.

    Raises UnsafeArchive naming the offending entry; ``dest`` is then left for the caller to remove.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise ValueError(f"{dest} is not empty")
    seen: set[str] = set()
    roots: set[str] = set()
    entries = files = total = 0
    with open(archive, "rb") as raw:
        reader = zstandard.ZstdDecompressor().stream_reader(raw)
        try:
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                for m in tar:
                    rel = _check_name(m.name)
                    key = rel.as_posix()
                    if key in seen:
                        # A second entry with one name could swap a checked file for a link.
                        raise UnsafeArchive(f"archive entry {m.name!r} appears twice")
                    seen.add(key)
                    roots.add(rel.parts[0])
                    entries += 1
                    if entries > limits.max_files:
                        raise UnsafeArchive(f"archive has more than {limits.max_files} entries")
                    target = dest / rel
                    if m.isdir():
                        target.mkdir(parents=True, exist_ok=True)
                    elif m.isreg():
                        files += 1
                        total += m.size
                        if m.size > limits.max_entry_bytes:
                            raise UnsafeArchive(f"archive entry {m.name!r} is {m.size} bytes, over the "
                                                f"{limits.max_entry_bytes} limit")
                        if total > limits.max_total_bytes:
                            raise UnsafeArchive(f"archive unpacks to more than {limits.max_total_bytes} bytes")
                        target.parent.mkdir(parents=True, exist_ok=True)
                        with open(target, "xb") as f:
                            shutil.copyfileobj(tar.extractfile(m), f, 1 << 20)
                        os.chmod(target, 0o755 if m.mode & 0o111 else 0o644)
                    elif m.issym():
                        if not _downward(m.linkname):
                            raise UnsafeArchive(f"archive link {m.name!r} -> {m.linkname!r} is absolute or goes "
                                                "up ('..'): it could leave the cache root")
                        target.parent.mkdir(parents=True, exist_ok=True)
                        os.symlink(m.linkname, target)
                    elif m.islnk():
                        to = _check_name(m.linkname)
                        if to.parts[0] != rel.parts[0] or to.as_posix() not in seen:
                            raise UnsafeArchive(f"archive hard link {m.name!r} -> {m.linkname!r} does not point to "
                                                "an earlier entry of its cache root")
                        os.link(dest / to, target, follow_symlinks=False)
                    else:
                        raise UnsafeArchive(f"archive entry {m.name!r} is a device, FIFO or other special file")
        except (tarfile.TarError, zstandard.ZstdError, EOFError) as e:
            raise UnsafeArchive(f"{archive.name} is not a readable tar.zst bundle: {e}") from None
        except OSError as e:
            raise write_error(e, e.filename or dest) from None
    return ExtractResult(tuple(sorted(roots)), files, total)


_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _copy_in(src_fd: int, name: str, dst_fd: int, dst_name: str) -> None:
    """Copy ``name`` (file, link or tree) from src_fd to dst_fd, creating only, following no link."""
    st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=src_fd), dst_name, dir_fd=dst_fd)
    elif stat.S_ISDIR(st.st_mode):
        os.mkdir(dst_name, 0o755, dir_fd=dst_fd)
        sfd = os.open(name, _NOFOLLOW_DIR, dir_fd=src_fd)
        try:
            dfd = os.open(dst_name, _NOFOLLOW_DIR, dir_fd=dst_fd)
            try:
                for child in sorted(os.listdir(sfd)):
                    _copy_in(sfd, child, dfd, child)
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)
    elif stat.S_ISREG(st.st_mode):
        sfd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src_fd)
        try:
            dfd = os.open(dst_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                          stat.S_IMODE(st.st_mode), dir_fd=dst_fd)
            try:
                with open(sfd, "rb", closefd=False) as fin, open(dfd, "wb", closefd=False) as fout:
                    shutil.copyfileobj(fin, fout, 1 << 20)
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)


def _merge(src_fd: int, src_name: str, dst_fd: int, name: str) -> tuple[int, int]:
    """Move ``src_name`` from src_fd to ``name`` in dst_fd by rename; keep whatever dst already has (entries are
    content-keyed). Everything is relative to directory fds opened with O_NOFOLLOW: a link a pod put in
    the cache tree is an entry to keep, never a way out of it."""
    try:
        dst = os.stat(name, dir_fd=dst_fd, follow_symlinks=False)
    except FileNotFoundError:
        try:
            os.rename(src_name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            # Another filesystem: copy next to the target first so the last step is still a rename.
            tmp = f".{name}.nodewarm-{os.getpid()}"
            _copy_in(src_fd, src_name, dst_fd, tmp)
            os.rename(tmp, name, src_dir_fd=dst_fd, dst_dir_fd=dst_fd)
        return 1, 0
    src = os.stat(src_name, dir_fd=src_fd, follow_symlinks=False)
    if not (stat.S_ISDIR(src.st_mode) and stat.S_ISDIR(dst.st_mode)):
        return 0, 1
    sfd = os.open(src_name, _NOFOLLOW_DIR, dir_fd=src_fd)
    try:
        try:
            dfd = os.open(name, _NOFOLLOW_DIR, dir_fd=dst_fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                return 0, 1  # swapped for a link since the stat: keep it, follow nothing
            raise
        try:
            moved = kept = 0
            for child in sorted(os.listdir(sfd)):
                m, k = _merge(sfd, child, dfd, child)
                moved, kept = moved + m, kept + k
            return moved, kept
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def install(staged: Path, roots: Mapping[str, Path], base: Path | None = None) -> dict[str, tuple[int, int]]:
    """Rename each extracted root from the staging dir into its place.

    A missing target root moves in with one atomic rename. An existing one gets the bundle's
    entries merged in by rename, each atomically, never overwriting a file already there.
    ``base`` is the trusted directory the roots lie in (the agent's: the compile-cache hostPath, whose
    contents a pod can change); below it no symlink is followed, and one in place of a root's folder
    fails with UnsafePath. Without ``base`` each root's parent is trusted as given.
    Returns root name -> (entries moved, entries kept).
    """
    result = {}
    for name in sorted(roots):
        src = staged / name
        if not src.is_dir():
            continue
        root = Path(os.path.abspath(roots[name]))
        trusted = Path(os.path.abspath(base)) if base is not None else root.parent
        if trusted != root.parent and trusted not in root.parents:
            raise ValueError(f"cache root {root} is not inside {trusted}")
        trusted.mkdir(parents=True, exist_ok=True)  # trusted by the caller: the walk below it follows nothing
        rel = root.relative_to(trusted)
        dst_fd = confined.open_dir(trusted, rel.parts[:-1], create=True)
        try:
            src_fd = os.open(staged, _NOFOLLOW_DIR)
            try:
                result[name] = _merge(src_fd, name, dst_fd, rel.name)
            finally:
                os.close(src_fd)
        finally:
            os.close(dst_fd)
    return result
