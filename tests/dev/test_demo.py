"""A shortened `nodewarm demo` end to end: real API server, scheduler, controller-manager (Deployments
only), S3, bootstrap processes and controller; once with the torch.compile probe (two nodes), once with real
vLLM serving (one node, and the baseline streaming from S3). Asserts the ordering and the evidence, never the
timings, and that what a person reads (stdout, not a terminal here) is plain text while the JSON logs go to the
file it names."""

from __future__ import annotations

import io
import json
import re

import pytest

from nodewarm.api.agentpod import NAME as AGENT
from nodewarm_dev.demo.run import DemoOptions, execute


@pytest.mark.kube
@pytest.mark.torch
@pytest.mark.slow
def test_short_demo_orders_phases_and_binds_only_warm_nodes(tmp_path):
    out = io.StringIO()
    result = execute(DemoOptions(nodes=2, model_mb=32, engine="probe", workdir=tmp_path / "work",
                                 out_dir=tmp_path / "out"), out)
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

    # Not a terminal: plain lines, no escape codes, no JSON; the log file is named first and holds the JSON logs.
    log_file = tmp_path / "out" / "demo-log.jsonl"
    lines = text.splitlines()
    assert lines[0].endswith(f": {log_file}") and "JSON logs" in lines[0]
    assert "\x1b" not in text and "\r" not in text
    assert not [x for x in lines if x.lstrip().startswith("{")]
    for tl in result.timelines:       # each node's phases as plain lines, the last one when it served
        assert f"   {tl.node}: serving (cache hit)" in text
    docs = [json.loads(x) for x in log_file.read_text().splitlines()]
    events = {(d.get("node"), d["event"]) for d in docs}
    assert ("demo-node-0", "agent.done") in events and ("demo-node-1", "weights.done") in events
    assert any(d["logger"].startswith("nodewarm.controller") for d in docs if "logger" in d)
    assert any(e == "demo.model.seeded" for _, e in events)
    assert re.search(r"node\s+boot to agent start\s+pull weights", text)

    # One scheduler for both worlds, run with the demo's back-off (its config file, not the v1.20 defaults) ...
    assert "kube-scheduler (podMaxBackoffSeconds 1, for both worlds)" in text
    config = json.loads((tmp_path / "work" / "kube" / "kube-scheduler-config.yaml").read_text())
    assert (config["podInitialBackoffSeconds"], config["podMaxBackoffSeconds"]) == (1, 1)
    # With --config, v1.20 ignores --port 0: its insecure listener must be put on loopback (default *:10251).
    assert config["healthzBindAddress"].startswith("127.0.0.1:") and config["metricsBindAddress"].startswith("127.0.0.1:")
    # ... and the model in S3 as boto3's upload_file leaves it: the shards verified from their CRC32 parts.
    verified = {d["file"]: d["verified_by"] for d in docs if d["event"] == "weights.file_ready"}
    assert {v for f, v in verified.items() if f.endswith(".safetensors")} == {"checksum-crc32-composite"}


@pytest.mark.kube
@pytest.mark.vllm
@pytest.mark.slow
def test_demo_with_real_vllm_serves_tokens_from_the_warm_node_and_the_baseline_streams_from_s3(tmp_path):
    """One node (CI time): node A's vLLM compiles and its publisher publishes the seed bundle; the scale-up node's
    agent pulls and restores it; the bound pod's rendered vLLM container serves from the node's copy and loads the
    compiled graphs; the baseline's pod streams the model from S3 and compiles cold. vLLM's log and the publisher
    sidecar's verdict say so, not the timings."""
    out = io.StringIO()
    result = execute(DemoOptions(nodes=1, engine="vllm", workdir=tmp_path / "work", out_dir=tmp_path / "out",
                                 real_nodes=True), out)
    text = out.getvalue()
    (tl,) = result.timelines
    # Real nodes (the default where the machine can; required here): the kubelets ran the pods from the serving
    # image, which the warm node's kubelet had pre-pulled and the baseline's pulled when its pod landed.
    assert result.summary["real_nodes"]
    # The agent was the rendered DaemonSet's pod on the node (Auto Mode), not a process of this machine.
    assert tl.facts["agent_pod"].startswith(f"{AGENT}-"), tl.facts
    warm_pulls, base_pulls = tl.facts["image_pulled"], result.summary["baseline"]["runs"][0]["image_pulled"]
    assert warm_pulls and all("already present on machine" in m for m in warm_pulls.values()), warm_pulls
    assert any("Successfully pulled" in m for m in base_pulls.values()), base_pulls
    t, f = tl.times, tl.facts
    assert t["taint_lifted"] <= t["pod_bound"] <= t["engine_ready"] <= t["first_completion"], t
    assert tl.order_violations() == [] and result.summary["totals"]["all_bound"]
    # The seed: node A served from its agent's copy, compiled, and its publisher published the bundle.
    seed = result.summary["seed"]
    assert seed["evidence"]["startPath"] == "local" and seed["evidence"]["fxMisses"] > 0
    assert seed["published"]["event"] == "compilecache.publish.done" and seed["published"]["status"] == "published"
    # The warm node: vLLM loaded the agent's copy (NVMe path of the start script) and answered a completion ...
    assert f["start_path"] == "local" and f["completion"]
    # ... its compile came from the restored cache, by vLLM's log and by the publisher's verdict on the Node.
    assert f["compile_cache"] == "restored"
    assert (f["vllm_compile"], f["fx_cache_misses"]) == ("loaded", 0) and f["fx_cache_hits"] > 0
    assert (f["publisher_outcome"], f["compile_cache_hit"]) == ("hit", True)
    # The baseline: the same rendered container on a node no agent warmed streamed from S3 and compiled cold.
    base = result.summary["baseline"]
    (run,) = base["runs"]
    assert (run["start_path"], run["streamed_from_s3"], run["vllm_compile"]) == ("s3", True, "compiled")
    assert base["registered_to_serving_s"] > base["engine_boot_s"] > 0
    assert f"registration to first completion answered: {base['ratio']:.2f}" in text
    # vLLM's own init-engine figures of both sides are printed beside the ratio.
    assert f"ratio {base['init_engine_ratio']:.2f}" in text
    assert "Ordering: OK" in text and "\x1b" not in text
    doc = json.loads((tmp_path / "out" / "timeline.json").read_text())
    assert {"engine_ready", "first_completion"} <= set(doc["nodes"]["demo-node-0"]["seconds"])
    assert doc["baseline"]["init_engine_ratio"] == base["init_engine_ratio"]
    assert (tmp_path / "out" / "timeline.png").exists()
