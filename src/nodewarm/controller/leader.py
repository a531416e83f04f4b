"""Leader election on a coordination.k8s.io/v1 Lease, the way client-go's leaderelection does it.

* Expiry is judged by when *this* replica observed the Lease record change, on its own monotonic
  clock, never by comparing the holder's ``renewTime`` with our wall clock: replicas' clocks need not
  agree, only run at about the same rate. A candidate takes a held Lease only after it has seen the
  same record for ``leaseDurationSeconds``; a released Lease (empty holder) at once.
* Acquire/renew is a PUT with the Lease's resourceVersion: two candidates racing cannot both win (409).
* Every request of an attempt carries a timeout that ends before the renew deadline, so a hung API
  call cannot keep a replica in office past it.
* The holder acts only while ``leading()``: until ``renew_deadline`` after the *start* of its last
  successful renew attempt. Another replica can only have observed that renew after it started, and
  waits ``lease_duration`` (> ``renew_deadline``) from then: a stalled leader has stopped acting
  before anyone else may start. Work in flight is bounded by ``remaining_s()``.
* Stopping steps down first; the owner releases the Lease (``release``) only after its workers stopped.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from kubernetes.client.exceptions import ApiException

from nodewarm import logs

from .kube import LEASES, Kube

# client-go's JitterFactor: the renew deadline must leave room for more than one retry period.
JITTER_FACTOR = 1.2


def _micro(t: float) -> str:
    # Lease times are MicroTime: exactly six fractional digits.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e6):06d}Z"


class NotLeading(Exception):
    """This replica's Lease no longer covers a write: drop the work, the next leader re-enqueues it."""


@dataclass(frozen=True)
class LeaderConfig:
    namespace: str
    name: str = "nodewarm-controller"
    identity: str = ""
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        # The same checks as client-go's NewLeaderElector: without them two leaders are possible.
        if not self.identity:
            raise ValueError("leader election needs a non-empty identity")
        if self.lease_duration_s <= self.renew_deadline_s:
            raise ValueError(f"lease duration ({self.lease_duration_s}s) must be greater than the renew deadline "
                             f"({self.renew_deadline_s}s)")
        if self.renew_deadline_s <= JITTER_FACTOR * self.retry_period_s:
            raise ValueError(f"renew deadline ({self.renew_deadline_s}s) must be greater than {JITTER_FACTOR} x the "
                             f"retry period ({self.retry_period_s}s)")

    @property
    def request_timeout_s(self) -> float:
        """One request's ceiling: a failed attempt still leaves time for a retry before the deadline."""
        return self.renew_deadline_s - self.retry_period_s


@dataclass(frozen=True)
class Term:
    """One stretch of leadership on this replica's monotonic clock (tests compare replicas' terms)."""

    acquired_at: float
    stopped_at: float | None = None      # when acting ended (at the latest, the renew deadline)
    noticed_at: float | None = None      # when the election loop stepped down (callbacks ran)


class LeaderElector:
    def __init__(self, kube: Kube, cfg: LeaderConfig, on_started: Callable[[], None],
                 on_stopped: Callable[[], None]):
        self.kube, self.cfg = kube, cfg
        self.on_started, self.on_stopped = on_started, on_stopped
        self._lock = threading.Lock()
        self._leading = False
        self._valid_until = 0.0               # monotonic: act only before this
        self._observed: tuple | None = None   # the Lease record as last seen ...
        self._observed_at = 0.0               # ... and when we first saw it (monotonic)
        self._holds = False                   # our last write made us the holder (release may clear it)
        self.terms: list[Term] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.log = logs.get("controller.leader")

    # -- what the controller asks ----------------------------------------------------------------------
    def leading(self) -> bool:
        with self._lock:
            return self._leading and time.monotonic() < self._valid_until

    def remaining_s(self) -> float:
        """Seconds this replica may still act; requests it sends must end within them."""
        with self._lock:
            return max(0.0, self._valid_until - time.monotonic()) if self._leading else 0.0

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop campaigning and step down. The Lease is kept: ``release`` it once the work has stopped."""
        self._stop.set()
        if self._thread:
            self._thread.join(self.cfg.request_timeout_s * 2 + self.cfg.retry_period_s + 1)
        self._step_down("stopping")

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            outcome = self._try_acquire_or_renew(started)
            if outcome == "ok":
                with self._lock:
                    self._valid_until = started + self.cfg.renew_deadline_s
                    became = not self._leading
                    self._leading = True
                    if became:
                        self.terms.append(Term(time.monotonic()))
                if became:
                    self.log.info("leader.acquired", lease=f"{self.cfg.namespace}/{self.cfg.name}",
                                  identity=self.cfg.identity)
                    self.on_started()
            elif outcome == "taken":
                self._step_down("another replica holds the Lease")
            elif time.monotonic() >= self._valid_until:
                self._step_down("renew deadline passed")
            wait = self.cfg.retry_period_s
            with self._lock:
                if self._leading:   # wake up in time to step down even if no retry is due yet
                    wait = min(wait, max(0.0, self._valid_until - time.monotonic()))
            self._stop.wait(wait)

    def _step_down(self, why: str) -> None:
        with self._lock:
            if not self._leading:
                return
            self._leading = False
            now = time.monotonic()
            # Acting already ended at the deadline if we only notice it later.
            self.terms[-1] = Term(self.terms[-1].acquired_at, min(now, self._valid_until), now)
        (self.log.info if why == "stopping" else self.log.warning)("leader.lost", identity=self.cfg.identity, why=why)
        self.on_stopped()

    # -- one attempt ---------------------------------------------------------------------------------------
    def _timeout(self, started: float) -> float:
        with self._lock:
            if self._leading:
                return min(self.cfg.request_timeout_s, self._valid_until - time.monotonic())
        return self.cfg.request_timeout_s - (time.monotonic() - started)

    def _record(self, spec: dict) -> tuple:
        return (spec.get("holderIdentity") or "", spec.get("leaseDurationSeconds"), spec.get("acquireTime"),
                spec.get("renewTime"), spec.get("leaseTransitions"))

    def _spec(self, acquire_time: str | None, transitions: int) -> dict:
        now = _micro(time.time())
        return {"holderIdentity": self.cfg.identity, "leaseDurationSeconds": max(1, int(self.cfg.lease_duration_s)),
                "acquireTime": acquire_time or now, "renewTime": now, "leaseTransitions": transitions}

    def _try_acquire_or_renew(self, started: float) -> str:
        """'ok' (we hold the Lease now), 'taken' (another replica holds a live Lease) or 'failed'."""
        timeout = self._timeout(started)
        if timeout <= 0:
            return "failed"
        try:
            lease = self.kube.get(LEASES, self.cfg.name, self.cfg.namespace, timeout=timeout)
        except ApiException as e:
            if e.status != 404:
                self.log.warning("leader.get_failed", status=e.status)
                return "failed"
            return self._create(started)
        except Exception as e:   # timeout, connection trouble: retry until the renew deadline
            self.log.warning("leader.get_failed", error=type(e).__name__)
            return "failed"
        spec = lease.get("spec") or {}
        record = self._record(spec)
        now = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        holder = record[0]
        if holder and holder != self.cfg.identity:
            self._holds = False
            duration = spec.get("leaseDurationSeconds") or self.cfg.lease_duration_s
            if now < self._observed_at + duration:
                return "taken"
            self.log.info("leader.expired", holder=holder, observed_s=round(now - self._observed_at, 3))
        mine = holder == self.cfg.identity
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        lease["spec"] = self._spec(spec.get("acquireTime") if mine else None, transitions)
        timeout = self._timeout(started)
        if timeout <= 0:
            return "failed"
        try:
            after = self.kube.replace(LEASES, self.cfg.name, lease, self.cfg.namespace, timeout=timeout)
        except ApiException as e:
            self.log.info("leader.update_lost", status=e.status)
            return "failed"
        except Exception as e:
            self.log.warning("leader.update_failed", error=type(e).__name__)
            return "failed"
        self._observed, self._observed_at, self._holds = self._record(after.get("spec") or {}), time.monotonic(), True
        return "ok"

    def _create(self, started: float) -> str:
        timeout = self._timeout(started)
        if timeout <= 0:
            return "failed"
        try:
            after = self.kube.create(LEASES, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                              "metadata": {"name": self.cfg.name, "namespace": self.cfg.namespace},
                                              "spec": self._spec(None, 0)}, self.cfg.namespace, timeout=timeout)
        except Exception as e:
            self.log.info("leader.create_lost", error=getattr(e, "status", type(e).__name__))
            return "failed"
        self._observed, self._observed_at, self._holds = self._record(after.get("spec") or {}), time.monotonic(), True
        return "ok"

    def release(self) -> None:
        """Hand the Lease over at once (holder cleared, 1 s duration). Call after the workers stopped."""
        if not self._holds or self.leading():
            return
        try:
            lease = self.kube.get(LEASES, self.cfg.name, self.cfg.namespace, timeout=self.cfg.request_timeout_s)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.cfg.identity:
                return
            now = _micro(time.time())
            lease["spec"] = {"holderIdentity": "", "leaseDurationSeconds": 1, "acquireTime": now, "renewTime": now,
                             "leaseTransitions": int(spec.get("leaseTransitions") or 0)}
            self.kube.replace(LEASES, self.cfg.name, lease, self.cfg.namespace, timeout=self.cfg.request_timeout_s)
            self._holds = False
            self.log.info("leader.released", identity=self.cfg.identity)
        except Exception as e:
            self.log.warning("leader.release_failed", error=getattr(e, "status", type(e).__name__))
