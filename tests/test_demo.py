"""A shortened `nodewarm demo` end to end: real API server, scheduler, controller-manager (Deployments
only), S3, bootstrap processes and controller. Asserts the ordering, never the timings."""

from __future__ import annotations

import io

import pytest

from nodewarm.demo.run import DemoOptions, execute


@pytest.mark.kube
@pytest.mark.torch
@pytest.mark.slow
def test_short_demo_orders_phases_and_binds_only_warm_nodes(tmp_path):
    out = io.StringIO()
    result = execute(DemoOptions(nodes=2, model_mb=32, workdir=tmp_path / "work", out_dir=tmp_path / "out"), out)
    text = out.getvalue()
    assert len(result.timelines) == 2
    for tl in result.timelines:
        t = tl.times
        assert {"registered", "weights_done", "warm_reported", "taint_lifted", "pod_bound"} <= set(t), (tl.node, t)
        # The taint is lifted only after the weights were verified and Warm was reported ...
        assert t["weights_done"] <= t["warm_reported"] <= t["taint_lifted"], t
        # ... and no replica was bound to the node before its taint was lifted.
        assert t["taint_lifted"] <= t["pod_bound"], t
        assert tl.order_violations() == []
        assert tl.facts["compile_cache"] == "restored" and tl.facts["compile_cache_hit"] is True
    assert result.summary["totals"]["all_bound"]
    assert (tmp_path / "out" / "timeline.json").exists() and (tmp_path / "out" / "timeline.png").exists()
    assert "Ordering: OK" in text and "No-warm baseline" in text
    # The baseline went through the same scheduler: its pods were bound by it, after their nodes registered.
    base = result.summary["baseline"]
    assert base["scheduler_wait_s"] > 0 and base["registered_to_serving_s"] > base["scheduler_wait_s"]
    assert f"registration to first compiled call: {base['ratio']:.2f}" in text
    assert "nodewarm_scheduler_wait_s" in base and "ratio_without_scheduler_waits" in base
