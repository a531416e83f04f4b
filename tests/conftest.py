"""Session-wide real servers: one local S3 server per engine, one local kube-apiserver.

Each starts once per test session on free loopback ports and is stopped at the end. Nothing here is
mocked: tests talk to real processes over HTTP.
"""

from __future__ import annotations


import pytest

from nodewarm_dev.testenv import s3server


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """rclone `serve s3` over a plain directory (a top-level folder is a bucket)."""
    server = s3server.start("rclone", tmp_path_factory.mktemp("s3-rclone") / "data")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_exact(tmp_path_factory):
    """SeaweedFS: AWS-exact ETags, 412 on failed conditions, If-None-Match writes."""
    server = s3server.start("seaweedfs", tmp_path_factory.mktemp("s3-seaweed") / "data")
    yield server
    server.stop()


@pytest.fixture
def aws_env(s3, monkeypatch):
    """The standard AWS environment pointed at the rclone server, for code that reads os.environ."""
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    return s3


# Simulated kubelet identities in tokens.csv (tokens.csv is read once at server start).
KUBE_NODE_NAMES = tuple(f"node-{i}" for i in range(8))


@pytest.fixture(scope="session")
def kube(tmp_path_factory):
    """A real kube-apiserver + etcd with the upstream Karpenter CRDs, the WarmProfile CRD and the
    (nodewarm-written) Auto Mode NodeClass test CRD installed. ``kube.api_client()`` is admin;
    ``kube.api_client(kube.node_token("node-0"))`` is that node's kubelet identity."""
    from nodewarm_dev.testenv import kube as kubeenv
    from nodewarm_dev.testenv.crds import all_crds

    cluster = kubeenv.start(tmp_path_factory.mktemp("kube"), node_names=KUBE_NODE_NAMES)
    try:
        cluster.apply_crds(all_crds())
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def admin(kube):
    """An admin (system:masters) client of the session's API server."""
    return kube.api_client()


@pytest.fixture(scope="session")
def k(admin):
    """The controller's thin JSON client over ``admin``."""
    from nodewarm.controller.kube import Kube

    return Kube(admin)


@pytest.fixture
def fresh_node(k):
    """Create a Node (deleting a leftover one first) carrying ``taints``; deleted afterwards."""
    from kubernetes.client.exceptions import ApiException

    from nodewarm.controller.kube import NODES

    made = []

    def create(name: str, taints: list[dict], labels: dict | None = None, provider_id: str = "") -> dict:
        try:
            k.delete(NODES, name)
        except ApiException:
            pass
        made.append(name)
        return k.create(NODES, {"metadata": {"name": name, "labels": labels or {}},
                                "spec": {"providerID": provider_id or f"aws:///us-west-2a/i-{name}", "taints": taints}})

    yield create
    for name in made:
        try:
            k.delete(NODES, name)
        except ApiException:
            pass
