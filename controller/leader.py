"""Leader election on a coordination.k8s.io/v1 Lease, as client-go does it.

Every replica keeps its caches warm; only the holder of the Lease acts. Acquire/renew is a PUT with
the Lease's resourceVersion, so two candidates racing for an expired Lease cannot both win (the
loser gets 409). A replica that cannot renew within ``renew_deadline_s`` steps down *before* the
Lease expires for others, so two leaders never act at once on a healthy clock. On a clean stop the
holder releases the Lease so the standby takes over at once instead of after ``lease_duration_s``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from kubernetes.client.exceptions import ApiException

from nodewarm import logs

from .kube import LEASES, Kube
from .model import fmt_time, parse_time


def _micro(t: float) -> str:
    # Lease times are MicroTime: exactly six fractional digits.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e6):06d}Z"


@dataclass(frozen=True)
class LeaderConfig:
    namespace: str
    name: str = "nodewarm-controller"
    identity: str = ""
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


class LeaderElector:
    def __init__(self, kube: Kube, cfg: LeaderConfig, on_started: Callable[[], None],
                 on_stopped: Callable[[], None]):
        self.kube, self.cfg = kube, cfg
        self.on_started, self.on_stopped = on_started, on_stopped
        self.is_leader = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_renew = 0.0
        self.log = logs.get("controller.leader")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(self.cfg.retry_period_s + 5)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                ok = self._try_acquire_or_renew()
                now = time.monotonic()
                if ok:
                    self._last_renew = now
                    if not self.is_leader.is_set():
                        self.is_leader.set()
                        self.log.info("leader.acquired", lease=f"{self.cfg.namespace}/{self.cfg.name}",
                                      identity=self.cfg.identity)
                        self.on_started()
                elif self.is_leader.is_set() and now - self._last_renew > self.cfg.renew_deadline_s:
                    self._step_down("renew deadline passed")
                self._stop.wait(self.cfg.retry_period_s)
        finally:
            if self.is_leader.is_set():
                self._step_down("stopping")
                self._release()

    def _step_down(self, why: str) -> None:
        self.is_leader.clear()
        (self.log.info if why == "stopping" else self.log.warning)("leader.lost", identity=self.cfg.identity, why=why)
        self.on_stopped()

    def _spec(self, now: float, acquire_time: str | None, transitions: int) -> dict:
        return {"holderIdentity": self.cfg.identity, "leaseDurationSeconds": max(1, int(self.cfg.lease_duration_s)),
                "acquireTime": acquire_time or _micro(now), "renewTime": _micro(now),
                "leaseTransitions": transitions}

    def _try_acquire_or_renew(self) -> bool:
        now = time.time()
        try:
            lease = self.kube.get(LEASES, self.cfg.name, self.cfg.namespace)
        except ApiException as e:
            if e.status != 404:
                self.log.warning("leader.get_failed", status=e.status)
                return False
            try:
                self.kube.create(LEASES, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                          "metadata": {"name": self.cfg.name, "namespace": self.cfg.namespace},
                                          "spec": self._spec(now, None, 0)}, self.cfg.namespace)
                return True
            except ApiException as e2:
                self.log.info("leader.create_lost", status=e2.status)
                return False
        except Exception as e:   # connection trouble: keep trying until the renew deadline
            self.log.warning("leader.get_failed", error=type(e).__name__)
            return False
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = parse_time(spec.get("renewTime")) or 0.0
        duration = spec.get("leaseDurationSeconds") or self.cfg.lease_duration_s
        # Compares the holder's wall-clock renewTime with ours: replicas need roughly synced clocks (NTP),
        # and renew_deadline < lease_duration leaves the margin for the skew.
        if holder and holder != self.cfg.identity and renewed + duration > now:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.cfg.identity else 1)
        acquire = spec.get("acquireTime") if holder == self.cfg.identity else None
        lease["spec"] = self._spec(now, acquire, transitions)
        try:
            self.kube.replace(LEASES, self.cfg.name, lease, self.cfg.namespace)
            return True
        except ApiException as e:
            self.log.info("leader.update_lost", status=e.status)
            return False
        except Exception as e:
            self.log.warning("leader.update_failed", error=type(e).__name__)
            return False

    def _release(self) -> None:
        try:
            lease = self.kube.get(LEASES, self.cfg.name, self.cfg.namespace)
            if (lease.get("spec") or {}).get("holderIdentity") != self.cfg.identity:
                return
            lease["spec"] = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1,
                             "renewTime": _micro(time.time())}
            self.kube.replace(LEASES, self.cfg.name, lease, self.cfg.namespace)
            self.log.info("leader.released", identity=self.cfg.identity, at=fmt_time(time.time()))
        except Exception as e:
            self.log.warning("leader.release_failed", error=type(e).__name__)
