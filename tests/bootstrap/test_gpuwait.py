"""The agent's Warm waits for the Node to advertise the GPUs the vLLM pod requests: the pure verdicts, then the
wait against the real API server as the node itself (kubelet token, Node authorizer + NodeRestriction), while
the test plays the kubelet whose device plugin registers (status.allocatable via the status subresource)."""

from __future__ import annotations

import threading

import pytest

from nodewarm.bootstrap import gpuwait
from nodewarm.controller.kube import NODES
from support.builders import TAINT, node

P5 = {"node.kubernetes.io/instance-type": "p5.48xlarge"}


@pytest.mark.parametrize("n, wanted, verdict", [
    (node(gpus=8), 2, ("advertised", "GpusAdvertised")),           # a p5.48xlarge
    (node(gpus=2), 2, ("advertised", "GpusAdvertised")),
    (node(gpus=None), 2, None),                                    # a GPU instance, nothing advertised yet: wait
    (node(gpus=1), 2, None),                                       # part of them: wait
    (node(instance_type=None, gpus=None, labels={"karpenter.k8s.aws/instance-gpu-count": "4"}), 4, None),
    (node(instance_type=None, gpus=None, labels={"karpenter.k8s.aws/instance-gpu-count": "1"}), 2,
     ("failed", "TooFewGpus")),
    (node(instance_type=None, gpus=None), 1, ("skipped", "GpuCountUnknown")),   # nothing says this node has GPUs
    (node(instance_type="unknown.type", gpus=None), 1, ("skipped", "GpuCountUnknown")),
])
def test_verdicts(n, wanted, verdict):
    r = gpuwait.judge(n, wanted)
    assert (r.status, r.reason) == verdict if verdict else r is None


def test_the_timeout_names_the_device_plugin_and_the_fix():
    r = gpuwait.timeout_result(2, 0, 180, "nodewarm.io/warming")
    assert r.reason == "GpusNotAdvertised" and "device plugin" in r.message and "nodewarm.io/warming" in r.message
    assert "--device-plugin-patch" in r.message and r.annotation() == "timeout GpusNotAdvertised 0/2"


@pytest.mark.kube
def test_the_wait_ends_when_the_kubelet_advertises_the_gpus(kube, k, fresh_node):
    name = "node-6"
    fresh_node(name, [TAINT], labels=P5)
    node_client = kube.api_client(kube.node_token(name))
    polled, out = threading.Event(), {}

    def wait():
        out["r"] = gpuwait.wait_for_gpus(node_client, name, 2, deadline_s=120, poll_s=0.1,
                                         on_poll=lambda _n: polled.set())

    t = threading.Thread(target=wait)
    t.start()
    try:
        assert polled.wait(30), "the agent never read its Node"
        assert t.is_alive(), f"returned before any GPU was advertised: {out.get('r')}"
        # The kubelet, once the device plugin registered: allocatable through the status subresource.
        k.request("PATCH", NODES.path(name, sub="status"),
                  body={"status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}},
                  content_type="application/strategic-merge-patch+json")
        t.join(60)
        assert not t.is_alive()
    finally:
        t.join(120)
    r = out["r"]
    assert (r.status, r.reason, r.allocatable, r.wanted) == ("advertised", "GpusAdvertised", 8, 2)


@pytest.mark.kube
def test_a_node_that_never_advertises_ends_the_wait_with_the_reason(kube, fresh_node):
    name = "node-7"
    fresh_node(name, [TAINT], labels=P5)
    r = gpuwait.wait_for_gpus(kube.api_client(kube.node_token(name)), name, 2, deadline_s=0.5, poll_s=0.1,
                              taint_key=TAINT["key"])
    assert (r.status, r.reason, r.allocatable) == ("timeout", "GpusNotAdvertised", 0)
