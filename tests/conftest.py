"""What the test folders share. Session-wide real servers: one local S3 server per engine, one local
kube-apiserver, each started once per test session on free loopback ports and stopped at the end; nothing here
is mocked: tests talk to real processes over HTTP. Beside them, the fixtures more than one folder uses; a folder's
own are in its conftest.py.
"""

from __future__ import annotations

import os
import shutil
import sys

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


@pytest.fixture
def aws_path(tmp_path) -> str:
    """PATH with an `aws` command: the real AWS CLI where installed, else a boto3 stand-in for `s3 cp`
    (the download still goes to the real local S3 server)."""
    path = os.environ["PATH"]
    if shutil.which("aws"):
        return path
    stand_in = tmp_path / "aws-bin" / "aws"
    stand_in.parent.mkdir()
    stand_in.write_text(
        f"#!{sys.executable}\n"
        "import sys, boto3\n"
        "args = [a for a in sys.argv[1:] if a != '--only-show-errors']\n"
        "assert args[:2] == ['s3', 'cp'], args\n"
        "bucket, key = args[2].removeprefix('s3://').split('/', 1)\n"
        "boto3.client('s3').download_file(bucket, key, args[3])\n"
    )
    stand_in.chmod(0o755)
    return f"{stand_in.parent}:{path}"


@pytest.fixture
def bucket(s3):
    """The launch tests' bucket (support.launch.BUCKET) on the rclone server; the S3 client to it."""
    from support.launch import BUCKET

    client = s3.client()
    if BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        s3.create_bucket(BUCKET)
    return client


# Simulated kubelet identities in tokens.csv (tokens.csv is read once at server start).
KUBE_NODE_NAMES = tuple(f"node-{i}" for i in range(8)) + ("node-m1", "node-m2", "node-m3", "node-m4")


@pytest.fixture(scope="session")
def kube(tmp_path_factory):
    """A real kube-apiserver + etcd with Karpenter's CRDs in force (nodewarm's own, or a release's named by
    NODEWARM_CRDS_DIR), the WarmProfile CRD and the (nodewarm-written) Auto Mode NodeClass test CRD installed.
    ``kube.api_client()`` is admin; ``kube.api_client(kube.node_token("node-0"))`` is that node's kubelet identity."""
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
    """Create a Node (deleting a leftover one first) carrying ``taints``; deleted afterwards, with its pods."""
    from kubernetes.client.exceptions import ApiException

    from nodewarm.controller.kube import NODES, PODS

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
        # And the pods a test bound to it: nothing here garbage-collects them, and a real kubelet registering the
        # same name later in the session would adopt and run every one not finished.
        for pod in k.request("GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={name}"})["items"]:
            try:
                k.request("DELETE", PODS.path(pod["metadata"]["name"], pod["metadata"]["namespace"]),
                          body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
            except ApiException:
                pass


@pytest.fixture(scope="session")
def scheduling(kube):
    """The real kube-scheduler and the Deployment/ReplicaSet controllers on the session's API server."""
    from nodewarm_dev.testenv import kube as kubeenv

    kubeenv.start_controller_manager(kube)
    kubeenv.start_scheduler(kube)
    return kube


@pytest.fixture
def controller_as_sa(kube, k):
    """The nodewarm controller running in this process as its own ServiceAccount, with exactly the RBAC it ships
    (controller/manifests.py), as an install puts it in place; stopped afterwards."""
    from support.controller_fixtures import running, uniq

    ns = uniq("nodewarm")
    api = kube.api_client(kube.controller_token(ns))
    with running(api) as c:
        yield c
