"""Kubernetes Events for every decision, sent off the hot path.

Events are informational, so like client-go's broadcaster they are posted by a background thread
from a bounded queue: a slow or failing events endpoint never delays lifting a taint, and under an
event storm the oldest-first backlog is capped (dropped events are counted and logged, not retried
forever). Posting is rate-limited (a token bucket, ``qps`` with ``burst``): a burst of 1,000 nodes
warming at once must not turn into 2,000 event writes racing the taint patches for the API server's
attention; the backlog drains at ``qps``. Node and NodeClaim are cluster-scoped, so their events go to the ``default`` namespace,
where ``kubectl describe node`` / ``describe nodeclaim`` look for them.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from dataclasses import dataclass

from nodewarm import logs
from nodewarm.api.timeutil import fmt_time_s

from .kube import EVENTS, Kube

API_VERSIONS = {"Node": "v1", "NodeClaim": "karpenter.sh/v1", "WarmProfile": "nodewarm.io/v1alpha1",
                "EC2NodeClass": "karpenter.k8s.aws/v1", "NodeClass": "eks.amazonaws.com/v1", "NodePool": "karpenter.sh/v1"}
COMPONENT = "nodewarm-controller"


@dataclass(frozen=True)
class EventSpec:
    kind: str                       # Node | NodeClaim | WarmProfile | NodePool | a NodeClass (API_VERSIONS)
    name: str
    uid: str
    reason: str
    message: str
    type: str = "Normal"


class EventRecorder:
    def __init__(self, kube: Kube, namespace: str = "default", capacity: int = 4096, instance: str = "",
                 qps: float = 10.0, burst: int = 100):
        self.kube, self.namespace = kube, namespace
        self.qps, self.burst = qps, burst
        self._tokens, self._refilled = float(burst), time.monotonic()
        self._closing = threading.Event()
        self.instance = instance or socket.gethostname()
        self._q: queue.Queue[tuple[EventSpec, EventSpec | None] | None] = queue.Queue(maxsize=capacity)
        self.dropped = 0
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self.log = logs.get("controller.events")

    def start(self) -> None:
        self._thread.start()

    def stop(self, flush_timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + flush_timeout_s
        while not self._q.empty() and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            self._q.put_nowait(None)
        except queue.Full:
            pass
        self._closing.set()
        self._thread.join(max(0.1, deadline - time.monotonic()))

    def emit(self, ev: EventSpec, related: EventSpec | None = None) -> None:
        try:
            self._q.put_nowait((ev, related))
        except queue.Full:
            self.dropped += 1
            self.log.warning("event.dropped", kind=ev.kind, name=ev.name, reason=ev.reason)

    def _ref(self, e: EventSpec) -> dict:
        ref = {"apiVersion": API_VERSIONS.get(e.kind, "v1"), "kind": e.kind, "name": e.name}
        if e.uid:
            ref["uid"] = e.uid
        return ref

    def _take_token(self) -> bool:
        """Wait for a token; False when stopping (what is still queued then is dropped)."""
        while True:
            now = time.monotonic()
            self._tokens = min(float(self.burst), self._tokens + (now - self._refilled) * self.qps)
            self._refilled = now
            if self._tokens >= 1:
                self._tokens -= 1
                return True
            if self._closing.wait((1 - self._tokens) / self.qps):
                return False

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                if not self._take_token():
                    self.dropped += 1
                    continue
                ev, related = item
                now = fmt_time_s(time.time())
                body = {
                    "apiVersion": "v1", "kind": "Event",
                    "metadata": {"generateName": f"{ev.name}.", "namespace": self.namespace},
                    "involvedObject": self._ref(ev), "reason": ev.reason, "message": ev.message[:1024],
                    "type": ev.type, "source": {"component": COMPONENT}, "firstTimestamp": now,
                    "lastTimestamp": now, "count": 1, "reportingComponent": COMPONENT,
                    "reportingInstance": self.instance,
                }
                if related is not None:
                    body["related"] = self._ref(related)
                try:
                    self.kube.create(EVENTS, body, self.namespace)
                    self.sent += 1
                except Exception as e:   # informational: log and move on
                    self.log.warning("event.failed", kind=ev.kind, name=ev.name, reason=ev.reason,
                                     error=getattr(e, "status", type(e).__name__))
            finally:
                self._q.task_done()
