"""A pod of the snapshot RuntimeClass on a real node (kubelet v1.20.2, containerd 1.6, runc, the CRIU setup builds):
containerd runs nodewarm's runtime handler in runc's place, a root process in the node's mount namespace takes the
snapshot, and the next pod with the same container starts from it; one with another environment boots, and its
log says why. The container is the static counter of support/runcbox.py (its token, its counts in memory and in
/dev/shm), so what a pod runs is seen without an engine; docs/snapshots.md says where vLLM stands."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from kubernetes import client as kc

from nodewarm_dev.testenv import realnode
from nodewarm_dev.testenv import snapshotnode
from support.controller_fixtures import wait_for
from support.realcluster import print_logs
from support.runcbox import counter_image

pytestmark = [pytest.mark.kube, pytest.mark.realnode]

NODE, HANDLER = "node-rn-snapshot", "nwsnap"


def _pod(name: str, ref: str, env: dict[str, str]) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": NODE, "restartPolicy": "Never", "runtimeClassName": HANDLER,
                     "containers": [{"name": "counter", "image": ref,
                                     "env": [{"name": k, "value": v} for k, v in env.items()],
                                     "volumeMounts": [{"name": "out", "mountPath": "/out"}]}],
                     "volumes": [{"name": "out", "hostPath": {"path": f"/nwtest-out/{name}",
                                                              "type": "DirectoryOrCreate"}}]}}


def _state(out: Path, name: str, at_least: int = 1) -> tuple[str, int, int]:
    def read():
        try:
            token, n, shared = (out / name / "state").read_text().split()
            return (token, int(n), int(shared)) if int(n) >= at_least else None
        except (OSError, ValueError):
            return None
    return wait_for(read, timeout_s=60, what=f"pod {name}'s counter to write its state")


def test_a_pod_of_the_snapshot_runtime_class_starts_from_the_snapshot_of_the_same_container(
        cluster, registry, tmp_path):
    local = counter_image(tmp_path / "image")
    ref = f"{registry}/nwtest-counter:1"
    subprocess.run(["buildah", "push", "--quiet", "--tls-verify=false", local, f"docker://{ref}"], check=True,
                   capture_output=True, timeout=300)
    store, out = tmp_path / "snapshots", tmp_path / "out"
    out.mkdir()
    handler = snapshotnode.handler_script(tmp_path / "nodewarm-runc", store)
    node = realnode.start(cluster, NODE, tmp_path / "n", registries={registry: f"http://{registry}"},
                          host_dirs={"/nwtest-out": out}, runtime_handlers={HANDLER: handler})
    core = kc.CoreV1Api(cluster.api_client())

    def log(pod: str) -> str:
        return snapshotnode.container_log(node, pod, "counter")

    try:
        snapshotnode.create_runtime_class(cluster.api_client(), HANDLER)
        env = {"MODEL_GENERATION": "1"}
        core.create_namespaced_pod("default", _pod("a", ref, env))
        token, n, _ = _state(out, "a", at_least=5)
        wait_for(lambda: "booting instead: no snapshot of this container on this node" in log("a"),
                 timeout_s=30, what="pod a's log to say why it booted")

        def container_id():
            statuses = core.read_namespaced_pod("a", "default").status.container_statuses or ()
            return statuses and statuses[0].container_id and statuses[0].container_id.split("//", 1)[1]
        cid = wait_for(container_id, timeout_s=30, what="pod a's container id in its status")
        slot = snapshotnode.checkpoint(node, store, cid)["slot"]
        assert slot.startswith("counter-")

        started = time.monotonic()
        core.create_namespaced_pod("default", _pod("b", ref, env))
        token_b, n_b, shared_b = _state(out, "b", at_least=n + 3)
        assert token_b == token, "pod b runs the process pod a checkpointed"
        assert shared_b > n_b - n, "its /dev/shm count went on from pod a's"
        wait_for(lambda: f"restored from the snapshot {slot}" in log("b"), timeout_s=30,
                 what="pod b's log to say it was restored")
        outcome = next(json.loads(p.read_text()) for p in (store / "outcomes").glob("*.json")
                       if json.loads(p.read_text())["pod"] == "default/b")
        assert outcome["result"] == "Restored", outcome
        print(f"pod b counting from the snapshot {time.monotonic() - started:.1f}s after its create")

        core.create_namespaced_pod("default", _pod("c", ref, {"MODEL_GENERATION": "2"}))
        token_c, _, _ = _state(out, "c")
        assert token_c != token
        assert "another key (differs in env.MODEL_GENERATION)" in wait_for(
            lambda: "another key" in log("c") and log("c"), timeout_s=30, what="pod c's log")
    except BaseException:
        print_logs(node)
        raise
    finally:
        for name in ("a", "b", "c"):
            try:
                core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
            except Exception:
                pass
        node.stop()
