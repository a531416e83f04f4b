"""The agent's snapshot step on its real path, without vLLM: `nodewarm bootstrap run` as the node itself (kubelet
token, NodeRestriction on) against the real API server and S3, a profile with spec.serving.snapshot, and a check pod
whose serving container is a real runc container (the counter of support/runcbox.py, created through the handler
as the snapshot RuntimeClass creates it). The test plays the controller's create of the check pod and the kubelet's
status write; the agent reads the pod as the node, checkpoints the container with runc and CRIU, and says so on its
Node. When the snapshot cannot be taken the node is Warm all the same, and says why."""

from __future__ import annotations

import json

import pytest

from nodewarm import profile
from nodewarm.api import enginecheck
from nodewarm.api import snapshot as contract
from nodewarm.api.enginecheck import Reason, Result
from nodewarm.api.names import SNAPSHOT_ANNOTATION, WARM_CONDITION
from nodewarm.bootstrap.snapshot.store import Store
from nodewarm.controller.kube import NODES, Resource
from support.bootstrap_fixtures import model_files, put_model
from support.builders import NO_CACHE, v
from support import checkpod
from support.runcbox import create_and_start

pytestmark = [pytest.mark.kube, pytest.mark.s3]

NODE = "node-6"          # one of the API server's kubelet identities (tests/conftest.py KUBE_NODE_NAMES)
TAINT = {"key": "nodewarm.io/warming", "effect": "NoSchedule"}
IMAGE = "registry.example/vllm-nodewarm:0.32.0"


@pytest.fixture
def node(k, fresh_node):
    fresh_node(NODE, [TAINT])
    return k


def _doc(name: str, uri: str) -> dict:
    return v(metadata__name=name, spec__model={"uri": uri}, spec__compileCache__uri=NO_CACHE,
             spec__bootstrap__allowNonNvme=True, spec__serving__snapshot={"enabled": True},
             spec__readiness__engineCheck={"enabled": True, "timeout": "2m", "image": IMAGE})


def _answer(k, kube, p, container_id: str, seen: list):
    """The controller's create of the check pod once the Node asks, then the kubelet's status: the runner ended
    with a passed Result, the serving container runs as ``container_id``."""
    served = Result(True, Reason.ENGINE_SERVED, "vLLM answered", compile_cache="cold")
    statuses = [
        {"name": contract.CONTAINER, "image": IMAGE, "imageID": "", "ready": True, "restartCount": 0,
         "containerID": f"containerd://{container_id}", "state": {"running": {"startedAt": "2026-12-07T00:00:00Z"}}},
        {"name": enginecheck.CONTAINER, "image": IMAGE, "imageID": "", "ready": False, "restartCount": 0,
         "state": {"terminated": {"exitCode": 0, "message": served.to_json()}}}]
    containers = [{"name": contract.CONTAINER, "image": IMAGE}, {"name": enginecheck.CONTAINER, "image": IMAGE}]
    checkpod.answer(k, kube, p, NODE, containers, statuses, "Running", seen)


def _run(kube, k, tmp_path, doc, container_id: str, runc_root: str, criu: str):
    p = profile.from_dict(doc)
    try:
        k.create(Resource("", "v1", "namespaces", "Namespace"), {"metadata": {"name": p.serving.namespace}})
    except Exception:  # noqa: BLE001 - already there
        pass
    seen: list = []
    rc = checkpod.run_agent(kube, tmp_path, p.name, NODE, lambda: _answer(k, kube, p, container_id, seen),
                            ("--snapshot-runc-root", runc_root, "--snapshot-criu", criu))
    mount = tmp_path / "nvme"
    assert seen and seen[0] != "never asked", seen
    return rc, mount


def _node_said(k) -> tuple[dict, dict]:
    n = k.get(NODES, NODE)
    cond = next(c for c in n["status"]["conditions"] if c["type"] == WARM_CONDITION)
    return cond, json.loads(n["metadata"]["annotations"][SNAPSHOT_ANNOTATION])


def test_the_agent_as_the_node_checkpoints_the_check_pods_serving_container(
        kube, aws_env, node, warmprofile, kubelet_pulls, tmp_path, runc, criu):
    doc = _doc("snap-take", put_model(aws_env, model_files(shards=1, mib_per_shard=1, seed=31)))
    warmprofile(doc)
    kubelet_pulls(doc, NODE)
    store = Store(tmp_path / "nvme" / contract.STORE_DIR).open()
    c = runc.bundle(contract.CONTAINER)
    create_and_start(runc, store, criu, c)
    token, _, _ = c.wait_count(3)

    rc, _ = _run(kube, node, tmp_path, doc, c.id, str(runc.root), criu)

    cond, taken = _node_said(node)
    assert rc == 0 and (cond["status"], cond["reason"]) == ("True", Reason.ENGINE_SERVED), cond
    assert taken["taken"] and taken["reason"] == contract.TAKEN and taken["bytes"] > 0, taken
    assert store.slots() == [taken["slot"]] and runc.status(c.id) != "running"
    assert store.context()["generation"], "the generation the agent warmed is in every key"
    tl = json.loads(node.get(NODES, NODE)["metadata"]["annotations"]["nodewarm.io/timeline"])
    assert tl["engine_check_passed"] <= tl["snapshot_started"] <= tl["snapshot_taken"] <= tl["warm_reported"]
    outcome = enginecheck.read_annotation(node.get(NODES, NODE)["metadata"]["annotations"][
        enginecheck.REQUEST_ANNOTATION])
    assert taken["slot"] in outcome.message, "the controller's Event for the check says the snapshot too"
    b = runc.bundle(contract.CONTAINER)
    assert "restored from the snapshot" in create_and_start(runc, store, criu, b)
    assert b.wait_count(1)[0] == token


def test_a_snapshot_that_cannot_be_taken_leaves_the_node_warm_and_says_why(
        kube, aws_env, node, warmprofile, kubelet_pulls, tmp_path, runc, criu):
    doc = _doc("snap-none", put_model(aws_env, model_files(shards=1, mib_per_shard=1, seed=32)))
    warmprofile(doc)
    kubelet_pulls(doc, NODE)
    rc, mount = _run(kube, node, tmp_path, doc, "nwtest-no-such-container", str(runc.root), criu)
    cond, taken = _node_said(node)
    assert rc == 0 and cond["status"] == "True", cond
    assert not taken["taken"] and taken["reason"] == contract.NOT_TAKEN, taken
    assert "nwtest-no-such-container" in taken["message"] and "no snapshot" in cond["message"]
    assert Store(mount / contract.STORE_DIR).slots() == []
