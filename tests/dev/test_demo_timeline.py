"""The demo's timeline and what a person sees: ordering checks, relative times, JSON and PNG output, the
chart's legend in words, and the live per-node table (a pure function from node states to lines)."""

from __future__ import annotations

import json

import pytest

import io
import logging
import re

from nodewarm import logs
from nodewarm_dev.demo import live
from nodewarm_dev.demo.timeline import (BASELINE_SPANS, SPANS, NodeTimeline, legend_labels, summary, table, write_json,
                                    write_png)


def node(name, **times):
    n = NodeTimeline(name)
    for phase, t in times.items():
        n.mark(phase, t)
    return n


def test_in_order_timeline_has_no_violations_and_relative_times():
    a = node("a", launched=100.0, registered=101.0, weights_done=105.0, taint_lifted=106.0, pod_bound=106.5)
    b = node("b", launched=100.5, registered=102.0, weights_done=107.0, taint_lifted=107.5, pod_bound=108.0)
    doc = summary([a, b], baseline={"launch_to_serving_s": 40.0})
    assert doc["nodes"]["a"]["seconds"]["launched"] == 0.0
    assert doc["nodes"]["b"]["seconds"]["pod_bound"] == 8.0
    assert doc["nodes"]["a"]["order_violations"] == [] and doc["totals"]["all_bound"]
    assert doc["totals"]["launch_to_bound_s_max"] == 7.5
    assert "wait for scheduler" in table([a, b])


def test_pod_bound_before_taint_lifted_is_a_violation():
    bad = node("x", launched=0.0, registered=1.0, pod_bound=2.0, taint_lifted=3.0)
    assert bad.order_violations() == ["taint_lifted (3.000) after pod_bound (2.000)"]


def test_an_agent_phase_ending_after_warm_is_a_violation():
    bad = node("x", launched=0.0, registered=1.0, weights_started=1.5, compile_cache_started=1.5,
               weights_done=3.0, warm_reported=3.1, compile_cache_restored=4.0)
    assert bad.order_violations() == ["warm_reported (3.100) before compile_cache_restored (4.000)"]
    ok = node("y", launched=0.0, registered=1.0, weights_started=1.5, compile_cache_started=1.5,
              compile_cache_restored=2.0, weights_done=3.0, warm_reported=3.1)
    assert ok.order_violations() == []  # the restore ending before the pull is the overlap working


def test_unknown_phase_and_first_mark_wins():
    n = NodeTimeline("n")
    with pytest.raises(ValueError):
        n.mark("warmish", 1.0)
    n.mark("launched", 1.0)
    n.mark("launched", 2.0)
    assert n.times["launched"] == 1.0


def test_json_and_png_are_written(tmp_path):
    nodes = [node("a", launched=0.0, registered=1.0, weights_started=1.2, compile_cache_started=1.2,
                  compile_cache_restored=1.5, weights_done=3.0, taint_lifted=3.5, pod_bound=4.0, serving=5.0)]
    write_json(summary(nodes), tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text())["totals"]["nodes"] == 1
    write_png(nodes, tmp_path / "t.png", baseline={"pull_from_s3_s": 4.0, "cold_compile_first_call_s": 6.0})
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the chart's legend ---------------------------------------------------------------------------------------------

def test_the_legend_names_every_phase_in_words_and_the_baseline_as_its_own_bars():
    labels = legend_labels()
    for words in ("pull weights", "restore compile cache", "wait for serving image", "wait for scheduler",
                  "report Warm, lift taint", "first compiled call", "boot to agent start"):
        assert words in labels, words
    # Words, not the timeline's keys (weights_done, pod_bound, ...).
    assert not [x for x in labels if "_" in x]
    base = [x for x in labels if x.startswith("no-warm baseline: ")]
    assert base == [label for label, _ in BASELINE_SPANS] and len(base) == 5
    assert labels == [label for label, _, _ in SPANS] + base
    # Both engines' baselines: real vLLM streaming from S3 and compiling cold, or the probe's pull + compile.
    assert "no-warm baseline: vLLM boot, streaming from S3, cold compile" in base
    assert "no-warm baseline: pull weights from S3 in the pod" in base
    assert {"engine boot (vLLM)", "first completion"} <= set(labels)


def test_the_png_draws_the_baseline_as_its_own_row_from_its_measured_parts(tmp_path, monkeypatch):
    import matplotlib.axes

    drawn, legends = [], []
    real_barh, real_legend = matplotlib.axes.Axes.broken_barh, matplotlib.axes.Axes.legend
    monkeypatch.setattr(matplotlib.axes.Axes, "broken_barh",
                        lambda self, xr, yr, **kw: drawn.append((xr, yr)) or real_barh(self, xr, yr, **kw))
    monkeypatch.setattr(matplotlib.axes.Axes, "legend",
                        lambda self, *a, **kw: legends.append([h.get_label() for h in kw["handles"]])
                        or real_legend(self, *a, **kw))
    nodes = [node("a", launched=0.0, registered=1.0, weights_started=1.2, weights_done=3.0, taint_lifted=3.5,
                  pod_bound=4.0, serving=5.0)]
    write_png(nodes, tmp_path / "t.png", baseline={"scheduler_wait_s": 1.0, "pull_from_s3_s": 4.0,
                                                   "cold_compile_first_call_s": 6.0})
    # The baseline row (y below the node's row) runs wait -> pull -> compile from the first registration.
    baseline = sorted(xr[0] for xr, yr in drawn if yr[0] > 0.5)
    assert baseline == [(1.0, 1.0), (2.0, 4.0), (6.0, 6.0)]
    assert legends == [["boot to agent start", "pull weights", "report Warm, lift taint", "wait for scheduler",
                        "first compiled call", "no-warm baseline: wait for scheduler",
                        "no-warm baseline: pull weights from S3 in the pod",
                        "no-warm baseline: cold compile, first call"]]


# -- the live table ---------------------------------------------------------------------------------------------------

ESC = re.compile(r"\x1b\[")


def state(name, **kw):
    return live.NodeState(name, **kw)


def test_live_rows_name_phase_weights_cache_and_time_per_node():
    states = [
        state("demo-node-0", times={"launched": 99.0, "registered": 100.0, "weights_started": 100.5},
              weights_bytes=376_000_000, weights_total=1_074_000_000, compile_cache="restored"),
        state("demo-node-1", times={"launched": 99.0, "registered": 100.0, "warm_reported": 111.0,
                                    "taint_lifted": 111.1}, weights_bytes=1_074_000_000, weights_total=1_074_000_000,
              compile_cache="restored"),
        state("demo-node-2", times={"launched": 99.0, "registered": 100.0, "pod_bound": 110.0, "serving": 111.6},
              weights_total=1_074_000_000, weights_bytes=1_074_000_000, compile_cache="restored", first_call_s=1.6,
              cache_hit=True),
        state("demo-node-3", times={"launched": 99.5}),
    ]
    lines = live.render_rows(states, now=112.5)
    assert lines[0].split() == ["node", "time", "phase", "weights", "compile", "cache"]
    row = dict(zip(("head", "n0", "n1", "n2", "n3"), lines))
    assert row["n0"].split()[:4] == ["demo-node-0", "12.5s", "pull", "weights"]
    assert "[#######.............]  35%   376/1074 MB" in row["n0"] and row["n0"].endswith("restored")
    assert "taint lifted, wait for scheduler" in row["n1"] and "100%  1074/1074 MB" in row["n1"]
    # A serving node's clock stops at its first compiled call: the moment the demo measures to.
    assert row["n2"].split()[:4] == ["demo-node-2", "11.6s", "serving", "(cache"] and "hit)" in row["n2"]
    assert row["n3"].split()[:3] == ["demo-node-3", "-", "launched"] and "[....................]" in row["n3"]
    assert row["n3"].endswith("-")
    # One column layout for all: each column starts at the same place on every line.
    for col, words in (("phase", ("pull", "taint", "serving", "launched")), ("weights", ("[",) * 4)):
        assert len({line.index(w) for line, w in zip(lines, (col,) + words)}) == 1, col
    assert not any(ESC.search(x) for x in lines)
    assert all(len(x) <= 40 for x in live.render_rows(states, 112.5, width=40))


def test_live_phase_follows_the_agents_log_lines():
    s = state("n", times={"registered": 10.0, "agent_started": 10.5})
    assert live.phase(s) == "agent starting"
    live.apply_agent_line(s, {"event": "weights.listed", "bytes": 1000}, 11.0)
    live.apply_agent_line(s, {"event": "download.progress", "bytes": 400}, 12.0)
    assert live.phase(s) == "pull weights" and (s.weights_bytes, s.weights_total) == (400, 1000)
    live.apply_agent_line(s, {"event": "agent.compile_cache", "status": "cold", "reason": "NoBundle"}, 12.5)
    assert s.compile_cache == "cold (NoBundle)"
    live.apply_agent_line(s, {"event": "weights.done", "ok": True, "bytes": 1000}, 13.0)
    assert live.phase(s) == "weights verified, report Warm" and s.weights_bytes == 1000
    live.apply_agent_line(s, {"event": "warm.reported", "status": "True"}, 13.1)
    assert live.phase(s) == "Warm reported, lift taint"
    live.apply_agent_line(s, {"event": "weights.failed", "reason": "ChecksumMismatch"}, 14.0)
    assert live.phase(s) == "failed: weights (ChecksumMismatch)"


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_live_view_redraws_in_place_on_a_terminal_and_prints_plain_lines_elsewhere(monkeypatch):
    monkeypatch.delenv("TERM", raising=False)
    clock = [100.0]
    for out in (Tty(), io.StringIO()):
        tl = {"a": NodeTimeline("a")}
        tl["a"].mark("registered", 100.0)
        view = live.LiveView(out, tl, clock=lambda: clock[0])
        view.say("1. step")
        view.start()
        view.agent_started("a", pid=0)
        view.agent_line("a", {"event": "weights.listed", "bytes": 10})
        view.refresh()
        view.say("2. step")
        view.agent_line("a", {"event": "weights.done", "bytes": 10})
        view.refresh()
        view.close()
        view.say("3. after")
        text = out.getvalue()
        if out.isatty():
            assert "\x1b[2K" in text and "\x1b[3F" not in text and "\x1b[2F\x1b[J2. step" in text
            # After close the table stays; later lines go below it.
            assert text.endswith("\x1b[J3. after\n") or text.endswith("3. after\n")
            assert text.index("weights verified") > text.index("2. step")
        else:
            assert not ESC.search(text)
            lines = text.splitlines()
            assert lines[0] == "1. step" and lines[-1] == "3. after" and "2. step" in lines
            assert "   a: pull weights (0.0s since registered)" in lines
            assert "   a: weights verified, report Warm, weights 0 MB (0.0s since registered)" in lines
            # A phase is printed once, when it changes.
            assert len([x for x in lines if "pull weights" in x]) == 1



def test_a_plain_line_is_timed_when_the_node_reached_its_phase_not_when_it_was_printed():
    """A real node's engine moments are marked after the fact (from its pod's log); the line printed then must not
    say the later moment, or it reads as later than the serving line that follows it."""
    out, clock = io.StringIO(), [130.0]
    tl = {"a": NodeTimeline("a")}
    tl["a"].mark("registered", 100.0)
    view = live.LiveView(out, tl, clock=lambda: clock[0])
    view.start()
    for key, at in (("pod_bound", 104.0), ("engine_ready", 110.0), ("first_completion", 112.0)):
        tl["a"].mark(key, at)
    view.refresh()
    view.served("a", 0.2, True)
    view.refresh()
    view.close()
    lines = out.getvalue().splitlines()
    assert "   a: vLLM ready, first completion (10.0s since registered)" in lines, lines
    assert "   a: serving (cache hit) (12.0s since registered)" in lines, lines


def test_log_routing_sends_json_to_a_file_and_restores_stderr(tmp_path, capsys):
    path = tmp_path / "logs" / "demo.jsonl"
    nodewarm_logger = logging.getLogger("nodewarm")
    before = list(nodewarm_logger.handlers)
    with logs.to_file(path) as raw:
        logs.get("demo").info("demo.step", n=1)
        raw('{"event": "weights.done", "node": "a"}')
        logging.getLogger("urllib3.connectionpool").warning("Connection pool is full")
    err = capsys.readouterr().err
    assert "demo.step" not in err and "Connection pool" not in err
    docs = [json.loads(x) for x in path.read_text().splitlines()]
    assert [d["event"] for d in docs] == ["demo.step", "weights.done", "Connection pool is full"]
    assert docs[0]["n"] == 1 and docs[0]["logger"] == "nodewarm.demo"
    assert nodewarm_logger.handlers == before


def test_log_json_keeps_the_json_logs_on_stderr(capsys):
    with logs.to_file(None) as raw:
        logs.get("demo").info("demo.step", n=2)
        raw('{"event": "agent.done", "node": "a"}')
    err = [json.loads(x) for x in capsys.readouterr().err.splitlines()]
    assert [d["event"] for d in err] == ["demo.step", "agent.done"]


def test_a_real_vllm_node_serves_at_its_first_completion_after_the_engine_booted(tmp_path):
    nodes = [node("a", launched=0.0, registered=1.0, weights_started=1.2, weights_done=3.0, warm_reported=3.2,
                  taint_lifted=3.5, pod_bound=4.0, engine_ready=40.0, first_completion=40.5)]
    assert nodes[0].order_violations() == []
    lines = table(nodes).splitlines()
    head = re.split(r"\s{2,}", lines[0])
    assert head[-3:] == ["engine boot (vLLM)", "first completion", "registered -> first completion"]
    assert re.split(r"\s{2,}", lines[1])[-3:] == ["36.0s", "0.5s", "39.5s"]
    # The engine's moments are ordered too: a completion before the engine was ready is a violation.
    bad = node("b", registered=1.0, pod_bound=4.0, engine_ready=40.0, first_completion=39.0)
    assert bad.order_violations()
    # The live table's clock stops at the first completion.
    s = live.NodeState("a", times={"registered": 1.0, "pod_bound": 4.0, "engine_ready": 40.0,
                                   "first_completion": 40.5}, first_call_s=36.5, cache_hit=True)
    assert live.elapsed(s, now=99.0) == "39.5s" and live.phase(s) == "serving (cache hit)"
    # The chart draws the vLLM baseline's parts from the first registration.
    write_png(nodes, tmp_path / "v.png", baseline={"scheduler_wait_s": 1.0, "engine_boot_s": 80.0,
                                                   "first_completion_s": 0.5})
    assert (tmp_path / "v.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
