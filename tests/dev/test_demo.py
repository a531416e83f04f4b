"""A shortened `nodewarm demo` end to end: real API server, scheduler, controller-manager (Deployments
only), S3, bootstrap processes and controller; once with the torch.compile probe (two nodes), once with real
vLLM on real nodes with engine snapshots (one node, and the baseline streaming from S3). Asserts the ordering and
the evidence, never the timings, and that what a person reads (stdout, not a terminal here) is plain text while
the JSON logs go to the file it names."""

from __future__ import annotations

import io
import json
import re

import pytest

from nodewarm.api import snapshot as snapcontract
from nodewarm.api.names import CONTROLLER_NAME, CONTROLLER_NAMESPACE
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
    # The controller ran as its pod would: its ServiceAccount under the RBAC it ships, not as admin.
    assert f"4. controller running as system:serviceaccount:{CONTROLLER_NAMESPACE}:{CONTROLLER_NAME};" in text
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
def test_demo_with_snapshots_serves_the_checks_engine_restored_and_the_baseline_boots_cold(tmp_path):
    """`nodewarm demo --snapshots` on real nodes, one warm node (CI time): node A's vLLM compiles and its publisher
    publishes the seed bundle; the warm node is an AL2023 node whose host agent pulls, restores that bundle, boots the
    engine check's vLLM on it and checkpoints it; the bound pod's rendered vLLM container is restored from that
    snapshot by the runtime handler instead of booting, and answers what the baseline's cold engine (streamed from
    S3, compiled cold) answers. The Auto Mode flow's agent DaemonSet on a real kubelet is
    tests/realnode/test_agent_pod.py's; the flow itself, the played demo's above. By the engine's, the handler's and the kubelet's own words, not timings."""
    out = io.StringIO()
    result = execute(DemoOptions(nodes=1, engine="vllm", workdir=tmp_path / "work", out_dir=tmp_path / "out",
                                 real_nodes=True, snapshots=True), out)
    text = out.getvalue()
    (tl,) = result.timelines
    t, f = tl.times, tl.facts
    assert result.summary["real_nodes"]
    # The agent was the host's (AL2023 user data), not a DaemonSet's pod.
    assert "agent_pod" not in f and "the AL2023 agent (the host's" in text, f
    # The controller that created the check pod and lifted the taint ran as its ServiceAccount, not as admin.
    assert f"4. controller running as system:serviceaccount:{CONTROLLER_NAMESPACE}:{CONTROLLER_NAME};" in text
    # The kubelet pre-pulled the serving image for the warm node; the baseline's pulled it when its pod landed.
    warm_pulls, base_pulls = f["image_pulled"], result.summary["baseline"]["runs"][0]["image_pulled"]
    assert warm_pulls and all("already present on machine" in m for m in warm_pulls.values()), warm_pulls
    assert any("Successfully pulled" in m for m in base_pulls.values()), base_pulls
    assert t["weights_done"] <= t["warm_reported"] <= t["taint_lifted"] <= t["pod_bound"] <= t["first_completion"], t
    assert tl.order_violations() == [] and result.summary["totals"]["all_bound"]
    # The seed: node A booted (no snapshot yet), compiled, and its publisher published the bundle.
    seed = result.summary["seed"]
    assert seed["evidence"]["startPath"] == "local" and seed["evidence"]["fxMisses"] > 0
    assert seed["published"]["status"] == "published"
    # The warm node: its agent restored node A's compile cache; the engine check booted vLLM on it (a hit) and
    # answered, and the agent checkpointed that engine before reporting Warm.
    check, snap = f["engine_check"], f["snapshot"]
    assert f["compile_cache"] == "restored" and check["state"] == "passed" and check["compile_cache"] == "hit", check
    assert snap["taken"] and snap["reason"] == snapcontract.TAKEN and snap["bytes"] > 0, snap
    # The serving pod's container came from that snapshot, by the handler's line in its own log, not a boot ...
    assert f["snapshot_restore"].startswith(f"restored from the snapshot {snap['slot']} in "), f["snapshot_restore"]
    assert f["start_path"] is None and f["init_engine_s"] is None, "a restored engine's log has no boot lines"
    # ... and answers what a cold engine answers (greedy, same prompt): the baseline's, streamed from S3 and compiled.
    (run,) = result.summary["baseline"]["runs"]
    assert (run["start_path"], run["streamed_from_s3"], run["vllm_compile"]) == ("s3", True, "compiled")
    assert f["completion"] and f["completion"] == run["completion"], (f["completion"], run["completion"])
    # Its publisher sidecar found the compile cache it expected on the node.
    assert (f["publisher_outcome"], f["compile_cache_hit"]) == ("hit", True)
    r = f["restore_vs_boot"]
    assert r["restored_s"] > 0 and r["booted_s"] >= check["boot_s"] > 0, r
    base = result.summary["baseline"]
    assert f"registration to first completion answered: {base['ratio']:.2f}" in text
    assert (f"{tl.node}, engine snapshot: the check's vLLM booted in {check['boot_s']:.1f}s; "
            f"snapshot {snap['slot']} taken") in text
    assert f"against the check's boot to its first token {r['booted_s']:.1f}s" in text
    assert "vLLM restored from its engine check's snapshot" in text and "vLLM from None" not in text
    assert "Ordering: OK" in text and "\x1b" not in text
    doc = json.loads((tmp_path / "out" / "timeline.json").read_text())
    assert doc["nodes"][tl.node]["facts"]["restore_vs_boot"] == r
    assert (tmp_path / "out" / "timeline.png").exists()
