"""What a person watching `nodewarm demo` sees while the nodes warm: one line per node (time since the node
registered, phase, weights progress, compile cache).

On a terminal the lines are redrawn in place (plain ANSI: cursor up, erase line), with the demo's step
messages printed above them; anywhere else (a pipe, a file, a CI log) each node's phase changes are printed
as plain lines, with no escape codes. ``render_rows`` is a pure function from node states to lines.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TextIO

from nodewarm import logs

from nodewarm.api.timeline import Timeline

from .timeline import DemoPhase, NodeTimeline

log = logs.get("demo.live")

BAR_WIDTH = 20
REFRESH_S = 0.25


@dataclass
class NodeState:
    """One node as the view knows it: timeline moments (seconds since the epoch) and what the agent said."""

    node: str
    times: dict[str, float] = field(default_factory=dict)
    weights_bytes: int = 0               # landed so far
    weights_total: int | None = None     # from the agent's listing of the model prefix
    compile_cache: str = ""              # "", "restoring", "restored", "cold (NoBundle)", ...
    first_call_s: float | None = None
    cache_hit: bool | None = None
    failed: str | None = None


_STEPS = ((DemoPhase.ENGINE_READY, "vLLM ready, first completion"),
          (DemoPhase.POD_BOUND, "pod bound, serving starts"),
          (DemoPhase.TAINT_LIFTED, "taint lifted, wait for scheduler"),
          (Timeline.WARM_REPORTED, "Warm reported, lift taint"),
          (Timeline.WEIGHTS_DONE, "weights verified, report Warm"),
          (Timeline.WEIGHTS_STARTED, "pull weights"), (Timeline.AGENT_STARTED, "agent starting"),
          (DemoPhase.REGISTERED, "registered, tainted"), (DemoPhase.LAUNCHED, "launched"))


def _latest_step(s: NodeState) -> tuple[str, str | None]:
    """The latest step the node reached, in words, and its timeline key (None: failed, serving or pending)."""
    if s.failed:
        return f"failed: {s.failed}", None
    if s.first_call_s is not None:
        return "serving" + (" (cache hit)" if s.cache_hit else " (cache miss)" if s.cache_hit is False else ""), None
    return next(((words, key) for key, words in _STEPS if key in s.times), ("pending", None))


def phase(s: NodeState) -> str:
    """Where the node is, in words: the latest step it reached."""
    return _latest_step(s)[0]


def bar(done: int, total: int | None, width: int = BAR_WIDTH) -> str:
    """``[#######.............]  35%  376/1074 MB``; without a total yet, an empty bar."""
    if not total:
        return f"[{'.' * width}]"
    frac = min(max(done / total, 0.0), 1.0)
    filled = int(frac * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {frac * 100:3.0f}% {done / 1e6:5.0f}/{total / 1e6:.0f} MB"


def elapsed(s: NodeState, now: float) -> str:
    """Seconds since the node registered, stopped when it serves (the moment the demo's ratio is measured to)."""
    start = s.times.get(DemoPhase.REGISTERED)
    if start is None:
        return "-"
    served = s.times.get(DemoPhase.FIRST_COMPLETION, s.times.get(DemoPhase.SERVING))
    end = served if s.first_call_s is not None and served is not None else now
    return f"{max(end - start, 0.0):.1f}s"


# "time": seconds since the node registered. The narrowest columns first: a narrow terminal cuts the last.
HEADER = ("node", "time", "phase", "weights", "compile cache")


def render_rows(states: list[NodeState], now: float, width: int | None = None) -> list[str]:
    """The table's lines (a header, then one per node), each cut to ``width`` so the terminal never wraps
    them (a wrapped line would break redrawing in place)."""
    rows = [HEADER] + [(s.node, elapsed(s, now), phase(s), bar(s.weights_bytes, s.weights_total),
                        s.compile_cache or "-") for s in states]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return [x[:width] for x in lines] if width else lines


def summary_line(s: NodeState, now: float) -> str:
    """The plain line printed when a node's phase changes (no terminal), timed at the moment the node reached that
    phase: a real node's engine moments are placed after the fact, from its pod, and the line comes later."""
    words, key = _latest_step(s)
    facts = [words]
    if s.weights_total and s.weights_bytes >= s.weights_total:
        facts.append(f"weights {s.weights_total / 1e6:.0f} MB")
    if s.compile_cache:
        facts.append(f"compile cache {s.compile_cache}")
    return f"   {s.node}: " + ", ".join(facts) + f" ({elapsed(s, s.times.get(key, now))} since registered)"


# -- what the agent process says (its JSON log lines on stderr) ---------------------------------------------------
def apply_agent_line(s: NodeState, doc: dict, now: float) -> None:
    """Fold one of the agent's JSON log lines into the node's state."""
    ev = doc.get("event")
    if ev == "weights.listed":
        s.weights_total = int(doc.get("bytes") or 0) or s.weights_total
        s.times.setdefault(Timeline.WEIGHTS_STARTED, now)
    elif ev == "download.progress":
        s.weights_bytes = max(s.weights_bytes, int(doc.get("bytes") or 0))
    elif ev == "weights.file_ready":
        s.times.setdefault(Timeline.WEIGHTS_STARTED, now)
    elif ev == "weights.done":
        s.times.setdefault(Timeline.WEIGHTS_DONE, now)
        s.weights_total = int(doc.get("bytes") or 0) or s.weights_total
        s.weights_bytes = s.weights_total or s.weights_bytes
    elif ev == "weights.failed":
        s.failed = f"weights ({doc.get('reason')})"
    elif ev == "compilecache.restore.done":
        s.compile_cache = "restored"
    elif ev == "agent.compile_cache":
        status, reason = doc.get("status"), doc.get("reason")
        s.compile_cache = "restored" if status == "restored" else f"{status} ({reason})" if reason else str(status)
    elif ev == "warm.reported" and doc.get("status") in (True, "True"):
        s.times.setdefault(Timeline.WARM_REPORTED, now)


def written_bytes(pid: int) -> int | None:
    """Bytes the process has written so far (/proc/<pid>/io ``wchar``: its pwrite()s of the weights, a little
    log): a smoother weights bar than the agent's progress line every 5 s. None where /proc cannot say."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


class LiveView:
    """The table while the nodes warm, and the step messages around it. Thread-safe."""

    def __init__(self, out: TextIO, timelines: dict[str, NodeTimeline], tty: bool | None = None,
                 clock: Callable[[], float] = time.time):
        self.out, self.timelines, self.clock = out, timelines, clock
        self.tty = is_terminal(out) if tty is None else tty
        self.nodes = {n: NodeState(n) for n in timelines}
        self._pids: dict[str, int] = {}
        self._lock = threading.RLock()
        self._drawn = 0                 # lines of the table on screen now (terminal)
        self._printed: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- messages and lifecycle -------------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        with self._lock:
            if self.tty and self._drawn:
                self.out.write(f"\x1b[{self._drawn}F\x1b[J")   # erase the table, print above it, draw it again
                self._drawn = 0
                self.out.write(msg + "\n")
                self._draw()
            else:
                self.out.write(msg + "\n")
            self.out.flush()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="demo-live-view", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop refreshing; the last table stays on screen (terminal), the last changes are printed (otherwise).
        Idempotent; nothing is drawn if the view never started."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.refresh()
        with self._lock:
            self._drawn = 0       # what is on screen now stays; later messages go below it

    # -- what the demo tells it -----------------------------------------------------------------------------
    def agent_started(self, node: str, pid: int) -> None:
        with self._lock:
            self._pids[node] = pid
            self.nodes[node].times.setdefault(Timeline.AGENT_STARTED, self.clock())

    def agent_line(self, node: str, doc: dict) -> None:
        with self._lock:
            apply_agent_line(self.nodes[node], doc, self.clock())

    def agent_ended(self, node: str, error: str | None = None) -> None:
        with self._lock:
            self._pids.pop(node, None)
            if error:
                self.nodes[node].failed = error

    def served(self, node: str, first_call_s: float, hit: bool) -> None:
        with self._lock:
            self.nodes[node].first_call_s, self.nodes[node].cache_hit = first_call_s, hit

    # -- drawing ----------------------------------------------------------------------------------------------
    def states(self) -> list[NodeState]:
        """Each node's state, with the moments its timeline has recorded (the watcher's, the agent's report)."""
        with self._lock:
            out = []
            for n, s in self.nodes.items():
                s.times.update(self.timelines[n].times)
                pid = self._pids.get(n)
                if pid and s.weights_total and Timeline.WEIGHTS_DONE not in s.times:
                    w = written_bytes(pid)
                    if w is not None:     # never shown as complete before the agent says it verified the weights
                        s.weights_bytes = max(s.weights_bytes, min(w, int(s.weights_total * 0.99)))
                out.append(s)
            return out

    def refresh(self) -> None:
        with self._lock:
            if self.tty:
                if self._drawn:
                    self.out.write(f"\x1b[{self._drawn}F")
                self._draw()
            else:
                now = self.clock()
                for s in self.states():
                    key = phase(s) + "|" + s.compile_cache
                    if self._printed.get(s.node) != key:
                        self._printed[s.node] = key
                        self.out.write(summary_line(s, now) + "\n")
            self.out.flush()

    def _draw(self) -> None:
        lines = render_rows(self.states(), self.clock(), terminal_width(self.out) - 1)
        for line in lines:
            self.out.write("\x1b[2K" + line + "\n")
        self.out.write("\x1b[J")
        self._drawn = len(lines)

    def _run(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                self.refresh()
            except Exception as e:          # the view must never stop the demo; the next tick tries again
                log.debug("demo.live.refresh_failed", error=str(e))


def is_terminal(out: TextIO) -> bool:
    try:
        return out.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


def terminal_width(out: TextIO) -> int:
    try:
        return os.get_terminal_size(out.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 120


def parse_line(line: str) -> dict | None:
    """One JSON log line, or None (a traceback line, a stray print)."""
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
