"""Real nodes (nodewarm_dev.testenv.realnode): a real kubelet v1.20.2 with its own containerd and runc registers
with its own identity and the taints Karpenter's AL2023 bootstrap gives it, and runs pods.

Where a real node cannot run (not root, kubelet not built, no cgroup v1...) these tests FAIL with the reason
(realnode.RealNodeUnavailable), never skip: build it with dev/src/nodewarm_dev/testenv/build-kubelet.sh.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from nodewarm.controller.kube import NODES, Kube
from nodewarm_dev.testenv import kube as kubeenv
from nodewarm_dev.testenv import realnode
from nodewarm_dev.testenv.karpenter import KarpenterSim

from support.controller_fixtures import installed, wait_for

pytestmark = [pytest.mark.kube, pytest.mark.slow, pytest.mark.realnode]

NODE_NAMES = ("node-6", "node-7")       # kubelet identities in the session API server's tokens.csv


@contextlib.contextmanager
def running(*starts):
    """Start real nodes one after the other (each ``start`` a callable); on any failure print every node's logs;
    always stop them all."""
    nodes: list[realnode.RealNode] = []
    try:
        for s in starts:
            nodes.append(s())
        yield nodes
    except BaseException:
        for n in nodes:
            print(f"===== node {n.name} =====\n{n.logs(6000)}", file=sys.stderr)
        raise
    finally:
        errors = []
        for n in nodes:
            try:
                n.stop()
            except Exception as e:
                errors.append(str(e))
        assert not errors, errors


def _forget_node(k: Kube, name: str) -> None:
    """A Node of that name left by another test would be adopted by the kubelet as it is: delete it first."""
    with contextlib.suppress(ApiException):
        k.merge_patch(NODES, name, {"metadata": {"finalizers": None}})
        k.delete(NODES, name)


def _pod(name: str, node: str, taints: list[dict], host_network: bool = True) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "hostNetwork": host_network, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "pause", "image": realnode.PAUSE_IMAGE, "imagePullPolicy": "Never"}],
                     "tolerations": [{k: v for k, v in t.items() if k in ("key", "value", "effect")}
                                     | {"operator": "Equal" if t.get("value") else "Exists"} for t in taints]}}


def _wait_running(core: client.CoreV1Api, name: str, timeout_s: float = 90) -> client.V1Pod:
    def running_pod():
        p = core.read_namespaced_pod(name, "default")
        sts = p.status.container_statuses or []
        return p if p.status.phase == "Running" and sts and sts[0].state.running else None

    return wait_for(running_pod, timeout_s, f"pod {name} Running", interval_s=0.1)


def _delete_pods(core: client.CoreV1Api, names) -> None:
    for n in names:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(n, "default", grace_period_seconds=0)


def _ping(ip: str, timeout_s: float = 3) -> bool:
    """One ICMP echo (raw socket, root; Debian's ping is not installed here): the pod's network namespace answers."""
    import socket
    import struct

    def checksum(b: bytes) -> int:
        s = sum(struct.unpack(f"!{len(b) // 2}H", b))
        s = (s >> 16) + (s & 0xFFFF)
        return ~(s + (s >> 16)) & 0xFFFF

    ident = os.getpid() & 0xFFFF
    body = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"nodewarm"
    packet = body[:2] + struct.pack("!H", checksum(body)) + body[4:]
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
        sock.settimeout(timeout_s)
        sock.sendto(packet, (ip, 0))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            data, addr = sock.recvfrom(1024)
            icmp = data[(data[0] & 0x0F) * 4:]
            if addr[0] == ip and icmp[0] == 0 and struct.unpack("!H", icmp[4:6])[0] == ident:
                return True
    return False


def test_two_real_nodes_register_as_themselves_with_karpenters_taints_and_run_pods(kube, tmp_path):
    realnode.preflight()        # fails (not skips) with every reason a real node cannot run here
    admin = kube.api_client()
    k, sim, core = Kube(admin), KarpenterSim(admin), client.CoreV1Api(admin)
    pods = []
    with installed(k, inject_ready=True) as inst:
        # Karpenter's part first: NodeClaims launched with providerIDs; then the real nodes they describe.
        claims = []
        for _ in NODE_NAMES:
            c = sim.create_nodeclaim(inst.pool)
            claims.append(sim.launch(c["metadata"]["name"]))
        for name in NODE_NAMES:
            _forget_node(k, name)
        t0 = time.monotonic()
        starts = [lambda name=name, c=c: realnode.start(kube, name, tmp_path / name, wait=False,
                                                         **realnode.from_nodeclaim(c))
                  for name, c in zip(NODE_NAMES, claims)]
        try:
            with running(*starts) as nodes:
                for n in nodes:          # both start together; each is Ready about 10 s after it registers
                    n.wait_ready()
                print(f"two nodes started and Ready in {time.monotonic() - t0:.1f} s: "
                      + ", ".join(f"{n.name} {n.timings['ready_s']:.1f} s" for n in nodes))
                for n, c in zip(nodes, claims):
                    node = k.get(NODES, n.name)
                    assert n.auth == "token"
                    assert node["spec"]["providerID"] == c["status"]["providerID"]
                    # Exactly AL2023's registerWithTaints (the not-ready taint the API server added is lifted).
                    assert node["spec"]["taints"] == realnode.registration_taints(c)
                    assert [t["key"] for t in node["spec"]["taints"]][-1] == "karpenter.sh/unregistered"
                    labels = node["metadata"]["labels"]
                    assert labels["karpenter.sh/nodepool"] == inst.pool
                    assert labels["kubernetes.io/hostname"] == n.name
                    assert labels["node.kubernetes.io/instance-type"] == c["metadata"]["labels"][
                        "node.kubernetes.io/instance-type"]
                    # The real kubelet reports this machine, not a p5: no GPUs.
                    assert "nvidia.com/gpu" not in node["status"]["capacity"]
                    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.20.2"
                    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.6.")
                    lease = client.CoordinationV1Api(admin).read_namespaced_lease(n.name, "kube-node-lease")
                    assert lease.spec.holder_identity == n.name

                # Each kubelet is system:node:NAME under NodeRestriction: it may not touch the other's Node.
                own = config.new_client_from_config(str(nodes[0].workdir / "kubelet.kubeconfig"))
                with pytest.raises(ApiException) as denied:
                    client.CoreV1Api(own).patch_node(nodes[1].name, {"metadata": {"labels": {"x": "y"}}})
                assert denied.value.status == 403
                message = json.loads(denied.value.body)["message"]
                assert f'node "{nodes[0].name}" is not allowed to modify node "{nodes[1].name}"' in message
                client.CoreV1Api(own).patch_node(nodes[0].name, {"metadata": {"labels": {"nodewarm.io/probe": "1"}}})

                # Karpenter's registration links each by providerID and removes karpenter.sh/unregistered.
                for n, c in zip(nodes, claims):
                    registered = sim.mark_registered(c["metadata"]["name"])
                    assert registered["status"]["nodeName"] == n.name
                    assert "karpenter.sh/unregistered" not in [t["key"] for t in k.get(NODES, n.name)["spec"]["taints"]]

                for n, c in zip(nodes, claims):
                    pod = f"realnode-pause-{n.name}"
                    pods.append(pod)
                    t = time.monotonic()
                    core.create_namespaced_pod("default", _pod(pod, n.name, realnode.registration_taints(c)))
                    p = _wait_running(core, pod)
                    print(f"pod on {n.name}: created -> Running in {time.monotonic() - t:.2f} s")
                    cid = p.status.container_statuses[0].container_id
                    assert cid.startswith("containerd://"), cid
                    cid = cid.removeprefix("containerd://")
                    assert cid in n.container_ids()
                    assert n.running_tasks()[cid] == "RUNNING"
                    assert p.status.host_ip and p.status.pod_ip == p.status.host_ip      # host network
                # Each pod's containers are in its own node's containerd only.
                a, b = nodes
                ids_a, ids_b = set(a.container_ids()), set(b.container_ids())
                assert not ids_a & ids_b and len(ids_a) == len(ids_b) == 2     # the sandbox (pause) + the container
                # Every mount a node makes is in its own mount namespace, none on the host.
                for n in nodes:
                    assert any(m.startswith(str(n.root_dir)) for m in n.mounts())
                    assert any(m.startswith(str(n.workdir / "containerd")) or m.startswith(str(n.state_dir))
                               for m in n.mounts())                       # the containers' overlay rootfs
                    assert realnode._mounts_under(n.workdir) == realnode._mounts_under(n.state_dir) == []

                # No GPU on a real node until advertised; then the kubelet keeps it and makes it allocatable.
                assert "nvidia.com/gpu" not in k.get(NODES, a.name)["status"]["allocatable"]
                t = time.monotonic()
                node = a.advertise({"nvidia.com/gpu": "8"})
                print(f"nvidia.com/gpu allocatable on {a.name} {time.monotonic() - t:.1f} s after advertising")
                assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
                assert "nvidia.com/gpu" not in k.get(NODES, b.name)["status"]["capacity"]
        finally:
            _delete_pods(core, pods)


def test_a_real_node_with_a_client_certificate_runs_a_pod_on_its_bridge(tmp_path):
    """The other identity: a client certificate (O=system:nodes, CN=system:node:NAME) signed by a client CA the API
    server trusts (this test's own server: the session one has none). And a pod without hostNetwork gets an address
    on the node's CNI bridge."""
    realnode.preflight()
    work = tmp_path / "kube"
    cluster = kubeenv.start(work, extra_args=realnode.client_ca_args(work))
    name = "ip-10-0-1-7.us-west-2.compute.internal"        # not in any tokens.csv: the certificate is its identity
    try:
        core = client.CoreV1Api(cluster.api_client())
        with running(lambda: realnode.start(cluster, name, tmp_path / "node", taints=[realnode.UNREGISTERED],
                                            provider_id="aws:///us-west-2a/i-0abc")) as (n,):
            assert n.auth == "client-cert"
            subject = subprocess.run(["openssl", "x509", "-noout", "-subject", "-in",
                                      str(n.workdir / "pki" / "kubelet-client.crt")], capture_output=True, text=True)
            assert "O = system:nodes, CN = system:node:" + name in subject.stdout
            assert Kube(cluster.api_client()).get(NODES, name)["spec"]["taints"] == [realnode.UNREGISTERED]
            core.create_namespaced_pod("default", _pod("bridged", name, [realnode.UNREGISTERED], host_network=False))
            p = _wait_running(core, "bridged")
            prefix = n.subnet.rsplit(".", 1)[0] + "."
            assert p.status.pod_ip.startswith(prefix), (p.status.pod_ip, n.subnet)
            assert p.status.pod_ip != p.status.host_ip
            route = subprocess.run(["ip", "route", "get", p.status.pod_ip], capture_output=True, text=True).stdout
            assert f"dev {n.bridge}" in route, route
            assert _ping(p.status.pod_ip), f"no ICMP echo reply from the pod at {p.status.pod_ip}"
    finally:
        cluster.stop()
    assert subprocess.run(["ip", "link", "show", n.bridge], capture_output=True).returncode != 0   # bridge gone


def test_preflight_says_why_a_node_cannot_run(tmp_path):
    """Not root: refused, with the reason (the same error a test gets from ``start`` where it cannot run)."""
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                        "from nodewarm_dev.testenv import realnode\n"
                        "try:\n    realnode.preflight()\n"
                        "except realnode.RealNodeUnavailable as e:\n    print(e)\n"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert "a real node cannot run on this machine: not root" in r.stdout, r.stdout + r.stderr


def test_nodeclaim_arguments_are_what_al2023_registers_with():
    claim = {"metadata": {"labels": {"karpenter.sh/nodepool": "gpu", "node.kubernetes.io/instance-type": "p5.48xlarge",
                                     "topology.kubernetes.io/zone": "us-west-2a", "kubernetes.io/arch": "amd64",
                                     "karpenter.k8s.aws/instance-gpu-count": "8",
                                     "node-role.kubernetes.io/gpu": "", "example.kubernetes.io/x": "y"}},
             "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
                      "startupTaints": [{"key": "nodewarm.io/warming", "value": "true", "effect": "NoSchedule"}]},
             "status": {"providerID": "aws:///us-west-2a/i-1"}}
    args = realnode.from_nodeclaim(claim)
    assert args["provider_id"] == "aws:///us-west-2a/i-1"
    assert set(args["labels"]) == {"karpenter.sh/nodepool", "node.kubernetes.io/instance-type",
                                   "topology.kubernetes.io/zone", "kubernetes.io/arch",
                                   "karpenter.k8s.aws/instance-gpu-count"}
    assert realnode.taint_flag(args["taints"]) == ("nvidia.com/gpu:NoSchedule,nodewarm.io/warming=true:NoSchedule,"
                                                   "karpenter.sh/unregistered:NoExecute")


def test_a_node_whose_owner_was_killed_is_reaped_with_everything_it_left(kube, tmp_path):
    """A test run killed before ``stop`` leaves containerd, the kubelet and their cgroups running: the next
    ``start`` (``reap_stale``) tears them down and puts the host's sysctls back."""
    realnode.preflight()
    name = "node-5"
    k = Kube(kube.api_client())
    _forget_node(k, name)
    sysctls = {s: (Path("/proc/sys") / s).read_text() for s in ("kernel/panic", "kernel/panic_on_oops")}
    child = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from pathlib import Path
from nodewarm_dev.testenv import kube, realnode
cluster = kube.KubeCluster(server={kube.server!r}, ca_file={kube.ca_file!r}, admin_token={kube.admin_token!r},
                           workdir=Path({str(kube.workdir)!r}), node_tokens={{{name!r}: {kube.node_token(name)!r}}})
n = realnode.start(cluster, {name!r}, Path({str(tmp_path / name)!r}), wait=False)
print(n.state_dir, n.cgroup, n.bridge, flush=True)
time.sleep(600)
"""], stdout=subprocess.PIPE, text=True)
    try:
        state_dir, cgroup, bridge = child.stdout.readline().split()
        wait_for(lambda: k.list(NODES, fieldSelector=f"metadata.name={name}")["items"], 60, f"{name} registered")
        wait_for(lambda: (Path("/proc/sys/kernel/panic_on_oops").read_text().strip() == "1"), 20,
                 "the kubelet's kernel tunables")
    finally:
        child.kill()
        child.wait()
    try:
        assert realnode._cgroup_pids(cgroup), "the killed owner's containerd and kubelet should still run"
        assert name in realnode.reap_stale()
        assert not realnode._cgroup_pids(cgroup)
        assert not [m for m in realnode._cgroup_v1_hierarchies().values() if (m / cgroup.strip("/")).exists()]
        assert not Path(state_dir).exists()
        assert subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode != 0
        if not any(d.is_dir() for d in realnode.STATE_BASE.iterdir()):      # no other node on this machine
            assert {s: (Path("/proc/sys") / s).read_text() for s in sysctls} == sysctls
    finally:
        _forget_node(k, name)
