"""The handler's decisions as Events on the pods they were about: what `kubectl describe pod` shows beside the pod's
own log line ("nodewarm snapshot: ...").

The handler runs inside containerd's shim, with no API identity; it leaves each decision in ``<store>/outcomes/``
(restore.py). The agent, which follows the node as the node, posts each one as an Event on that pod and removes the
file: a Normal Event when the pod was restored or simply had no snapshot yet, a Warning when a snapshot was there
but could not be used (another key, corrupt, no CRIU, a failed restore), since then the node boots where it was
meant to restore. ``event`` is pure; ``Reporter`` is the I/O, a thread beside the agent's follow loop.
"""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from pathlib import Path

from nodewarm import logs
from nodewarm.api.snapshot import CONTAINER

log = logs.get("bootstrap.snapshot")

COMPONENT = "nodewarm-agent"
# Decisions that are not a problem: the first pod on a node has no snapshot yet.
_NORMAL = frozenset({"Restored", "NoSnapshot"})
POLL_S = 2.0


def event(doc: dict, node_name: str) -> dict | None:
    """The core/v1 Event for one outcome record, or None when it names no pod (not a Kubernetes container) or is about
    another container than the serving one: the RuntimeClass is the pod's, so its init container and sidecar pass
    the handler too, and their "no snapshot" says nothing worth an Event."""
    namespace, _, pod = str(doc.get("pod", "")).partition("/")
    if not namespace or not pod or doc.get("container") != CONTAINER:
        return None
    reason = str(doc.get("reason") or "Unknown")
    at = datetime.fromtimestamp(float(doc.get("at") or 0), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    container = str(doc.get("container", ""))
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{pod[:200]}.snapshot-", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod,
                           **({"fieldPath": f"spec.containers{{{container}}}"} if container else {})},
        "reason": f"Snapshot{reason}" if not reason.startswith("Snapshot") else reason,
        "message": f"container {container}: {doc.get('message', '')}"[:1024],
        "type": "Normal" if reason in _NORMAL else "Warning",
        "source": {"component": COMPONENT, "host": node_name},
        "firstTimestamp": at, "lastTimestamp": at, "count": 1,
    }


class Reporter:
    """Posts the store's outcome records as Events, every POLL_S, until ``stop``."""

    def __init__(self, api_client, node_name: str, store_root: Path, stop: threading.Event):
        self.api_client, self.node_name, self.outcomes, self.stop = (
            api_client, node_name, Path(store_root) / "outcomes", stop)
        self.posted = 0
        self._thread = threading.Thread(target=self._run, name="snapshot-events", daemon=True)

    def start(self) -> "Reporter":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(POLL_S):
            self.poll()

    def poll(self) -> int:
        """Post what is pending; a record is removed once posted, or when the API refuses it for good (4xx):
        kept, it would be refused again forever. Returns how many were posted."""
        from kubernetes import client as kc
        from kubernetes.client.exceptions import ApiException

        posted = 0
        try:
            records = sorted(self.outcomes.glob("*.json"))
        except OSError:
            return 0
        for path in records:
            try:
                body = event(json.loads(path.read_text()), self.node_name)
            except (OSError, ValueError, TypeError):
                body = None
            try:
                if body is not None:
                    kc.CoreV1Api(self.api_client).create_namespaced_event(body["metadata"]["namespace"], body)
                    posted += 1
            except ApiException as e:
                if e.status in (408, 429) or e.status >= 500:
                    continue                         # the API is busy or away: the next round tries again
                log.warning("snapshot.event_refused", status=e.status, record=path.name,
                            reason=" ".join(str(e.reason).split())[:200])
            except Exception as e:  # noqa: BLE001 - unreachable API: the next round tries again
                log.warning("snapshot.event_failed", error=f"{type(e).__name__}: {e}"[:300])
                continue
            path.unlink(missing_ok=True)
        self.posted += posted
        return posted
