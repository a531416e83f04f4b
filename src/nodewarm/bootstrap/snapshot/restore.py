"""A create that may become a restore: the decision, the act, and the way back to a boot.

``try_restore`` returns True only when the container runs from its snapshot; on False the caller runs the plain
create. What it decided goes to the container's log (this process's stdout is the pod's log pipe on a create)
and to the store's outcomes for the agent's Event.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from nodewarm.api import snapshot as contract
from nodewarm.bootstrap.snapshot import key as snapkey
from nodewarm.bootstrap.snapshot import devshm, nodefacts, runcargs
from nodewarm.bootstrap.snapshot.store import SnapshotUnusable, Store, verify, write_file
from nodewarm.bootstrap.snapshot.tools import Tools, log_tail

RESTORED = "Restored"
BOOTED = "Booted"


def try_restore(call: runcargs.RuncCall, store: Store, *, runc: str, criu: str, timeout: float) -> bool:
    started = time.monotonic()
    bundle = Path(call.option("--bundle", "-b") or os.getcwd())
    try:
        config = json.loads((bundle / "config.json").read_text())
    except (OSError, ValueError):
        return False                       # not a bundle runc could use either: runc says why
    annotations = config.get("annotations") or {}
    if snapkey.CONTAINER_NAME_ANNOTATION not in annotations:
        return False                       # the sandbox's pause container, or not a Kubernetes container
    own = devshm.with_own_shm(config)
    if own is not None:                    # booted or restored, the container's /dev/shm is its own
        write_file(bundle / "config.json", json.dumps(own))
        config = own
    pod = (f"{annotations.get(snapkey.SANDBOX_NAMESPACE_ANNOTATION, '')}/"
           f"{annotations.get(snapkey.SANDBOX_NAME_ANNOTATION, '')}")
    outcome = _Outcome(store, call.container_id, pod, annotations[snapkey.CONTAINER_NAME_ANNOTATION], started)
    try:
        store.open()
        tools = Tools(runc=runc, criu=criu, criu_config=store.criu_config)
        facts = nodefacts.probe(runc, criu)
        rootfs = bundle / (config.get("root") or {}).get("path", "rootfs")
        want = snapkey.from_bundle(config, nodefacts.rootfs_layers(str(rootfs)), facts, store.context())
        snapshot = store.lookup(want.slot)
        if snapshot is None:
            return outcome.booted("NoSnapshot", "no snapshot of this container on this node")
        diffs = snapkey.differences(want.to_dict(), snapshot.key)
        if diffs:
            return outcome.booted("KeyMismatch", f"the snapshot {want.slot} was taken under another key "
                                                 f"(differs in {', '.join(diffs[:8])})")
        outcome.lap("key")
        verify(snapshot)
        outcome.lap("verify")
    except nodefacts.ToolMissing as e:
        return outcome.booted("NoCRIU", str(e))
    except SnapshotUnusable as e:
        return outcome.booted("SnapshotCorrupt", f"the snapshot {want.slot} is unusable: {e}")
    except Exception as e:                 # the handler must never stop a pod from booting
        return outcome.booted("HandlerError", f"{type(e).__name__}: {e}")
    return _restore(call, store, tools, snapshot, outcome, timeout)


def _restore(call, store, tools, snapshot, outcome, timeout) -> bool:
    work = store.root / f".restore-{call.container_id}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o700)
    try:
        cmd = [tools.runc, *runcargs.restore_argv(call, str(snapshot.images), str(work))]
        try:
            rc = tools.run(cmd, timeout).returncode
            why = f"runc restore exited {rc}"
        except subprocess.TimeoutExpired:
            rc, why = -1, f"runc restore did not finish in {timeout:.0f}s"
        if rc == 0:
            outcome.lap("criu")
            shutil.rmtree(work, ignore_errors=True)      # CRIU's log of a restore that worked: nothing to keep
            store.mark_restored(call.container_id)
            outcome.restored(snapshot.path.name)
            return True
        why += f" (CRIU: {log_tail(work / 'restore.log')})"
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
    # Nothing half-restored may stay: the container id is about to be created afresh.
    subprocess.run(tools.runc_cmd(call.global_args, "delete", "--force", call.container_id),
                   capture_output=True, timeout=60)
    shutil.rmtree(work, ignore_errors=True)
    return outcome.booted("RestoreFailed", why)


class _Outcome:
    def __init__(self, store: Store, container_id: str, pod: str, container: str, started: float):
        self.store, self.container_id, self.pod, self.container, self.started = (
            store, container_id, pod, container, started)
        self.phases: dict[str, float] = {}      # where a restore's time went: the key, the manifest, CRIU
        self._lap_ms = 0

    def _elapsed_ms(self) -> int:
        return round((time.monotonic() - self.started) * 1000)

    def lap(self, phase: str) -> None:
        # Laps are cut on whole milliseconds since the start, so they add up to no more than the recorded total;
        # rounding each lap on its own could overshoot it.
        at = self._elapsed_ms()
        self.phases[phase], self._lap_ms = (at - self._lap_ms) / 1000, at

    def booted(self, reason: str, message: str) -> bool:
        self._record(BOOTED, reason, f"booting instead: {message}")
        return False

    def restored(self, slot: str) -> None:
        laps = ", ".join(f"{k} {v:.1f}s" for k, v in self.phases.items())
        self._record(RESTORED, "Restored", f"{contract.RESTORED_PREFIX}{slot} in "
                                           f"{time.monotonic() - self.started:.1f}s ({laps})")

    def _record(self, result: str, reason: str, message: str) -> None:
        line = f"{contract.LOG_PREFIX}{message}"
        try:
            print(line, file=sys.stdout, flush=True)
        except OSError:
            pass
        doc = {"result": result, "reason": reason, "message": message, "pod": self.pod,
               "container": self.container, "containerID": self.container_id,
               "seconds": self._elapsed_ms() / 1000, "phases": self.phases, "at": time.time()}
        try:
            self.store.record_outcome(self.container_id, doc)
        except (OSError, ValueError):
            pass
