"""Peers before S3, what this node offers: the objects of each model it holds, and which of them are verified here.

A pull tells its ``Holdings`` (weights/sharing.py's HoldingsSink, handed to it by modelcache/warmer.py) the model's
listed objects and then each file as it is kept, linked or lands verified; a ``Shelf`` holds one Holdings per model
the node serves. The server (serve.py) serves exactly these objects, by path and ETag (openrange.py): nothing else
under DEST is one of them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterable

from ..weights.manifest import RemoteObject, local_rel_path


class Holdings:
    """What this node may serve: the manifest's objects, which of them are verified at dest/<rel>, thread-safe."""

    def __init__(self, dest: Path):
        self.dest = Path(dest)
        self._lock = threading.Lock()
        self._objects: dict[str, RemoteObject] = {}
        self._verified: set[str] = set()

    def set_objects(self, objects: Iterable[RemoteObject]) -> None:
        """The manifest (replaces the previous one). Nothing of it counts as verified yet: the pull marks each file
        again as it keeps or lands it, and a file of an earlier manifest may be another version."""
        objects = {local_rel_path(o.rel_path): o for o in objects}
        with self._lock:
            self._objects, self._verified = objects, set()

    def mark_verified(self, rel_path: str) -> None:
        """``dest/rel_path`` is in place and verified (called as each file is renamed into place or kept)."""
        with self._lock:
            if rel_path in self._objects:
                self._verified.add(rel_path)

    def lookup(self, rel_path: str, etag: str) -> tuple[RemoteObject, bool] | None:
        """The manifest's object at ``rel_path`` when its ETag is ``etag``, and whether it is verified here."""
        with self._lock:
            obj = self._objects.get(rel_path)
            if obj is None or obj.etag != etag:
                return None
            return obj, rel_path in self._verified

    def find(self, rel_path: str, etag: str) -> tuple[Holdings, RemoteObject, bool] | None:
        """``lookup``, with where: what the server asks of a Holdings or a Shelf alike."""
        found = self.lookup(rel_path, etag)
        return None if found is None else (self, *found)

    def summary(self) -> dict:
        with self._lock:
            return {"files": len(self._verified), "bytes": sum(self._objects[r].size for r in self._verified)}


class Shelf:
    """Every model this node serves, one Holdings per model key. A request names an object by its path and ETag only:
    whichever model holds it serves it, a verified copy first (a roll links a file into two folders)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._models: dict[str, Holdings] = {}

    def put(self, model: str, holdings: Holdings) -> None:
        with self._lock:
            self._models[model] = holdings

    def drop(self, model: str) -> None:
        with self._lock:
            self._models.pop(model, None)

    def get(self, model: str) -> Holdings | None:
        with self._lock:
            return self._models.get(model)

    def find(self, rel_path: str, etag: str) -> tuple[Holdings, RemoteObject, bool] | None:
        with self._lock:
            models = list(self._models.values())
        found = None
        for holdings in models:
            hit = holdings.find(rel_path, etag)
            if hit is not None and hit[2]:
                return hit
            found = found or hit
        return found
