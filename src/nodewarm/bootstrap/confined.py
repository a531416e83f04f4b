"""File operations confined below a trusted directory, never following a symbolic link.

The agent runs as root, and parts of the trees it writes are writable by pods (the compile-cache
hostPath) or described by files on disk (the local manifest). A path-based unlink, mkdir or rename
follows any symlink planted in a parent component, so every operation here walks from the trusted
directory one component at a time with O_NOFOLLOW (openat-style) and acts relative to the directory
fd it reached: a link anywhere below the base is refused, never followed.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from pathlib import Path, PurePosixPath

from nodewarm.api.errors import NodewarmError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(NodewarmError):
    reason = "UnsafePath"


def check_rel(rel: str, what: str = "path") -> PurePosixPath:
    """``rel`` as a safe relative path (no absolute, '..', '.', empty or backslash component). Pure."""
    norm = posixpath.normpath(rel) if rel else ""
    if not rel or rel.startswith("/") or "\\" in rel or norm != rel or norm == ".." or norm.startswith("../"):
        raise UnsafePath(f"{what} {rel!r} is not a plain relative path (absolute, '..', or not normalised)")
    return PurePosixPath(rel)


def open_dir(base: Path, parts: tuple[str, ...] | PurePosixPath, create: bool = False, mode: int = 0o755) -> int:
    """An fd of ``base/parts`` reached without following a link below ``base``; the caller closes it.

    With ``create``, missing directories are made on the way. Raises UnsafePath when a component is a
    symlink or not a directory, FileNotFoundError when one is missing and ``create`` is false.
    """
    parts = parts.parts if isinstance(parts, PurePosixPath) else tuple(parts)
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts):
            if create:
                try:
                    os.mkdir(name, mode, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePath(f"{base.joinpath(*parts[:i + 1])} is a symlink or not a directory: not "
                                     "following it (planted by a pod, or left by something else?)") from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlink(base: Path, rel: str) -> bool:
    """Remove the file ``base/rel`` (a symlink there is removed itself, never its target); False when
    it was not there. A parent that is a link or a directory in its place is refused."""
    p = check_rel(rel)
    try:
        fd = open_dir(base, p.parts[:-1])
    except FileNotFoundError:
        return False
    try:
        os.unlink(p.name, dir_fd=fd)
        return True
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        raise UnsafePath(f"{base / rel} is a directory where a file of ours was") from None
    finally:
        os.close(fd)


def replace(src: Path, base: Path, rel: str) -> int:
    """Rename ``src`` onto ``base/rel``, making the parents, never following a link below ``base``.
    Returns an fd of the parent directory (to fsync; the caller closes it)."""
    p = check_rel(rel)
    fd = open_dir(base, p.parts[:-1], create=True)
    try:
        try:
            st = os.stat(p.name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise UnsafePath(f"{base / rel} is a directory; it cannot take the file's place")
        os.replace(src, p.name, dst_dir_fd=fd)
    except BaseException:
        os.close(fd)
        raise
    return fd
