"""The gate on a real node: a real kubelet v1.20.2 with its own containerd (nodewarm_dev.testenv.realnode) registers
under the taints Karpenter's AL2023 bootstrap gives it, the node reports Warm before Karpenter has registered it,
the controller (its own ServiceAccount, the RBAC it ships) waits for registration, and the real scheduler binds a
pod that does not tolerate the startup taint only after the lift. That no container of the pod ran before the lift is
read from the node's own containerd and from the kubelet's pod status (the container's startedAt), not assumed.

Fails with the reason (realnode.RealNodeUnavailable), never skips, where a real node cannot run.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time

import pytest
from kubernetes.client.exceptions import ApiException

from nodewarm.api.names import STATE_ANNOTATION
from nodewarm.api.timeutil import parse_time
from nodewarm.api.views import UNREGISTERED_TAINT
from nodewarm.bootstrap.nodestatus import report_warm
from nodewarm.controller.kube import NODECLAIMS, NODES, PODS
from nodewarm_dev.testenv import realnode
from nodewarm_dev.testenv.karpenter import KarpenterSim

from support.controller_fixtures import TAINT, installed, taint_keys, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.slow, pytest.mark.realnode]

NODE = "node-3"         # a kubelet identity of the session API server's tokens.csv
POD = "gated-workload"


def _workload(k) -> None:
    """For NODE, tolerating the GPU taint only; the local pause image the node already holds."""
    k.create(PODS, {"metadata": {"name": POD}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": NODE}, "hostNetwork": True, "terminationGracePeriodSeconds": 0,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "app", "image": realnode.PAUSE_IMAGE, "imagePullPolicy": "Never",
                        "resources": {"requests": {"cpu": "10m"}}}]}}, "default")


def _started(k) -> float | None:
    """When the kubelet says the pod's container started (whole seconds), once it runs."""
    sts = (k.get(PODS, POD, "default").get("status") or {}).get("containerStatuses") or []
    running = (sts[0].get("state") or {}).get("running") if sts else None
    return parse_time(running["startedAt"]) if running else None


def _app_containers(node: realnode.RealNode) -> list[str]:
    """The node's containerd containers of the workload (the sandbox's pause and the app's share the image, so go
    by the kubelet's container-name label)."""
    out = node.ctr("containers", "ls", "labels.io.kubernetes.container.name==app", "-q")
    return [line for line in out.split() if line]


def test_the_workload_starts_on_a_real_node_only_after_registration_and_the_lift(
        scheduling, kube, admin, k, controller_as_sa, tmp_path):
    realnode.preflight()
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True) as inst:
        with contextlib.suppress(ApiException):
            k.merge_patch(NODES, NODE, {"metadata": {"finalizers": None}})
            k.delete(NODES, NODE)
        claim = sim.launch(sim.create_nodeclaim(inst.pool)["metadata"]["name"])
        name = claim["metadata"]["name"]
        node = realnode.start(kube, NODE, tmp_path / "n", **realnode.from_nodeclaim(claim))
        try:
            assert {TAINT, UNREGISTERED_TAINT} <= set(taint_keys(k, NODE))
            _workload(k)
            # The agent (a host service on AL2023) reports Warm through the node's own identity, before registration.
            report_warm(kube.api_client(kube.node_token(NODE)), NODE, True, "WeightsVerified", "1 GB verified",
                        {"nodewarm.io/compile-cache": "cold"})
            time.sleep(2.0)
            assert TAINT in taint_keys(k, NODE), "lifted before Karpenter registered the node"
            assert not k.get(PODS, POD, "default")["spec"].get("nodeName") and _app_containers(node) == []

            sim.mark_registered(name)
            wait_for(lambda: TAINT not in taint_keys(k, NODE), timeout_s=15, what="the taint lifted")
            lifted = parse_time(json.loads(k.get(NODES, NODE)["metadata"]["annotations"][STATE_ANNOTATION])["decided"])
            started = wait_for(lambda: _started(k), timeout_s=60, what="the workload's container running")
            # startedAt is whole seconds (truncated): the container started in or after the second of the lift.
            assert started >= int(lifted), (started, lifted)
            ids = _app_containers(node)
            assert len(ids) == 1 and node.running_tasks().get(ids[0]) == "RUNNING", (ids, node.running_tasks())
            pod = k.get(PODS, POD, "default")
            assert pod["spec"]["nodeName"] == NODE
            assert pod["status"]["containerStatuses"][0]["containerID"] == f"containerd://{ids[0]}"
            assert TAINT not in taint_keys(k, NODE)          # and registration did not put it back
            assert sim.sync_initialized(name)
            assert k.get(NODECLAIMS, name)["status"]["nodeName"] == NODE
        except BaseException:
            print(f"===== node {NODE} =====\n{node.logs(6000)}", file=sys.stderr)
            raise
        finally:
            with contextlib.suppress(ApiException):
                k.request("DELETE", PODS.path(POD, "default"), body={"gracePeriodSeconds": 0})
            node.stop()
