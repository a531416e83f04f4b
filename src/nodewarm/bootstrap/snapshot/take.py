"""The node agent's snapshot step: once the engine check passed, checkpoint its engine for the serving pod.

In snapshot mode the check pod runs the serving pod's vLLM container itself (nodewarm/nodeclasses/enginecheck.py),
under the snapshot RuntimeClass; its runner only watched it answer. The agent (root on the AL2023 host: dumping
another process needs CAP_SYS_ADMIN and CAP_SYS_PTRACE, which no pod of nodewarm gets) then:

1. records the context of every key in the store (the generation it warmed and the compile cache it restored) and
   removes the snapshots taken under another one, with what a crash left half-written (the agent is the one
   component that takes snapshots, and it takes one at a time);
2. finds that container in the check pod's status and checkpoints it (checkpoint.py), which ends it: the
   controller deletes the pod once the node reports.

Whatever happens, the node's Warm is the engine check's: a snapshot that could not be taken costs the serving pod
a boot, not the node its readiness. ``container_id`` is pure; ``take`` is the I/O.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from nodewarm import logs
from nodewarm.api import enginecheck
from nodewarm.api import snapshot as contract
from nodewarm.bootstrap.enginecheck.request import answering

log = logs.get("bootstrap.snapshot")


@dataclass(frozen=True)
class Settings:
    """Where the store is and which tools take a snapshot on this node (api.snapshot's paths on AL2023)."""
    store: Path
    runc_root: str = contract.RUNC_ROOT
    runc: str = "runc"
    criu: str = contract.CRIU_PATH


@dataclass(frozen=True)
class TakeResult:
    taken: bool
    reason: str                   # api.snapshot.TAKEN or NOT_TAKEN
    message: str
    slot: str = ""
    seconds: float | None = None
    image_bytes: int | None = None
    removed: tuple[str, ...] = ()  # snapshots removed because their key changed

    def annotation(self) -> dict:
        return {"taken": self.taken, "reason": self.reason, "message": self.message, "slot": self.slot,
                "seconds": self.seconds, "bytes": self.image_bytes}


def container_id(pod: dict | None, name: str = contract.CONTAINER) -> tuple[str | None, str]:
    """(the runtime's id of container ``name`` in the check pod, "") when it is running; else (None, why not)."""
    if pod is None:
        return None, "the engine check's pod is gone"
    for st in (pod.get("status") or {}).get("containerStatuses") or ():
        if st.get("name") != name:
            continue
        state = st.get("state") or {}
        if "running" not in state:
            return None, f"its {name} container is not running ({', '.join(state) or 'no state'})"
        runtime, _, cid = str(st.get("containerID") or "").partition("://")
        if runtime != "containerd" or not cid:
            return None, f"its {name} container runs under {runtime or 'no runtime'!r}, not containerd"
        return cid, ""
    return None, f"the check pod has no {name} container: is spec.serving.snapshot rendered and applied?"


def context(generation: str, cache) -> dict[str, str]:
    """The agent's part of the key: the generation warmed and the compile cache restored (or why it is cold)."""
    if cache is None:
        return {"generation": generation, "compileCache": "none"}
    if cache.status == "restored":
        return {"generation": generation, "compileCache": f"{cache.envelope_key}@{cache.generation}:{cache.sha256}"}
    return {"generation": generation, "compileCache": f"{cache.status}:{cache.reason}"}


def check_pod(api_client, node_name: str, namespace: str, profile: str, request_id: str) -> dict | None:
    """The check pod answering ``request_id`` on this node, read as the node may read pods bound to it."""
    from kubernetes import client as kc

    pods = kc.CoreV1Api(api_client).list_namespaced_pod(
        namespace, field_selector=f"spec.nodeName={node_name}", label_selector=enginecheck.label_selector(profile),
        _preload_content=False)
    return answering(json.loads(pods.data).get("items") or (), request_id)


def take_for_request(settings: Settings, api_client, node_name: str, namespace: str, profile: str,
                     request_id: str, key_context: dict[str, str]) -> TakeResult:
    """The agent's one call once the check passed: find the pod that answered ``request_id``, then ``take``.
    Never raises."""
    try:
        pod = check_pod(api_client, node_name, namespace, profile, request_id)
    except Exception as e:  # noqa: BLE001 - no snapshot; the serving pod boots and the node is Warm anyway
        return TakeResult(False, contract.NOT_TAKEN, _why("no snapshot: cannot read the check pod", e, 300))
    return take(settings, pod, key_context)


def _why(prefix: str, e: Exception, limit: int) -> str:
    return f"{prefix}: {type(e).__name__}: {' '.join(str(e).split())[:limit]}"


def take(settings: Settings, pod: dict | None, key_context: dict[str, str]) -> TakeResult:
    """Checkpoint the check pod's serving container into the store. Never raises: every failure is the result."""
    from . import checkpoint
    from .store import Store
    from .tools import Tools

    started = time.monotonic()
    try:
        store = Store(settings.store).open()
        store.sweep()
        removed = tuple(store.set_context(key_context))
        if removed:
            log.info("snapshot.removed", slots=list(removed), why="taken under another generation or cache")
        cid, why = container_id(pod)
        if cid is None:
            return TakeResult(False, contract.NOT_TAKEN, f"no snapshot: {why}", removed=removed)
        tools = Tools(runc=settings.runc, criu=settings.criu, criu_config=store.criu_config)
        got = checkpoint.checkpoint(store, tools, settings.runc_root, cid)
    except Exception as e:  # noqa: BLE001 - the serving pod boots instead; the node stays Warm
        msg = _why("no snapshot", e, 600)
        log.warning("snapshot.not_taken", error=msg, seconds=round(time.monotonic() - started, 3))
        return TakeResult(False, contract.NOT_TAKEN, msg)
    msg = (f"snapshot {got.snapshot.path.name} taken in {got.seconds:.1f}s ({got.image_bytes / 1e9:.2f} GB): the "
           "serving pod restores it instead of booting")
    log.info("snapshot.taken", slot=got.snapshot.path.name, seconds=round(got.seconds, 3), bytes=got.image_bytes)
    return TakeResult(True, contract.TAKEN, msg, got.snapshot.path.name, round(got.seconds, 3), got.image_bytes,
                      removed)
