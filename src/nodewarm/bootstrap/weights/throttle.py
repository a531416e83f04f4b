"""Keeping nodewarm's transfers behind the node's own work: one bandwidth cap over many connections (the peer
server's outgoing bytes, peers/serve.py; a background pull's incoming bytes, s3pull.py) and a lower CPU and I/O
priority for the threads of a pull that runs while the node serves."""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading
from typing import Callable

from nodewarm import logs

log = logs.get("bootstrap.weights")


class TokenBucket:
    """At most ``rate`` bytes a second over every caller together, up to one second's worth at once.

    ``take`` reserves its bytes at once, going into debt, and sleeps off its share of that debt: callers are served
    in the order they asked, whatever their sizes. ``clock`` and ``sleep`` are given so that the arithmetic is
    tested with a fake clock; ``sleep(s)`` returns True when the wait was cut short (``threading.Event.wait``).
    """

    def __init__(self, rate: float, clock: Callable[[], float], sleep: Callable[[float], bool]):
        if not rate > 0:
            raise ValueError(f"a bandwidth cap of {rate} bytes/s would never send anything")
        self.rate = float(rate)
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._tokens = self.rate
        self._last = clock()

    def take(self, n: int) -> bool:
        """Wait until ``n`` more bytes may be sent; False when the wait was cut short."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.rate, self._tokens + (now - self._last) * self.rate) - n
            self._last = now
            wait = -self._tokens / self.rate
        return wait <= 0 or not self._sleep(wait)


# ioprio_set(2) has no libc wrapper and its number differs per architecture; these are the two node kinds.
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}.get(platform.machine())
_IOPRIO_WHO_PROCESS = 1
IOPRIO_CLASS_IDLE = 3
IOPRIO_CLASS_SHIFT = 13


def lower_thread_priority(nice: int) -> None:
    """Make the calling thread yield to the rest of the node: CPU nice ``nice`` (0: leave it), and with it the idle
    I/O class.

    Per thread, not per process: on Linux setpriority(PRIO_PROCESS, tid) and ioprio_set(IOPRIO_WHO_PROCESS, tid)
    act on that one thread, so the agent's other threads (the Node updates, the peer server) keep their priority.
    Elsewhere a native thread id is no process id, so nothing is changed.

    Idle I/O class: the pull's reads and the writeback it starts itself (sync_file_range, fsync) are submitted from
    this thread, so the serving pod's I/O goes first under schedulers that honour classes (BFQ, mq-deadline), and
    those bound how long idle requests may wait, so the pull is slowed, not stalled; with "none" (common for NVMe)
    the class is ignored and the bandwidth cap does the work. Best effort: a failed ioprio_set leaves the thread at
    the best-effort level its nice implies (ioprio_set(2)), which is still below the pod's.
    """
    if nice <= 0 or sys.platform != "linux":
        return
    tid = threading.get_native_id()
    try:
        # Never raise it back: a process already nicer than asked stays so (lowering nice needs CAP_SYS_NICE).
        os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
    except OSError as e:
        log.warning("weights.nice_failed", nice=nice, error=str(e))
    if _IOPRIO_SET is not None:
        ctypes.CDLL(None, use_errno=True).syscall(_IOPRIO_SET, _IOPRIO_WHO_PROCESS, tid,
                                                  IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT)
