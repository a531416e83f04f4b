"""A client-go style work queue: keys, not events.

* A key added while queued is not queued twice; a key added while being processed is queued again
  once ``done`` is called (never processed by two workers at once).
* ``add_after`` schedules a key (deadlines); ``retry`` re-adds it with per-key exponential backoff,
  ``forget`` resets the backoff after a success.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque


class WorkQueue:
    def __init__(self, base_delay_s: float = 0.05, max_delay_s: float = 30.0):
        self._cv = threading.Condition()
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._delayed: list[tuple[float, int, str]] = []
        self._seq = 0
        self._failures: dict[str, int] = {}
        self._base, self._max = base_delay_s, max_delay_s
        self._shutdown = False

    def add(self, key: str) -> None:
        with self._cv:
            self._add_locked(key)

    def _add_locked(self, key: str) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._cv.notify()

    def add_after(self, key: str, delay_s: float) -> None:
        if delay_s <= 0:
            self.add(key)
            return
        with self._cv:
            self._seq += 1
            heapq.heappush(self._delayed, (time.monotonic() + delay_s, self._seq, key))
            self._cv.notify()

    def retry(self, key: str) -> float:
        with self._cv:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
        delay = min(self._max, self._base * (2 ** n))
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        with self._cv:
            self._failures.pop(key, None)

    def get(self, timeout_s: float | None = None) -> str | None:
        """Next key to process, or None on timeout/shutdown. Call ``done(key)`` afterwards."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cv:
            while True:
                now = time.monotonic()
                while self._delayed and self._delayed[0][0] <= now:
                    self._add_locked(heapq.heappop(self._delayed)[2])
                if self._queue:
                    key = self._queue.popleft()
                    self._processing.add(key)
                    self._dirty.discard(key)
                    return key
                if self._shutdown:
                    return None
                wait = None if deadline is None else deadline - now
                if self._delayed:
                    until_next = self._delayed[0][0] - now
                    wait = until_next if wait is None else min(wait, until_next)
                if wait is not None and wait <= 0:
                    if deadline is not None and now >= deadline:
                        return None
                    continue
                self._cv.wait(wait)

    def done(self, key: str) -> None:
        with self._cv:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cv.notify()

    def shutdown(self) -> None:
        with self._cv:
            self._shutdown = True
            self._cv.notify_all()

    def __len__(self) -> int:
        with self._cv:
            return len(self._queue)
