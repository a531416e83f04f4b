"""The gate on a real node: the vLLM Deployment as `nodewarm render` writes it, its pod started by the node's kubelet
and containerd from the serving image (this machine's CPU vLLM with nodewarm, tests/packaging/test_serving_image.py)
only once the controller pod lifted the startup taint, and serving.

Proved from the node's own evidence, not from nodewarm's:
* containerd (``ctr`` on the node's socket) lists no container of the vLLM pod while the taint is on, and the
  kubelet's pod status gives the vLLM containers ``startedAt`` times at or after the last moment the taint was seen;
* the image pre-pull went through the CRI against the registry on 127.0.0.1: the serving image is in the node's
  containerd store when the Node turns Warm, and the kubelet's Pulled Event for the vLLM container says the image
  was already present on the machine;
* the engine answers a completion on the pod's own IP, with the model the agent pod put on the node's NVMe.
The cluster around it (API server, controllers, the nodewarm controller's pod, the registry): conftest.py.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest

from nodewarm import profile
from nodewarm.controller.kube import EVENTS, NODES, PODS, Kube
from nodewarm_dev.testenv import vllmclient
from support.bootstrap_fixtures import put_model
from support.builders import NO_CACHE, v
from support.controller_fixtures import wait_for
from support.realcluster import joined, warm_condition

pytestmark = [pytest.mark.kube, pytest.mark.s3, pytest.mark.slow, pytest.mark.realnode, pytest.mark.vllm]

NODE, NAME, POOL = "node-rn-serving", "served", "served-pool"
BOOT_TIMEOUT_S = 600



def _tainted(k: Kube, key: str) -> bool:
    return key in [t["key"] for t in k.get(NODES, NODE)["spec"].get("taints") or ()]


class PodContainers:
    """The containers containerd holds on the node for pods named ``prefix...``, in any state, read from the labels
    the kubelet's CRI gives each container, the pod's sandbox included (each container's labels read once)."""

    def __init__(self, node, prefix: str):
        self.node, self.prefix, self.pods = node, prefix, {}

    def __call__(self) -> list[str]:
        for cid in self.node.ctr("containers", "list", "--quiet").split():
            # A container removed between the list and its info (a restarted pre-pull pod's) is no answer.
            if cid not in self.pods and (info := self.node.ctr("containers", "info", cid, check=False)):
                self.pods[cid] = (json.loads(info).get("Labels") or {}).get("io.kubernetes.pod.name", "")
        return [cid for cid, pod in self.pods.items() if pod.startswith(self.prefix)]


def _time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def test_the_vllm_pod_starts_after_the_lift_from_a_prepulled_image_and_serves(
        cluster, image, serving_image, controller_pod, s3, tiny_model, tmp_path):
    k = Kube(cluster.api_client())
    doc = v("automode", metadata__name=NAME, spec__model={"uri": put_model(s3, tiny_model), "sizeGB": 0.006},
            spec__compileCache__uri=NO_CACHE, spec__bootstrap__allowNonNvme=True, spec__bootstrap__image=image[1],
            spec__nodes__nodePool=POOL, spec__serving__image=serving_image, spec__serving__tensorParallelSize=1,
            spec__serving__chunkSizeGB=0.002, spec__serving__maxModelLen=512, spec__serving__dtype="bfloat16",
            spec__serving__replicas=1, spec__serving__resources={"cpu": "1", "memory": "6Gi"})
    p = profile.from_dict(doc)
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    vllm_pod = f"{NAME}-vllm-"
    with joined(cluster, image[0], s3, tmp_path, doc, NODE, nvme, with_deployment=True) as node:
        # While the taint is on: no container of the vLLM pod on the node, whatever the scheduler does meanwhile.
        seen_tainted = time.time()
        early: set[str] = set()
        vllm_containers = PodContainers(node, vllm_pod)
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        image_at_warm = None
        while _tainted(k, p.readiness.taint_key):
            seen_tainted = time.time()
            early |= set(vllm_containers())
            if image_at_warm is None and (warm_condition(k.get(NODES, NODE)) or {}).get("status") == "True":
                image_at_warm = node.ctr("images", "list", "--quiet")
            assert time.monotonic() < deadline, "the startup taint was never lifted"
            time.sleep(0.5)
        assert not early, f"containers of the vLLM pod existed before the lift: {sorted(early)}"
        assert (warm_condition(k.get(NODES, NODE)) or {}).get("status") == "True"
        # The lift can follow Warm within milliseconds: where the loop missed the moment between, the image must
        # have been there anyway (the agent reports Warm only after the pre-pull, below).
        images_then = image_at_warm if image_at_warm is not None else node.ctr("images", "list", "--quiet")
        assert serving_image in images_then.split(), images_then

        pod = wait_for(lambda: next((x for x in k.list(PODS, p.serving.namespace)["items"]
                                     if x["metadata"]["name"].startswith(vllm_pod)
                                     and x["spec"].get("nodeName") == NODE
                                     and all(c.get("ready") for c in x["status"].get("containerStatuses") or [{}])),
                                    None),
                       timeout_s=BOOT_TIMEOUT_S, interval_s=2, what="the vLLM pod Ready on the node")
        name = pod["metadata"]["name"]
        statuses = pod["status"].get("initContainerStatuses", []) + pod["status"]["containerStatuses"]
        for st in statuses:
            started = (st["state"].get("running") or st["state"].get("terminated") or {}).get("startedAt")
            assert started and _time(started) >= int(seen_tainted), (st["name"], started, seen_tainted)
            assert st["image"].endswith(serving_image.split("/", 1)[1]), st
        cids = {st["containerID"].removeprefix("containerd://") for st in statuses}
        assert cids <= set(node.ctr("containers", "list", "--quiet").split())

        # The kubelet's word on each of the pod's containers (the init container runs the serving image too).
        pulled = {e["involvedObject"].get("fieldPath", ""): e["message"]
                  for e in k.list(EVENTS, p.serving.namespace, fieldSelector=f"involvedObject.name={name}")["items"]
                  if e["reason"] == "Pulled"}
        assert "spec.containers{vllm}" in pulled, pulled
        assert all("already present on machine" in m for m in pulled.values()), pulled

        base = f"http://{pod['status']['podIP']}:{p.serving.port}"
        answer = vllmclient.complete(base, NAME)
        assert answer["choices"][0]["text"] and answer["usage"]["completion_tokens"] > 0, answer
        log = next(node.log_dir.glob(f"{p.serving.namespace}_{name}_*/vllm/*.log")).read_text(errors="replace")
        assert "Loading safetensors using Runai Model Streamer" in log, log[-3000:]
