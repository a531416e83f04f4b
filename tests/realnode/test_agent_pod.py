"""The agent as it ships on Auto Mode: the rendered DaemonSet's pod, from the `nodewarm` image, pulled from a registry
and run by a real kubelet v1.20.2 with its own containerd (nodewarm_dev.testenv.realnode), with the ServiceAccount
token the kubelet projects into it and the RBAC `nodewarm render` wrote; its hostPath is the node's NVMe mount. The
cluster around it: conftest.py. Its S3 credentials come in as environment variables, which on EKS the Pod Identity
agent or IRSA's webhook provides.
"""

from __future__ import annotations

import copy
import subprocess

import pytest

from nodewarm import profile
from nodewarm.api import generation, models
from nodewarm.api.names import WARM_GENERATION_ANNOTATION
from nodewarm.controller.kube import NODES, PODS, WARMPROFILES, Kube
from nodewarm.sizing import NODE_FREE_MARGIN_MIN_BYTES as SIZING_MIN_FREE
from support.bootstrap_fixtures import model_files, put_model, visible_files
from support.builders import NO_CACHE, v
from support.controller_fixtures import wait_for
from support.modelviews import folder, model_labels, view
from nodewarm_dev.testenv import agentpod
from support.realcluster import joined, warm_condition

pytestmark = [pytest.mark.kube, pytest.mark.s3, pytest.mark.slow, pytest.mark.realnode]

NODE, NAME, POOL = "node-rn-agent", "agent-pod", "agent-pod-pool"
SMALL_NODE = "node-rn-small"
MiB = 1 << 20


def _annotations(k: Kube, node: str = NODE) -> dict:
    return k.get(NODES, node)["metadata"].get("annotations") or {}


def test_the_rendered_agent_pod_warms_its_node_and_removes_a_rolled_out_generation(
        cluster, image, controller_pod, s3, tmp_path):
    _, ref = image
    k = Kube(cluster.api_client())
    files = model_files(shards=2, mib_per_shard=1)
    doc = v("automode", metadata__name=NAME, spec__model={"uri": put_model(s3, files)},
            spec__compileCache__uri=NO_CACHE, spec__bootstrap__allowNonNvme=True, spec__bootstrap__image=ref,
            spec__nodes__nodePool=POOL, spec__serving__image=ref, spec__serving__tensorParallelSize=1)
    p = profile.from_dict(doc)
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    with joined(cluster, image[0], s3, tmp_path, doc, NODE, nvme) as node:
        ns = p.bootstrap.namespace
        pod = wait_for(lambda: agentpod.on_node(k, ns, NODE), timeout_s=60, what="the DaemonSet controller's agent pod")
        warm = wait_for(lambda: (warm_condition(k.get(NODES, NODE)) or {}).get("status") == "True"
                        and warm_condition(k.get(NODES, NODE)),
                        timeout_s=240, what="the Node Warm, written by the agent pod")
        assert warm["reason"], warm
        # Registered and Warm: the controller's pod lifts the startup taint.
        wait_for(lambda: p.readiness.taint_key not in [t["key"] for t in k.get(NODES, NODE)["spec"].get("taints") or ()],
                 timeout_s=60, what="the startup taint lifted by the controller pod")
        model_dir = nvme / "nodewarm" / "models" / NAME / generation.model_key(p)
        assert visible_files(model_dir) == files

        pod = k.get(PODS, pod["metadata"]["name"], ns)
        # The token is the kubelet's projection (the ServiceAccount admission's kube-api-access volume), not a
        # Secret or an admin's.
        projected = [vol for vol in pod["spec"]["volumes"] if vol["name"].startswith("kube-api-access-")]
        assert projected and any("serviceAccountToken" in s for s in projected[0]["projected"]["sources"])
        assert not pod["spec"].get("hostNetwork") and pod["status"]["podIP"].startswith("10.250.")
        [status] = pod["status"]["containerStatuses"]
        assert status["image"].endswith(ref.split("/", 1)[1]) and status["state"].get("running"), status
        cid = status["containerID"].removeprefix("containerd://")
        assert node.running_tasks().get(cid) == "RUNNING"
        # Its result file is written where the pod may write (its root filesystem is read-only).
        log = "".join(f.read_text() for f in node.log_dir.glob(f"{ns}_{pod['metadata']['name']}_*/agent/*.log"))
        assert '"agent.done"' in log and "agent.result_not_written" not in log, log[-3000:]

        # A model roll while the agent pod runs: generation 2 is warmed beside 1, then 1 is removed, since no vLLM
        # pod of generation 1 runs here; the agent's own pod, which mounts the whole NVMe folder, uses neither.
        files2 = model_files(shards=2, mib_per_shard=1, seed=2)
        doc2 = copy.deepcopy(doc)
        doc2["spec"]["model"]["uri"] = put_model(s3, files2)
        doc2["metadata"]["resourceVersion"] = k.get(WARMPROFILES, NAME)["metadata"]["resourceVersion"]
        k.replace(WARMPROFILES, NAME, doc2)
        p2 = profile.from_dict(doc2)
        new_dir = nvme / "nodewarm" / "models" / NAME / generation.model_key(p2)
        # The agent pod writes the generation it holds as an annotation (the label is the controller's to copy).
        wait_for(lambda: _annotations(k).get(WARM_GENERATION_ANNOTATION) == generation.generation(p2), timeout_s=120,
                 what="the agent pod reporting generation 2 on its Node")
        assert visible_files(new_dir) == files2
        wait_for(lambda: not model_dir.exists(), timeout_s=60, what="generation 1's weights removed")
        assert warm_condition(k.get(NODES, NODE))["status"] == "True"
        [status] = k.get(PODS, pod["metadata"]["name"], ns)["status"]["containerStatuses"]
        assert status["containerID"] == f"containerd://{cid}" and status["restartCount"] == 0, status


@pytest.fixture
def small_nvme(tmp_path):
    """A real filesystem with room for 12 MiB of models: a tmpfs of the agent's 2 GiB minimum free margin
    (nodewarm.sizing) plus 12 MiB. tmpfs takes memory only for what is written."""
    mnt = tmp_path / "small-nvme"
    mnt.mkdir()
    size = (SIZING_MIN_FREE + 12 * MiB) // 1024
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}k", "nodewarm-small-nvme", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_lower_priority_model_is_evicted_for_one_that_matters_more_beside_the_agent_pod(
        cluster, image, controller_pod, s3, small_nvme, tmp_path):
    """The many-models eviction with the agent's own pod on the node, mounting the whole NVMe folder: that pod is
    no user of any model. The nodewarm controller (its pod on the system node) turns the agent's report into the
    model labels and takes a label off before the agent deletes the files."""
    _, ref = image
    k = Kube(cluster.api_client())
    name, pool = "agent-models", "agent-models-pool"
    doc = v("automode", metadata__name=name, spec__compileCache__uri=NO_CACHE, spec__bootstrap__allowNonNvme=True,
            spec__bootstrap__image=ref, spec__serving__image=ref, spec__serving__tensorParallelSize=1,
            spec__nodes__nodePool=pool,
            spec__model={"uri": put_model(s3, model_files(shards=1, mib_per_shard=1, seed=50)), "sizeGB": 0.0011},
            spec__models=[{"name": "c", "uri": put_model(s3, model_files(shards=2, mib_per_shard=4, seed=51)),
                           "sizeGB": 0.0085, "priority": 1}])
    with joined(cluster, image[0], s3, tmp_path, doc, SMALL_NODE, small_nvme):
        c = view(doc, "c")
        wait_for(lambda: model_labels(k, SMALL_NODE) == {models.label_key(c): generation.generation(c)}, timeout_s=240,
                 what="model c warm and labelled")
        c_dir = folder(doc, small_nvme, c.name)
        assert c_dir.is_dir()

        # d matters more than c (priority 5) and both do not fit: c is evicted and d pulled, though the agent's pod
        # mounts the whole NVMe folder.
        with_d = copy.deepcopy(doc)
        with_d["spec"]["models"].append({"name": "d", "priority": 5, "sizeGB": 0.0048,
                                         "uri": put_model(s3, model_files(shards=3, mib_per_shard=1.5, seed=52))})
        with_d["metadata"]["resourceVersion"] = k.get(WARMPROFILES, name)["metadata"]["resourceVersion"]
        k.replace(WARMPROFILES, name, with_d)
        d = view(with_d, "d")
        wait_for(lambda: model_labels(k, SMALL_NODE) == {models.label_key(d): generation.generation(d)}, timeout_s=120,
                 what="c evicted and d labelled")
        assert not c_dir.exists() and folder(with_d, small_nvme, d.name).is_dir()
        assert agentpod.on_node(k, profile.from_dict(doc).bootstrap.namespace, SMALL_NODE)["status"]["phase"] == "Running"

