"""spec.serving.snapshot on a real node (kubelet v1.20.2, containerd 1.6, runc, the CRIU setup builds), through the
product's own path: the profile rendered and applied as a user applies it, the AL2023 agent as the node's root
process with the node's identity, the engine check's pod created by the nodewarm controller's pod from the rendered
PodTemplate, and the serving Deployment's pod restored by the runtime handler.

Judged by the engine's own evidence: the check's engine booted (the handler's record says there was no snapshot); the
agent checkpointed it and said so on the Node; the serving pod's vLLM comes from that snapshot (its log says so,
and its own request counter already holds the check's request: a new process would start at 0), answers four
concurrent requests the same greedy way, and its /v1/models and /metrics are live.

What the node's user data installs is played by the test, with the product's own parts: the handler (the product's
module, run as the user data's script runs it), the seccomp profile the Deployment names (api.snapshot.SECCOMP), and
CRIU as setup builds it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nodewarm import profile
from nodewarm.api import snapshot as contract
from nodewarm.api.names import SNAPSHOT_ANNOTATION
from nodewarm.controller.kube import NODES, PODS, Kube
from nodewarm.nodeclasses.launch import bootstrap_launch
from nodewarm_dev.testenv import vllmclient
from nodewarm_dev.testenv import snapshotnode
from support.bootstrap_fixtures import node_kubeconfig, put_model
from support.builders import NO_CACHE, v
from support.controller_fixtures import wait_for
from support.realcluster import joined, warm_condition

pytestmark = [pytest.mark.kube, pytest.mark.s3, pytest.mark.slow, pytest.mark.realnode, pytest.mark.vllm]

NODE, NAME, POOL = "node-rn-engine-snapshot", "snapped", "snapped-pool"
BOOT_TIMEOUT_S = 600
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def seccomp_profile():
    with snapshotnode.seccomp_profile() as path:
        yield path


def _agent(node, cluster, p, s3, tmp_path) -> subprocess.Popen:
    """The AL2023 agent as the node's unit runs it (snapshotnode.host_agent_argv), with the node's credentials."""
    launch = bootstrap_launch(p).bootstrap_argv()
    argv = snapshotnode.host_agent_argv(node, launch, NODE, node_kubeconfig(cluster, tmp_path, NODE), tmp_path / "state")
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **s3.env()}
    return subprocess.Popen(argv, env=env, stdout=open(tmp_path / "agent.out", "w"), stderr=subprocess.STDOUT)


def _serving_pod(k: Kube, p) -> dict:
    def running():
        for x in k.list(PODS, p.serving.namespace)["items"]:
            if x["metadata"]["name"].startswith(f"{NAME}-vllm-") and x["spec"].get("nodeName") == NODE:
                sts = x["status"].get("containerStatuses") or ()
                if x["status"].get("podIP") and sts and all("running" in (s.get("state") or {}) for s in sts):
                    return x
        return None
    return wait_for(running, timeout_s=BOOT_TIMEOUT_S, interval_s=0.5, what="the serving pod running on the node")


def test_the_engine_warmed_by_the_check_is_the_one_that_serves(
        cluster, image, serving_image, controller_pod, s3, tiny_model, seccomp_profile, tmp_path):
    k = Kube(cluster.api_client())
    doc = v("karpenter", metadata__name=NAME, spec__model={"uri": put_model(s3, tiny_model), "sizeGB": 0.006},
            spec__compileCache__uri=NO_CACHE, spec__bootstrap__allowNonNvme=True, spec__bootstrap__image=image[1],
            spec__nodes__nodePool=POOL, spec__serving__image=serving_image, spec__serving__tensorParallelSize=1,
            spec__serving__chunkSizeGB=0.002, spec__serving__maxModelLen=512, spec__serving__dtype="bfloat16",
            spec__serving__replicas=1, spec__serving__resources={"cpu": "1", "memory": "6Gi"},
            spec__serving__snapshot={"enabled": True},
            spec__readiness__engineCheck={"enabled": True, "timeout": "10m", "image": serving_image})
    p = profile.from_dict(doc)
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    store = nvme / contract.STORE_DIR     # the host side of api.snapshot.store_dir(cache mount)
    handler = snapshotnode.handler_script(tmp_path / "nodewarm-runc", Path(contract.store_dir(p.nodes.cache_mount)))
    with joined(cluster, image[0], s3, tmp_path, doc, NODE, nvme, with_deployment=True,
                runtime_handlers={contract.RUNTIME_HANDLER: handler}) as node:
        agent = _agent(node, cluster, p, s3, tmp_path)
        try:
            rc = agent.wait(timeout=BOOT_TIMEOUT_S + 300)
        finally:
            if agent.poll() is None:
                agent.kill()
            print((tmp_path / "agent.out").read_text()[-6000:], file=sys.stderr)
        assert rc == 0
        n = k.get(NODES, NODE)
        assert (warm_condition(n) or {}).get("status") == "True", warm_condition(n)
        taken = json.loads(n["metadata"]["annotations"][SNAPSHOT_ANNOTATION])
        assert taken["taken"] and taken["reason"] == contract.TAKEN, taken
        assert (store / taken["slot"] / "key.json").is_file()
        assert oct(store.stat().st_mode & 0o777) == "0o700", "the store is root's alone"
        # The handler's own record of its decision for the check pod. Not the pod's log: the controller deletes the
        # check pod once answered, and the kubelet removes its log folder with it. In --once mode no Reporter turns
        # the record into an Event, so it stays in the store.
        decisions = [json.loads(f.read_text()) for f in (store / "outcomes").glob("*.json")]
        check = [d for d in decisions if d.get("container") == contract.CONTAINER
                 and d.get("pod", "").startswith(f"{p.serving.namespace}/{NAME}-engine-check-")]
        assert [d["reason"] for d in check] == ["NoSnapshot"], decisions
        assert check[0]["message"].startswith("booting instead: no snapshot of this container on this node"), check

        created = time.monotonic()
        pod = _serving_pod(k, p)
        base = f"http://{pod['status']['podIP']}:{p.serving.port}"
        log = lambda: "".join(f.read_text(errors="replace") for f in node.log_dir.glob(  # noqa: E731
            f"{p.serving.namespace}_{pod['metadata']['name']}_*/{contract.CONTAINER}/*.log"))
        vllmclient.wait_ready(base, timeout=120, log_tail=log)
        first = vllmclient.complete(base, NAME, max_tokens=12)["choices"][0]["text"]
        print(f"restored engine: first completion {time.monotonic() - created:.1f}s after the taint's lift")
        assert "restored from the snapshot" in log(), log()[-3000:]

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: vllmclient.complete(base, NAME, max_tokens=12)["choices"][0]["text"],
                                    range(4)))
        assert first and answers == [first] * 4, "four concurrent requests, each the same greedy answer"
        models_doc = json.loads(vllmclient._get(f"{base}/v1/models")[1])
        assert [m["id"] for m in models_doc["data"]] == [NAME]
        done = sum(val for key, val in vllmclient.metrics(base).items()
                   if key.startswith("vllm:request_success_total"))
        # A booted engine would count our five; this one also holds the check runner's before its checkpoint.
        assert done >= 6, f"the engine's own request counter says {done}: not the check's engine"

