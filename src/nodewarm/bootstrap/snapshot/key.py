"""What a restore depends on: the snapshot's key. Pure.

A restored process carries its memory as it was: the code it loaded from the image's files, the arguments and
environment it parsed, the CPU features its kernels were chosen for, the runtime that recorded it. So a snapshot
serves a new container only when all of these are the same:

* the container: its arguments, environment, working directory and user, the image's name and the node's
  layers under its root filesystem (the same image on this node has the same layers; a new digest has new ones);
* the node: its kernel, its CPU (model and every flag), its GPUs and driver, and the runc and CRIU that wrote
  and will read the images;
* the context the agent records in the store (``Store.context``): the generation it warmed (the model's identity
  and the serving spec) and the compile cache it restored. The container's mounts name neither: the same
  ``/models`` path holds another generation after a roll, and a restored process keeps the weights it loaded.

``HOSTNAME`` is left out: the runtime sets it to the pod's name, and the checkpointed pod is never the one that
is restored. The rest of the environment is the pod spec's and must match.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from nodewarm.api.schema import GROUP

CONTAINER_NAME_ANNOTATION = "io.kubernetes.cri.container-name"
IMAGE_NAME_ANNOTATION = "io.kubernetes.cri.image-name"
SANDBOX_NAME_ANNOTATION = "io.kubernetes.cri.sandbox-name"
SANDBOX_NAMESPACE_ANNOTATION = "io.kubernetes.cri.sandbox-namespace"
_UNKEYED_ENV = frozenset({"HOSTNAME"})
SCHEMA = f"{GROUP}/snapshot-key/v1"


@dataclass(frozen=True)
class NodeFacts:
    kernel: str
    cpu_model: str
    cpu_flags: str          # digest of the sorted flag set: a restore on a CPU without one of them faults later
    gpus: str               # "h100x8 driver 550.54.15", "" without GPUs
    runc: str
    criu: str


@dataclass(frozen=True)
class SnapshotKey:
    container: str
    args: tuple[str, ...]
    env: tuple[str, ...]
    cwd: str
    user: str
    image: str
    layers: tuple[str, ...]
    node: NodeFacts
    context: tuple[tuple[str, str], ...] = ()   # the agent's record (Store.context), as sorted pairs

    def to_dict(self) -> dict[str, Any]:
        """The key as its JSON record reads back (lists, not tuples), so a stored key compares equal to it."""
        return json.loads(self._canonical())

    def digest(self) -> str:
        return hashlib.sha256(self._canonical().encode()).hexdigest()

    def _canonical(self) -> str:
        return json.dumps({**asdict(self), "schema": SCHEMA}, sort_keys=True, separators=(",", ":"))

    @property
    def slot(self) -> str:
        """The store's name for this container's snapshot: its name and its arguments (one model, one slot)."""
        args = hashlib.sha256("\0".join(self.args).encode()).hexdigest()[:12]
        return f"{_safe(self.container)}-{args}"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:63] or "container"


def from_bundle(config: Mapping[str, Any], layers: tuple[str, ...], node: NodeFacts,
                context: Mapping[str, str] | None = None) -> SnapshotKey:
    """The key of the container an OCI bundle's ``config.json`` describes. ``layers`` are its root filesystem's
    lower directories on this node (``mountinfo.rootfs_layers``); ``context`` the store's (``Store.context``)."""
    process = config.get("process") or {}
    annotations = config.get("annotations") or {}
    user = process.get("user") or {}
    env = tuple(sorted(e for e in process.get("env") or () if e.split("=", 1)[0] not in _UNKEYED_ENV))
    return SnapshotKey(
        container=str(annotations.get(CONTAINER_NAME_ANNOTATION, "")),
        args=tuple(str(a) for a in process.get("args") or ()),
        env=env,
        cwd=str(process.get("cwd", "")),
        user=f"{user.get('uid', 0)}:{user.get('gid', 0)}",
        image=str(annotations.get(IMAGE_NAME_ANNOTATION, "")),
        layers=tuple(layers),
        node=node,
        context=tuple(sorted((str(k), str(v)) for k, v in (context or {}).items())),
    )


def differences(want: Mapping[str, Any], have: Mapping[str, Any]) -> list[str]:
    """The parts where a snapshot's key (``have``) differs from the container's (``want``), node facts one by one,
    environment variables by name: what a refusal says."""
    out: list[str] = []
    for part in sorted(set(want) | set(have)):
        a, b = want.get(part), have.get(part)
        if a == b:
            continue
        if part == "node" and isinstance(a, Mapping) and isinstance(b, Mapping):
            out += [f"node.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif part == "context" and isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            da, db = dict(map(tuple, a)), dict(map(tuple, b))
            out += [f"context.{k}" for k in sorted(set(da) | set(db)) if da.get(k) != db.get(k)]
        elif part == "env" and isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            names = sorted({e.split("=", 1)[0] for e in set(a) ^ set(b)})
            out += [f"env.{n}" for n in names]
        else:
            out.append(part)
    return out
