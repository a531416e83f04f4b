"""Structured logs: one JSON object per line on stderr, with an event name and fields.

Every long-running part (bootstrap, publisher, controller, demo) logs through ``log(event, **fields)``
so an operator can grep or ship the lines, and tests can assert on what happened and why.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from pathlib import Path

_CONFIGURED = False


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        doc.update(getattr(record, "fields", {}))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, sort_keys=False)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted, as logging's own last-resort handler does. A
    process may swap its stderr after setup (a test runner capturing each test's output, an embedding program): a
    handler holding the first one would write to a closed stream ("--- Logging error ---")."""

    def __init__(self):
        logging.Handler.__init__(self)     # StreamHandler's would store a stream: this one has none of its own

    @property
    def stream(self):
        return sys.stderr


def setup(level: str = "INFO", stream=None) -> None:
    """Configure the root 'nodewarm' logger once (idempotent)."""
    global _CONFIGURED
    root = logging.getLogger("nodewarm")
    root.setLevel(level.upper())
    if not _CONFIGURED:
        handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
        handler.setFormatter(_JsonFormatter())
        root.addHandler(handler)
        root.propagate = False
        _CONFIGURED = True


class Logger:
    """``log.info("weights.done", files=3, bytes=123)``: event name first, facts as fields."""

    def __init__(self, name: str):
        self._l = logging.getLogger(name if name.startswith("nodewarm") else f"nodewarm.{name}")

    def _emit(self, level: int, event: str, exc_info=None, **fields) -> None:
        if self._l.isEnabledFor(level):
            self._l.log(level, event, extra={"fields": fields}, exc_info=exc_info)

    def debug(self, event: str, **f) -> None:
        self._emit(logging.DEBUG, event, **f)

    def info(self, event: str, **f) -> None:
        self._emit(logging.INFO, event, **f)

    def warning(self, event: str, **f) -> None:
        self._emit(logging.WARNING, event, **f)

    def error(self, event: str, exc_info=None, **f) -> None:
        self._emit(logging.ERROR, event, exc_info=exc_info, **f)


def get(name: str) -> Logger:
    return Logger(name)


class _RawLines:
    """Writes JSON lines made elsewhere (a child process's log) to a handler's stream, under its lock."""

    def __init__(self, handler: logging.StreamHandler):
        self._h = handler

    def __call__(self, line: str) -> None:
        self._h.acquire()
        try:
            self._h.stream.write(line.rstrip("\n") + "\n")
            self._h.flush()
        finally:
            self._h.release()


@contextlib.contextmanager
def to_file(path: str | Path | None, level: str = "INFO"):
    """For the duration, send the 'nodewarm' logger's JSON lines to ``path`` (truncated) instead of its handlers,
    and other libraries' warnings there too (Python warnings included, as JSON), so a person's terminal shows
    only what is written for them; ``None``: to the current stderr instead of a file. Everything is put back
    afterwards. Yields a callable that appends one already-formatted line (a child process's JSON log line)
    to the same place, never in the middle of another line.

    Used by `nodewarm demo`; every other command keeps ``setup``'s stderr handler."""
    root, top = logging.getLogger("nodewarm"), logging.getLogger()
    saved = (list(root.handlers), root.level, root.propagate)
    if path is None:
        handler: logging.StreamHandler = logging.StreamHandler(sys.stderr)
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    handler.setFormatter(_JsonFormatter())
    others = logging.StreamHandler(handler.stream)      # the same stream and lock: lines never interleave
    others.setFormatter(_JsonFormatter())
    others.setLevel(logging.WARNING)
    others.lock = handler.lock
    for h in saved[0]:
        root.removeHandler(h)
    root.addHandler(handler)
    top.addHandler(others)
    logging.captureWarnings(True)
    if root.level == logging.NOTSET:
        root.setLevel(level.upper())
    root.propagate = False
    try:
        yield _RawLines(handler)
    finally:
        logging.captureWarnings(False)
        top.removeHandler(others)
        root.removeHandler(handler)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
        root.propagate = saved[2]
        if path is not None:
            handler.close()
        else:
            handler.flush()
