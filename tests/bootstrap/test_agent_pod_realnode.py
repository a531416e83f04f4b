"""The agent as it ships on Auto Mode: the rendered DaemonSet's pod, from the `nodewarm` image, pulled from a registry
and run by a real kubelet v1.20.2 with its own containerd (nodewarm_dev.testenv.realnode), with the ServiceAccount
token the kubelet projects into it and the RBAC `nodewarm render` wrote; its hostPath is the node's NVMe mount.

The API server runs ``in_cluster`` (ServiceAccount admission with the projected token volume); the DaemonSet,
Deployment and ServiceAccount controllers, the root-CA publisher and the scheduler are the real ones; the nodewarm
controller is its rendered Deployment's pod on a system node of its own; Karpenter's part is played (KarpenterSim),
around the kubelet's own Node. The pod is on the node's pod network, as rendered: it reaches the API server through
the ``kubernetes`` Service's ClusterIP and the session's S3 server through a ClusterIP of its own, both carried by
realnode's ``services`` (no kube-proxy here). Its S3 credentials come in as environment variables, which on EKS the
Pod Identity agent or IRSA's webhook provides.

Fails with the reason (realnode.RealNodeUnavailable, the image build's error), never skips, where a real node or the
image cannot be made.
"""

from __future__ import annotations

import contextlib
import copy
import subprocess
import sys
from pathlib import Path

import pytest

from nodewarm import instancetypes, profile
from nodewarm.api import generation, models
from nodewarm.controller import manifests
from nodewarm.sizing import NODE_FREE_MARGIN_MIN_BYTES as SIZING_MIN_FREE
from nodewarm.api.agentpod import NAME as AGENT
from nodewarm.api.names import WARM_CONDITION, WARM_GENERATION_ANNOTATION
from nodewarm.controller.kube import NODES, PODS, WARMPROFILES, Kube
from nodewarm.kubeapply import apply
from nodewarm.nodeclasses.render import render
from nodewarm_dev.testenv import kube as kubeenv
from nodewarm_dev.testenv import realnode
from nodewarm_dev.testenv import registry as registry_server
from nodewarm_dev.testenv.crds import all_crds
from nodewarm_dev.testenv.karpenter import KarpenterSim
from support.bootstrap_fixtures import model_files, put_model, visible_files
from support.builders import NO_CACHE, v
from support.controller_fixtures import wait_for
from support.modelviews import folder, model_labels, view
from support.images import nodewarm_image

pytestmark = [pytest.mark.kube, pytest.mark.s3, pytest.mark.slow, pytest.mark.realnode]

NODE, NAME, POOL = "node-rn-agent", "agent-pod", "agent-pod-pool"
SMALL_NODE = "node-rn-small"
SYSTEM_NODE = "node-rn-system"        # the controller's: no GPU, no taint
CONTROLLER_NS = "nodewarm"
MiB = 1 << 20
S3_SERVICE = "10.0.0.10:80"             # an S3 Service's ClusterIP and port, in the API server's Service range
# The prepull DaemonSet's main container (nodewarm.nodeclasses.prepull): no registry is reachable here, so the node
# holds a pause image under that name, as an EKS AMI holds its own pause image before any pod runs.
UPSTREAM_PAUSE = "registry.k8s.io/pause:3.9"


def _warm(node: dict | None) -> dict | None:
    return next((c for c in ((node or {}).get("status") or {}).get("conditions") or ()
                 if c["type"] == WARM_CONDITION), None)


def _annotations(k: Kube, node: str = NODE) -> dict:
    return k.get(NODES, node)["metadata"].get("annotations") or {}


def _agent_pod(k: Kube, namespace: str, node: str = NODE) -> dict | None:
    pods = k.list(PODS, namespace, labelSelector=f"app.kubernetes.io/name={AGENT}")["items"]
    return next((p for p in pods if p["spec"].get("nodeName") == node), None)


def _print_logs(node: realnode.RealNode) -> None:
    """For a failing test: the node's containerd and kubelet logs and every container's log on it."""
    print(f"===== node {node.name} =====\n{node.logs(8000)}", file=sys.stderr)
    for f in sorted(node.log_dir.rglob("*.log")):
        print(f"===== {f} =====\n{f.read_text(errors='replace')[-6000:]}", file=sys.stderr)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    realnode.preflight()
    work = tmp_path_factory.mktemp("kube-in-cluster")
    c = kubeenv.start(work, node_names=(NODE, SMALL_NODE, SYSTEM_NODE), in_cluster=True)
    try:
        c.apply_crds(all_crds())
        kubeenv.start_controller_manager(c, ("daemonset", "deployment", "replicaset", "serviceaccount",
                                             "root-ca-cert-publisher"))
        kubeenv.start_scheduler(c)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def controller_pod(cluster, image, tmp_path_factory):
    """The nodewarm controller as it ships (``nodewarm render --with-controller``: its Deployment, ServiceAccount and
    RBAC) on a real node of its own, a system node with no GPU and no taint, as a cluster runs it; one replica.
    Yields the controller's namespace."""
    _, ref = image
    k = Kube(cluster.api_client())
    apply(k.api, manifests.render(ref, CONTROLLER_NS, replicas=1))
    node = realnode.start(cluster, SYSTEM_NODE, tmp_path_factory.mktemp("system") / "n",
                          registries={image[0]: f"http://{image[0]}"},
                          services={kubeenv.KUBERNETES_SERVICE: cluster.server.removeprefix("https://")})
    try:
        def ready() -> bool:
            pods = k.list(PODS, CONTROLLER_NS, labelSelector=f"app.kubernetes.io/name={manifests.NAME}")["items"]
            return any(p["spec"].get("nodeName") == SYSTEM_NODE and any(
                c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or ())
                for p in pods)
        wait_for(ready, timeout_s=180, what="the controller pod Ready on the system node")
        yield CONTROLLER_NS
    except BaseException:
        _print_logs(node)
        raise
    finally:
        node.stop()


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """The `nodewarm` image of this checkout, pushed to a registry on 127.0.0.1: (registry host, image reference)."""
    local = nodewarm_image()
    reg = registry_server.start(tmp_path_factory.mktemp("registry"))
    try:
        ref = f"{reg.host}/nodewarm:{local.rsplit(':', 1)[1]}"
        subprocess.run(["buildah", "push", "--quiet", "--tls-verify=false", local, f"docker://{ref}"],
                       check=True, capture_output=True, timeout=300)
        yield reg.host, ref
    finally:
        reg.stop()


@contextlib.contextmanager
def _joined(cluster, image, s3, tmp_path, doc: dict, node_name: str, nvme: Path):
    """The profile ``doc`` rendered and applied as a user would, and a real node of its pool launched, joined and
    registered, its NVMe folder ``nvme``; yields the running node. Stopped (and its logs printed on a failure)
    afterwards."""
    host, ref = image
    k = Kube(cluster.api_client())
    p = profile.from_dict(doc)
    docs = render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
    agent_ds = next(d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"].startswith(AGENT))
    s3_env = {**s3.env(), "AWS_ENDPOINT_URL": f"http://{S3_SERVICE}"}
    agent_ds["spec"]["template"]["spec"]["containers"][0]["env"] += [
        {"name": n, "value": val} for n, val in s3_env.items()]
    # What a user applies, but the vLLM Deployment and its PodDisruptionBudget (no Deployment controller runs here;
    # policy/v1 is 1.21's) and the admission policy (1.30's; tests/nodeclasses/test_admission_policy.py checks it).
    skip = {"Deployment", "PodDisruptionBudget", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    apply(k.api, [d for d in docs if d["kind"] not in skip])

    sim = KarpenterSim(cluster.api_client())
    claim = sim.launch(sim.create_nodeclaim(p.nodes.node_pool)["metadata"]["name"])
    node = realnode.start(cluster, node_name, tmp_path / "n", **realnode.from_nodeclaim(claim),
                          registries={host: f"http://{host}"}, host_dirs={p.nodes.cache_mount: nvme},
                          services={kubeenv.KUBERNETES_SERVICE: cluster.server.removeprefix("https://"),
                                    S3_SERVICE: s3.endpoint.removeprefix("http://")})
    try:
        node.ctr("images", "tag", realnode.PAUSE_IMAGE, UPSTREAM_PAUSE)
        node.advertise({"nvidia.com/gpu": claim["metadata"]["labels"]["karpenter.k8s.aws/instance-gpu-count"]})
        sim.mark_registered(claim["metadata"]["name"])
        yield node
    except BaseException:
        for pod_ in k.list(PODS, p.bootstrap.namespace)["items"]:
            print(f"===== pod {pod_['metadata']['name']} =====\n{pod_['spec'].get('nodeName')} {pod_.get('status')}",
                  file=sys.stderr)
        _print_logs(node)
        raise
    finally:
        with contextlib.suppress(Exception):
            node.stop()


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
    with _joined(cluster, image, s3, tmp_path, doc, NODE, nvme) as node:
        ns = p.bootstrap.namespace
        pod = wait_for(lambda: _agent_pod(k, ns), timeout_s=60, what="the DaemonSet controller's agent pod")
        warm = wait_for(lambda: (_warm(k.get(NODES, NODE)) or {}).get("status") == "True" and _warm(k.get(NODES, NODE)),
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
        assert _warm(k.get(NODES, NODE))["status"] == "True"
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
    with _joined(cluster, image, s3, tmp_path, doc, SMALL_NODE, small_nvme):
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
        assert _agent_pod(k, profile.from_dict(doc).bootstrap.namespace, SMALL_NODE)["status"]["phase"] == "Running"

