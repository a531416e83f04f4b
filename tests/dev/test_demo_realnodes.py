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


def test_with_snapshots_the_warm_nodes_are_al2023_with_the_snapshot_runtime_and_the_baseline_has_none():
    """--snapshots: the only node kind whose user data installs the runtime handler; the engine check boots the
    engine that serves; the baseline's Deployment is the same container on the stock runtime."""
    from nodewarm import instancetypes
    from nodewarm.api import snapshot as contract
    from nodewarm.nodeclasses.render import render
    from nodewarm_dev.demo.run import baseline_objects, demo_profile, serving_selector

    p = demo_profile(0.005, "A" * 43 + "=", 1, "vllm", 8000, ("127.0.0.1:5000/nodewarm:1", "127.0.0.1:5000/vllm:2"),
                     snapshots=True)
    assert p.serving.snapshot and p.readiness.engine_check.enabled and not p.uses_daemonset
    docs = render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
    kinds = [d["kind"] for d in docs]
    assert "EC2NodeClass" in kinds and "RuntimeClass" in kinds and "PodTemplate" in kinds
    assert not [d for d in docs if d["kind"] == "DaemonSet" and "prepull" not in d["metadata"]["name"]]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["runtimeClassName"] == contract.RUNTIME_CLASS
    (pool,) = [d for d in docs if d["kind"] == "NodePool"]
    _, base = baseline_objects(p, pool, "vllm")
    assert "runtimeClassName" not in base["spec"]["template"]["spec"]
    # The demo follows the serving pods by their Deployment's selector: never the engine check's pod, which binds
    # to the node while the taint is on.
    (tmpl,) = [d for d in docs if d["kind"] == "PodTemplate"]
    selector = dict(x.split("=") for x in serving_selector(deployment).split(","))
    check_labels = tmpl["template"]["metadata"].get("labels") or {}
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert not selector.items() <= check_labels.items(), (selector, check_labels)


@pytest.mark.parametrize("argv", [["--snapshots", "--engine", "probe"], ["--snapshots", "--nodes-as", "played"],
                                  ["--snapshots", "--models", "2"]])
def test_snapshots_where_they_cannot_run_is_refused_naming_what_to_use(argv):
    import argparse

    from nodewarm_dev.demo import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    with pytest.raises(SystemExit, match="--snapshots: .* --engine vllm, --nodes-as auto or real, and --models 1"):
        cli.run(parser.parse_args(["demo", *argv]))


def test_only_a_container_the_handler_restored_is_timed_as_a_restore():
    from nodewarm.api import snapshot as contract
    from nodewarm_dev.demo.run import restore_vs_boot

    check = {"boot_s": 36.0, "first_token_s": 0.25}
    restored = f"{contract.RESTORED_PREFIX}vllm-57abaebd37a3 in 2.0s (key 0.0s, verify 0.5s, criu 1.5s)"
    assert restore_vs_boot(check, restored, 4.5) == {"restored_s": 4.5, "booted_s": 36.25, "ratio": 0.124}
    # A snapshot taken, then a container that booted instead (its line says why), or no line at all: no restore.
    assert restore_vs_boot(check, "booting instead: another key (differs in env.MODEL_GENERATION)", 40.0) is None
    assert restore_vs_boot(check, None, 40.0) is None
