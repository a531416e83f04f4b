"""Take a snapshot of a running container: runc checkpoints it with CRIU into the store.

The container must have been created by the handler (the snapshot RuntimeClass), so that its /dev/shm is its
own and goes into the images (devshm.py says why).

Run by the node's root component (the agent on AL2023), never by the pod: dumping another process needs
CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_NET_ADMIN, CAP_SYS_RESOURCE and CAP_CHECKPOINT_RESTORE, which would make the
serving pod privileged. The container stops when it is dumped (its state is the snapshot now).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from nodewarm.api.snapshot import CHECKPOINT_TIMEOUT_S
from nodewarm.bootstrap.snapshot import key as snapkey
from nodewarm.bootstrap.snapshot import nodefacts
from nodewarm.bootstrap.snapshot.store import Snapshot, Store
from nodewarm.bootstrap.snapshot.tools import Tools, log_tail


class CheckpointFailed(Exception):
    pass


@dataclass(frozen=True)
class Taken:
    snapshot: Snapshot
    seconds: float
    image_bytes: int


def checkpoint(store: Store, tools: Tools, runc_root: str, container_id: str,
               timeout: float = CHECKPOINT_TIMEOUT_S) -> Taken:
    started = time.monotonic()
    state = _state(tools, runc_root, container_id)
    if state.get("status") != "running":
        raise CheckpointFailed(f"container {container_id} is {state.get('status')!r}, not running")
    bundle = Path(state["bundle"])
    config = json.loads((bundle / "config.json").read_text())
    rootfs = state.get("rootfs") or str(bundle / (config.get("root") or {}).get("path", "rootfs"))
    try:
        facts = nodefacts.probe(tools.runc, tools.criu)
    except nodefacts.ToolMissing as e:
        raise CheckpointFailed(str(e)) from None
    key = snapkey.from_bundle(config, nodefacts.rootfs_layers(rootfs), facts, store.context())
    staging = store.stage(key.slot)
    try:
        work = staging / "work"
        work.mkdir()
        cmd = tools.runc_cmd(("--root", runc_root), "checkpoint", "--image-path", str(staging / "images"),
                             "--work-path", str(work), container_id)
        try:
            out = tools.run(cmd, timeout, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            raise CheckpointFailed(f"runc checkpoint did not finish in {timeout:.0f}s") from None
        if out.returncode != 0:
            raise CheckpointFailed(f"runc checkpoint exited {out.returncode}: {out.stderr.strip()[-300:]} "
                                   f"(CRIU: {log_tail(work / 'dump.log')})")
        image_bytes = sum(p.stat().st_size for p in (staging / "images").rglob("*") if p.is_file())
        snapshot = store.publish(staging, key.slot, key.to_dict())
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Taken(snapshot, time.monotonic() - started, image_bytes)


def _state(tools: Tools, runc_root: str, container_id: str) -> dict:
    out = tools.run(tools.runc_cmd(("--root", runc_root), "state", container_id), 30, capture_output=True, text=True)
    if out.returncode != 0:
        raise CheckpointFailed(f"runc state {container_id}: {out.stderr.strip()[-300:]}")
    return json.loads(out.stdout)
