"""One cluster for the tests of the pods nodewarm ships, on real nodes (package scope: its API server, controllers,
registry and the nodewarm controller's own node start once for every module here).

The API server runs ``in_cluster`` (ServiceAccount admission with the projected token volume); the DaemonSet,
Deployment and ServiceAccount controllers, the root-CA publisher and the scheduler are the real ones; the nodewarm
controller is its rendered Deployment's pod on a system node of its own; Karpenter's part is played (KarpenterSim),
around each kubelet's own Node. Pods are on their node's pod network, as rendered: they reach the API server through
the ``kubernetes`` Service's ClusterIP and the session's S3 server through a ClusterIP of its own, both carried by
realnode's ``services`` (no kube-proxy here).

Fails with the reason (realnode.RealNodeUnavailable, an image build's error), never skips, where a real node or an
image cannot be made.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from nodewarm.controller import manifests
from nodewarm.controller.kube import PODS, Kube
from nodewarm.kubeapply import apply
from nodewarm_dev.testenv import kube as kubeenv
from nodewarm_dev.testenv import podrun, realnode
from nodewarm_dev.testenv import registry as registry_server
from nodewarm_dev.testenv.crds import all_crds
from support import images
from support.controller_fixtures import wait_for
from support.realcluster import print_logs

SYSTEM_NODE = "node-rn-system"        # the controller's: no GPU, no taint
CONTROLLER_NS = "nodewarm"
# Every real node of this package, registered up front (kubeenv writes each one's credentials).
NODE_NAMES = ("node-rn-agent", "node-rn-small", "node-rn-serving", "node-rn-snapshot", "node-rn-engine-snapshot",
              SYSTEM_NODE)


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    realnode.preflight()
    work = tmp_path_factory.mktemp("kube-in-cluster")
    c = kubeenv.start(work, node_names=NODE_NAMES, in_cluster=True)
    try:
        c.apply_crds(all_crds())
        kubeenv.start_controller_manager(c, ("daemonset", "deployment", "replicaset", "serviceaccount",
                                             "root-ca-cert-publisher"))
        kubeenv.start_scheduler(c)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="package")
def registry(tmp_path_factory):
    """A registry on 127.0.0.1 (Debian's docker-registry); yields its host:port."""
    reg = registry_server.start(tmp_path_factory.mktemp("registry"))
    try:
        yield reg.host
    finally:
        reg.stop()


def _push(local: str, ref: str, uncompressed: bool = False) -> None:
    # A registry on this machine: gzip of the serving image's ~4 GB engine layer would cost more than it saves.
    flags = ["--disable-compression"] if uncompressed else []
    subprocess.run(["buildah", "push", "--quiet", "--tls-verify=false", *flags, local, f"docker://{ref}"],
                   check=True, capture_output=True, timeout=900)


@pytest.fixture(scope="package")
def image(registry):
    """The `nodewarm` image of this checkout, pushed to the registry: (registry host, image reference)."""
    local = images.nodewarm_image()
    ref = f"{registry}/{local.split('/', 1)[1]}"
    _push(local, ref)
    return registry, ref


@pytest.fixture(scope="package")
def serving_image(registry):
    """The serving image of this checkout (vLLM's CPU build with nodewarm), pushed to the registry: its reference."""
    local = images.serving_image()
    ref = f"{registry}/{local.split('/', 1)[1]}"
    _push(local, ref, uncompressed=True)
    return ref


@pytest.fixture(scope="package")
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
        print_logs(node)
        raise
    finally:
        node.stop()


@pytest.fixture(scope="package")
def tiny_model(tmp_path_factory) -> dict[str, bytes]:
    """The tiny Llama of nodewarm_dev.testenv.tinymodel (two safetensors shards), as files: the
    serving tests put it in S3 for the node agent to pull."""
    dest = tmp_path_factory.mktemp("tiny") / "model"
    venv = podrun.require_serving_venv()
    run = subprocess.run([str(venv / "bin" / "python3"), str(Path(podrun.__file__).with_name("tinymodel.py")),
                          str(dest), "--shards", "2"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
