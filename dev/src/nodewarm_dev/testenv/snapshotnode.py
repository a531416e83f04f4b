"""A real node (realnode) with nodewarm's snapshot handler, as the snapshot tests and the snapshot bench need it: the
handler's binary (what a node installs), its RuntimeClass, a checkpoint taken as the node's root component takes
it, and a pod's container log."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

from kubernetes import client as kc

from nodewarm.api import snapshot as contract
from nodewarm.api.snapshot import ENV_CRIU, ENV_RUNC, ENV_STORE

from .criu import criu_binary
from .podrun import REPO

SRC = REPO / "src"


def handler_script(path: Path, store: Path) -> Path:
    """The handler's binary for containerd (``runtime_handlers``): the product's handler with its settings."""
    runc = subprocess.run(["which", "runc"], capture_output=True, text=True, check=True).stdout.strip()
    path.write_text("#!/bin/sh\n"
                    f"exec env {ENV_STORE}={store} {ENV_CRIU}={criu_binary()} {ENV_RUNC}={runc} "
                    f"PYTHONPATH={SRC} {sys.executable} -m nodewarm.bootstrap.snapshot.handler \"$@\"\n")
    path.chmod(0o755)
    return path


@contextlib.contextmanager
def seccomp_profile():
    """The seccomp profile the rendered vLLM container names (api.snapshot.SECCOMP), where the AL2023 user data
    writes it: the kubelet's seccomp root, which every real node on this machine shares. Removed afterwards; one
    already there is refused (another node's user data on this machine?)."""
    path = Path(contract.SECCOMP_DIR) / contract.SECCOMP_PROFILE
    if path.exists():
        raise RuntimeError(f"{path} exists already: another node's user data on this machine? remove it first")
    made = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(contract.SECCOMP))
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        if made:
            path.parent.rmdir()


def host_agent_argv(node, launch_argv: list[str], node_name: str, kubeconfig: Path, state_dir: Path) -> list[str]:
    """``nodewarm <launch_argv>`` (what the AL2023 user data's unit runs: userdata.launch) as that unit runs it: root,
    in the node's mount namespace (its NVMe mount, containerd's containers), with the node's own credentials, and
    the snapshot step pointed at this node's runc state and the CRIU setup builds. ``--once``: it exits at Warm."""
    code = "import sys; from nodewarm.cli import main; sys.exit(main(sys.argv[1:]))"
    return node.in_mount_namespace(
        sys.executable, "-c", code, *launch_argv, "--node-name", node_name, "--kubeconfig", str(kubeconfig),
        "--once", "--state-dir", str(state_dir),
        "--snapshot-runc-root", str(node.state_dir / "runc" / "k8s.io"), "--snapshot-criu", str(criu_binary()))


def create_runtime_class(api_client, handler: str) -> None:
    kc.NodeV1Api(api_client).create_runtime_class(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": handler}, "handler": handler})


def checkpoint(node, store: Path, container_id: str) -> dict:
    """The checkpoint CLI, run as root in the node's mount namespace (where containerd mounted the container's
    root filesystem); its JSON answer (slot, path, seconds, imageBytes). Raises RuntimeError with its stderr when
    it fails."""
    taken = subprocess.run(node.in_mount_namespace(
        sys.executable, "-m", "nodewarm.bootstrap.snapshot.cli", "checkpoint", "--store", str(store),
        "--runc-root", str(node.state_dir / "runc" / "k8s.io"), "--criu", str(criu_binary()), container_id),
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, capture_output=True, text=True,
        timeout=300)
    if taken.returncode != 0:
        raise RuntimeError(f"checkpoint of {container_id} exited {taken.returncode}: {taken.stderr.strip()[-3000:]}")
    return json.loads(taken.stdout)


def container_log(node, pod: str, container: str) -> str:
    """What the kubelet wrote of a default-namespace pod's container (its /var/log/pods files)."""
    return "".join(p.read_text(errors="replace")
                   for p in sorted(node.log_dir.glob(f"default_{pod}_*/{container}/*.log")))
