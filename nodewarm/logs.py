"""Structured logs: one JSON object per line on stderr, with an event name and fields.

Every long-running part (bootstrap, publisher, controller, demo) logs through ``log(event, **fields)``
so an operator can grep or ship the lines, and tests can assert on what happened and why.
"""

from __future__ import annotations

import json
import logging
import sys
import time

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


def setup(level: str = "INFO", stream=None) -> None:
    """Configure the root 'nodewarm' logger once (idempotent)."""
    global _CONFIGURED
    root = logging.getLogger("nodewarm")
    root.setLevel(level.upper())
    if not _CONFIGURED:
        handler = logging.StreamHandler(stream or sys.stderr)
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
