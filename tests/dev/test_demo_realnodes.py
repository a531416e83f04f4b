"""The demo's choice of real or played nodes, and reading a real node's container logs (no servers)."""

from __future__ import annotations

import pytest

from nodewarm_dev.demo import realnodes
from nodewarm_dev.demo.run import DemoOptions, use_real_nodes

WHY = "not root (uid 1000): containerd and the kubelet need root"


def test_where_real_nodes_cannot_run_the_demo_plays_them_and_says_why(monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(realnodes, "unavailable", lambda: WHY)
    assert use_real_nodes(DemoOptions(engine="vllm"), said.append) is False
    assert len(said) == 1 and WHY in said[0] and "played" in said[0]
    with pytest.raises(RuntimeError, match="uid 1000"):
        use_real_nodes(DemoOptions(engine="vllm", real_nodes=True), said.append)


def test_real_nodes_by_default_where_the_machine_can(monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(realnodes, "unavailable", lambda: None)
    assert use_real_nodes(DemoOptions(engine="vllm"), said.append) is True
    assert use_real_nodes(DemoOptions(engine="vllm", real_nodes=False), said.append) is False
    assert use_real_nodes(DemoOptions(engine="probe"), said.append) is False
    assert said == []


def test_a_cri_log_reads_back_as_the_process_wrote_it(tmp_path):
    log = tmp_path / "0.log"
    log.write_text('2026-12-06T10:09:24.6Z stdout F {"event": "serve_start.local"}\n'
                   "2026-12-06T10:09:24.7Z stderr P \rLoading safetensors \n"
                   "2026-12-06T10:09:24.8Z stderr F using Runai Model Streamer: 100%\n"
                   "2026-12-06T10:09:24.9Z stdout F \n")
    assert realnodes.cri_log_text(log) == ('{"event": "serve_start.local"}\n'
                                           "\rLoading safetensors using Runai Model Streamer: 100%\n")


def test_on_real_nodes_the_demo_profile_is_auto_modes_so_its_agent_is_the_rendered_daemonset_pod():
    from nodewarm import instancetypes
    from nodewarm.api.agentpod import NAME as AGENT
    from nodewarm.nodeclasses.render import render
    from nodewarm_dev.demo.run import demo_profile

    p = demo_profile(0.005, "A" * 43 + "=", 1, "vllm", 8000, ("127.0.0.1:5000/nodewarm:1", "127.0.0.1:5000/vllm:2"))
    docs = render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
    (agent,) = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"].startswith(AGENT)]
    assert agent["spec"]["template"]["spec"]["containers"][0]["image"] == "127.0.0.1:5000/nodewarm:1"
    assert {d["kind"] for d in docs} >= {"NodeClass", "NodePool"} and "EC2NodeClass" not in {d["kind"] for d in docs}
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    assert {c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]} == {"127.0.0.1:5000/vllm:2"}


def test_the_kubelets_pulls_are_said_once():
    present = 'Container image "r/v:1" already present on machine'
    assert realnodes.pulls_in_words([{"spec.containers{vllm}": present, "spec.initContainers{w}": present}]) == (
        "'already present on machine' for all 2 containers")
    said = realnodes.pulls_in_words([{"spec.initContainers{w}": 'Successfully pulled image "r/v:1" in 1m2.9s',
                                      "spec.containers{vllm}": present}])
    assert said == "Successfully pulled image \"r/v:1\" in 1m2.9s (then 'already present' for the other 1)"
    assert realnodes.pulls_in_words([]) == "none"
