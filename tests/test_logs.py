"""nodewarm's structured logs (nodewarm/logs.py): the stderr handler follows the process's current stderr."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from nodewarm import logs


@pytest.fixture
def fresh(monkeypatch):
    """The 'nodewarm' logger as before any setup; put back afterwards (handlers, level, propagation)."""
    root = logging.getLogger("nodewarm")
    saved = (list(root.handlers), root.level, root.propagate)
    monkeypatch.setattr(logs, "_CONFIGURED", False)
    root.handlers = []
    yield root
    root.handlers, root.propagate = saved[0], saved[2]
    root.setLevel(saved[1])


def test_the_stderr_handler_writes_to_the_current_stderr_not_a_closed_one(fresh, monkeypatch):
    """What a test runner does to a process that configured its logs in an earlier test: swaps stderr per test and
    closes the old one. A handler holding the first stream printed "--- Logging error ---" for every later line."""
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logs.setup("INFO")
    logs.get("test").info("first.line", n=1)
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    errors: list[str] = []
    monkeypatch.setattr(logging.Handler, "handleError", lambda self, record: errors.append(record.getMessage()))
    logs.get("test").info("second.line", n=2)
    assert errors == []
    (line,) = second.getvalue().splitlines()
    assert json.loads(line)["event"] == "second.line"


def test_a_stream_named_at_setup_is_kept(fresh, monkeypatch):
    mine = io.StringIO()
    logs.setup("INFO", stream=mine)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    logs.get("test").info("kept.line")
    assert json.loads(mine.getvalue())["event"] == "kept.line"
