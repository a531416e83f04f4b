"""Bytes done, rate and ETA: a log line every few seconds, and a bar when stderr is a terminal."""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, TextIO

from nodewarm import logs

log = logs.get("bootstrap.weights")

# Who else hears each Progress's snapshots: set by the caller around the code that creates the Progress (the
# agent around warm_weights), captured when a Progress is made. A context variable, not a global, so two
# agents in one process (tests) each hear their own pull.
_LISTENER: contextvars.ContextVar[Callable[[str, "Snapshot"], None] | None] = \
    contextvars.ContextVar("nodewarm_progress_listener", default=None)


@contextlib.contextmanager
def listening(fn: Callable[[str, "Snapshot"], None] | None) -> Iterator[None]:
    """Progress objects made inside this block call ``fn(phase, snapshot)`` at the first request sent, on every
    tick and once at the end (from the pull's or their own thread: ``fn`` must be quick and must not block)."""
    token = _LISTENER.set(fn)
    try:
        yield
    finally:
        _LISTENER.reset(token)


@dataclass(frozen=True)
class Snapshot:
    done: int
    total: int
    elapsed_s: float
    rate_bps: float  # over the whole transfer so far

    @property
    def eta_s(self) -> float | None:
        return (self.total - self.done) / self.rate_bps if self.rate_bps > 0 else None


def render_bar(s: Snapshot, width: int = 30) -> str:
    frac = s.done / s.total if s.total else 1.0
    filled = int(frac * width)
    eta = f"{s.eta_s:.0f}s" if s.eta_s is not None else "?"
    return (f"[{'#' * filled}{'.' * (width - filled)}] {frac * 100:5.1f}% "
            f"{s.done / 1e9:.2f}/{s.total / 1e9:.2f} GB {s.rate_bps / 1e6:.0f} MB/s ETA {eta}")


class Progress:
    """Thread-safe byte counter for one phase. ``add`` is called from the download threads."""

    def __init__(self, phase: str, total: int, interval_s: float = 5.0, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.phase, self.total, self._clock = phase, total, clock
        self._lock = threading.Lock()
        self._done = 0
        self._start = clock()
        self._stop = threading.Event()
        self._stream = stream if stream is not None else sys.stderr
        self._tty = hasattr(self._stream, "isatty") and self._stream.isatty()
        self._interval = interval_s
        self._thread = threading.Thread(target=self._run, name=f"progress-{phase}", daemon=True)
        self._listener = _LISTENER.get()

    def __enter__(self) -> "Progress":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._tell(self.snapshot())
        if self._tty:
            self._stream.write("\r" + render_bar(self.snapshot()) + "\n")
            self._stream.flush()

    first_byte_at: float | None = None  # wall clock (time.time()) of the first byte: the timeline's "first byte"
    first_request_at: float | None = None  # wall clock of the first GET sent (start-up ends here, bench/weights.py)

    def request_sent(self) -> None:
        if self.first_request_at is None:  # racing threads may both set it: a microsecond apart
            self.first_request_at = time.time()
            self._tell(self.snapshot())    # at once: the agent starts its compile-cache phase on it

    def add(self, n: int) -> None:
        with self._lock:
            self._done += n
            if self.first_byte_at is None and n > 0:
                self.first_byte_at = time.time()

    def snapshot(self) -> Snapshot:
        with self._lock:
            done = self._done
        elapsed = self._clock() - self._start
        return Snapshot(done, self.total, elapsed, done / elapsed if elapsed > 0 else 0.0)

    def _run(self) -> None:
        last_log = self._clock()
        tick = 0.5 if self._tty else self._interval
        while not self._stop.wait(tick):
            s = self.snapshot()
            self._tell(s)
            if self._tty:
                self._stream.write("\r" + render_bar(s))
                self._stream.flush()
            if self._clock() - last_log >= self._interval:
                last_log = self._clock()
                log.info(f"{self.phase}.progress", bytes=s.done, total_bytes=s.total,
                         rate_mb_s=round(s.rate_bps / 1e6, 1),
                         eta_s=round(s.eta_s, 1) if s.eta_s is not None else None)

    def _tell(self, s: Snapshot) -> None:
        if self._listener is None:
            return
        try:
            self._listener(self.phase, s)
        except Exception as e:  # noqa: BLE001 - a listener's bug must not stop the pull or its log lines
            log.warning(f"{self.phase}.progress_listener_failed", error=f"{type(e).__name__}: {e}")
