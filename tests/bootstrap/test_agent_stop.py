"""The agent stopped mid-pull (SIGTERM: the unit stopped, the DaemonSet pod deleted, the node going away): it
leaves promptly, its pull and waits ended, and keeps what the next start resumes from. As the node runs it: a
fresh `nodewarm bootstrap run` process with the kubelet's identity, S3 behind a proxy that trickles the GETs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from support.bootstrap_fixtures import model_files, node_kubeconfig, put_model
from support.builders import NO_CACHE, v
from nodewarm_dev.testenv.faultproxy import Trickle

pytestmark = [pytest.mark.kube, pytest.mark.s3]

NODE = "node-6"
TAINT = {"key": "nodewarm.io/warming", "effect": "NoSchedule"}


def test_sigterm_mid_pull_ends_the_agent_and_keeps_its_parts(kube, s3, fresh_node, proxy, warmprofile, tmp_path):
    fresh_node(NODE, [TAINT])
    uri = put_model(s3, model_files(shards=2, mib_per_shard=2))
    # The profile names a serving image and no pre-pull pod runs: its wait alone would last the 10-minute default.
    warmprofile(v(metadata__name="stop-a", spec__model={"uri": uri}, spec__compileCache__uri=NO_CACHE,
                  spec__bootstrap__allowNonNvme=True))
    flowing = threading.Event()

    def trickle(req):
        if req.is_get and req.path.endswith(".safetensors"):
            flowing.set()
            return Trickle(bytes_per_s=20_000)  # 4 MiB at this rate: minutes, so the pull is under way at the stop
        return None

    proxy.rule = trickle
    mount = tmp_path / "nvme"
    mount.mkdir()
    agent = subprocess.Popen([sys.executable, "-m", "nodewarm.cli", "bootstrap", "run", "--profile", "stop-a",
                              "--mount", str(mount), "--node-name", NODE,
                              "--kubeconfig", str(node_kubeconfig(kube, tmp_path, NODE)), "--skip-load-check",
                              "--once", "--gpu-wait-seconds", "0.1", "--state-dir", str(tmp_path / "state")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert flowing.wait(120), "the agent never sent a GET"
        time.sleep(1)  # parts under way, the image wait started
        agent.send_signal(signal.SIGTERM)
        # A bound on a hang, not a timing: unstopped, the pull would trickle for minutes and the image wait
        # last 10; stopped, the pull ends within a poll and the image wait at the end of its current watch.
        rc = agent.wait(60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    stderr = agent.stderr.read()
    assert rc == 0, stderr[-3000:]
    assert "PullStopped" in stderr and "PrepullStopped" in stderr
    parts = list(mount.rglob("*.safetensors.part"))
    assert parts and all(p.parent.name == "partial" for p in parts)  # kept for the next start
    assert not list(mount.rglob("*.safetensors"))  # nothing half-written has a final name
