"""Peers before S3, what one request may read: an fd of the file that holds the range it names, or why not.

A request names an object by path and ETag (auth.object_path); what may be served is exactly the holdings'
objects (holdings.py), so a traversal, nodewarm's own ``.nodewarm/`` files or anything else under DEST is simply not
one of them (404). A verified file serves any range; a file still being pulled serves only the parts its journal
lists (s3pull.py writes a journal line after the part's bytes are in the page cache), anything else there is 416.
Every file is opened under DEST without following a link (confined.py): DEST's subfolders are not ours alone to
trust.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path, PurePosixPath
from urllib.parse import parse_qs, unquote, urlsplit

from nodewarm import logs

from .. import confined
from ..confined import UnsafePath
from ..weights.manifest import RemoteObject
from ..weights.partial import JOURNAL_SUFFIX, PART_SUFFIX, PARTIAL_DIR, parse_journal
from .auth import PREFIX
from .holdings import Holdings, Shelf

log = logs.get("bootstrap.weights.peers")

_RANGE = re.compile(r"bytes=(\d{1,19})-(\d{1,19})")


class NotHeld(Exception):
    """The request names nothing this node may serve (404), or a range of it not here yet (416)."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


def open_range(holdings: Holdings | Shelf, target: str, rng: str) -> tuple[int, int, int, int]:
    """An fd of the file that holds the range ``rng`` of the object ``target`` (the request's path and query) names,
    and the range and object size; else NotHeld."""
    url = urlsplit(target)
    query = parse_qs(url.query, keep_blank_values=True, strict_parsing=False)
    if not url.path.startswith(PREFIX) or list(query) != ["etag"] or len(query["etag"]) != 1:
        raise NotHeld(404, "not an object request")
    rel = unquote(url.path[len(PREFIX):])
    found = holdings.find(rel, query["etag"][0])
    if found is None:
        raise NotHeld(404, "not one of the models' objects at that ETag")
    where, obj, verified = found  # the model's Holdings that has it
    m = _RANGE.fullmatch(rng)
    if m is None:
        raise NotHeld(416, "one closed range 'bytes=a-b' is required")
    first, last = int(m[1]), int(m[2])
    if first > last or last >= obj.size:
        raise NotHeld(416, f"range {first}-{last} is not inside the object's {obj.size} bytes")
    dest = where.dest
    if not verified:
        fd = _open_partial(dest, obj, first, last)
        if fd is not None:
            return fd, first, last, obj.size
        # The pull may have renamed it into place since we looked.
        held = where.lookup(rel, obj.etag)
        if held is None or not held[1]:
            raise NotHeld(404, "neither verified nor being pulled here")
    fd = _open_file(dest, PurePosixPath(obj.rel_path), obj.size)
    if fd is None:
        raise NotHeld(404, "the verified file is not in place")
    return fd, first, last, obj.size


def _open_partial(dest: Path, obj: RemoteObject, first: int, last: int) -> int | None:
    """An fd of the temp file when its journal lists every part of [first, last]; None when there is no temp
    file; NotHeld(404) when it is another object version's, NotHeld(416) when some part is not there yet."""
    rel = PurePosixPath(PARTIAL_DIR) / obj.rel_path
    fd = _open_file(dest, rel.with_name(rel.name + PART_SUFFIX), obj.size)
    if fd is None:
        return None
    try:
        # Read after opening the data: every part the journal lists is in the file this fd reads.
        parts = _journaled_parts(dest, rel.with_name(rel.name + JOURNAL_SUFFIX), obj)
        if parts is None:
            raise NotHeld(404, "no partial of this object version")
        part_size, done = parts
        need = range(first // part_size, last // part_size + 1)
        # More parts than the journal lists cannot all be there: no walk over a huge range for nothing.
        if len(need) > len(done) or any(i not in done for i in need):
            raise NotHeld(416, f"parts {need.start}-{need.stop - 1} are not all here yet")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_regular(dest: Path, rel: PurePosixPath) -> int | None:
    """An fd of the regular file ``dest/rel``, reached without following a link; else None."""
    try:
        dfd = confined.open_dir(dest, rel.parts[:-1])
    except FileNotFoundError:
        return None
    except UnsafePath as e:
        log.warning("peers.unsafe_path", path=str(rel), why=str(e))
        return None
    try:
        fd = os.open(rel.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            log.warning("peers.unsafe_path", path=str(rel), why="a symlink: not following it")
        return None
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _open_file(dest: Path, rel: PurePosixPath, size: int) -> int | None:
    """``_open_regular`` when the file has the object's size (anything else is not that object's bytes)."""
    fd = _open_regular(dest, rel)
    if fd is not None and os.fstat(fd).st_size != size:
        os.close(fd)
        return None
    return fd


def _journaled_parts(dest: Path, rel: PurePosixPath, obj: RemoteObject) -> tuple[int, set[int]] | None:
    """The journal's part size and listed parts when its header is for ``obj``'s ETag and size; else None."""
    fd = _open_regular(dest, rel)
    if fd is None:
        return None
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace", newline="") as f:
        parsed = parse_journal(f.readlines())
    if parsed is None:
        return None
    header, parts = parsed
    if header.get("etag") != obj.etag or header.get("size") != obj.size:
        return None
    try:
        part_size = int(header["part_size"])
    except (ValueError, TypeError, KeyError):
        return None
    if part_size < 1:
        return None
    return part_size, set(parts)
