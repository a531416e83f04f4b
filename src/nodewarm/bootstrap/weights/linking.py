"""Files this node already holds verified in another model's folder: hard-linked into DEST instead of downloaded.

A model roll (v1 -> v2) usually changes a few files; the rest are the same bytes under a new prefix. The rule for
"the same bytes" is manifest.same_content (S3's checksum or MD5 ETag, never the name), applied only to files their
own folder's manifest records as verified and that are untouched on disk since. A hard link shares the inode, so
nothing is copied and nothing extra is held; the pull never writes into a final file (it renames new ones over),
so neither folder can change the other's bytes. Both folders are walked without following a link (confined.py).
"""

from __future__ import annotations

import errno
import os
import stat
from collections import defaultdict
from pathlib import Path, PurePosixPath

from nodewarm import logs

from .. import confined
from ..confined import UnsafePath
from . import manifest
from .manifest import LocalEntry, RemoteObject
from .partial import partial_paths

log = logs.get("bootstrap.weights")


def _stat(base: Path, rel: str) -> os.stat_result | None:
    """``base/rel`` reached without following a link, when it is a plain file."""
    p = PurePosixPath(rel)
    try:
        fd = confined.open_dir(base, p.parts[:-1])
    except (OSError, UnsafePath):
        return None
    try:
        st = os.stat(p.name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(fd)
    return st if stat.S_ISREG(st.st_mode) else None


class Linker:
    """The verified, untouched files of ``sources`` (other models' folders), by size, and the linking itself."""

    def __init__(self, dest: Path, sources: tuple[Path, ...]):
        self.dest = dest
        self.by_size: dict[int, list[tuple[Path, LocalEntry]]] = defaultdict(list)
        for src in sources:
            src = Path(os.path.abspath(src))
            if src == dest:
                continue
            read = manifest.read_local(src / manifest.STATE_DIR / manifest.MANIFEST_FILE)
            for entry in (read[1].values() if read else ()):
                st = _stat(src, entry.rel_path)
                if manifest.may_link_from(entry, (st.st_size, st.st_mtime_ns) if st else None):
                    self.by_size[entry.size].append((src, entry))

    def likely(self, size: int, etag: str) -> bool:
        """What the listing alone says (no checksum yet): a file of this size and ETag is held. Sizes the capacity
        check before the HEADs; ``link`` decides."""
        return bool(etag) and any(e.etag == etag for _, e in self.by_size.get(size, ()))

    def link(self, obj: RemoteObject) -> LocalEntry | None:
        """Hard-link a held file with ``obj``'s bytes to DEST/<rel path>; its manifest entry, or None (download)."""
        for src, entry in self.by_size.get(obj.size, ()):
            if manifest.same_content(entry, obj):
                linked = self._link(src, entry, obj)
                if linked is not None:
                    return linked
        return None

    def _link(self, src: Path, entry: LocalEntry, obj: RemoteObject) -> LocalEntry | None:
        temp, journal = partial_paths(self.dest, obj.rel_path)
        p = PurePosixPath(entry.rel_path)
        try:
            sfd = confined.open_dir(src, p.parts[:-1])
        except (OSError, UnsafePath) as e:
            log.info("weights.link_skipped", file=obj.rel_path, source=str(src / entry.rel_path), error=str(e))
            return None
        try:
            # The partial of an interrupted download is replaced: these bytes are already whole and verified.
            temp.parent.mkdir(parents=True, exist_ok=True)
            temp.unlink(missing_ok=True)
            journal.unlink(missing_ok=True)
            before = os.stat(p.name, dir_fd=sfd, follow_symlinks=False)
            os.link(p.name, temp, src_dir_fd=sfd, follow_symlinks=False)
        except OSError as e:
            # EXDEV (another filesystem), EMLINK, a file gone meanwhile: downloading still works.
            log.info("weights.link_skipped", file=obj.rel_path, source=str(src / entry.rel_path),
                     error=errno.errorcode.get(e.errno, str(e)))
            return None
        finally:
            os.close(sfd)
        after = temp.stat()
        if ((after.st_ino, after.st_dev, after.st_size, after.st_mtime_ns) !=
                (before.st_ino, before.st_dev, entry.size, entry.mtime_ns) or not stat.S_ISREG(after.st_mode)):
            temp.unlink()  # replaced or touched between the check and the link: not the verified bytes
            return None
        parent = confined.replace(temp, self.dest, obj.rel_path)
        try:
            os.fsync(parent)
        finally:
            os.close(parent)
        return LocalEntry(rel_path=obj.rel_path, key=obj.key, size=obj.size, etag=obj.etag,
                          version_id=obj.version_id, checksum=obj.checksum,
                          verified_by=manifest.LINKED + manifest.original_method(entry.verified_by),
                          mtime_ns=after.st_mtime_ns, sha256=entry.sha256)
