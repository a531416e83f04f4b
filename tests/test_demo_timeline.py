"""The demo's timeline: ordering checks, relative times, JSON and PNG output."""

from __future__ import annotations

import json

import pytest

from nodewarm.demo.timeline import NodeTimeline, summary, table, write_json, write_png


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
