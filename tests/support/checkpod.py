"""The engine check's pod as the agent meets it, without a controller or a kubelet: once the Node asks (its
nodewarm.io/engine-check Request), the check pod the controller would create for that request on the node, then the
status its kubelet would write (as the node's own identity)."""

from __future__ import annotations

import threading
from pathlib import Path

from nodewarm.api import enginecheck
from nodewarm.controller.kube import NODES, PODS, Kube


def answer(k, kube, p, node: str, containers: list[dict], statuses: list[dict], phase: str, seen: list) -> None:
    """Wait for the Node's request (appended to ``seen``, or "never asked"), create the check pod with
    ``containers`` and give it ``phase`` and ``statuses``."""
    ns = p.serving.namespace
    for _ in range(1200):
        req = enginecheck.read_annotation(
            (k.get(NODES, node)["metadata"].get("annotations") or {}).get(enginecheck.REQUEST_ANNOTATION))
        if isinstance(req, enginecheck.Request):
            break
        threading.Event().wait(0.1)
    else:
        seen.append("never asked")
        return
    seen.append(req)
    name = enginecheck.pod_name(p.name, node, req.id)
    k.create(PODS, {"metadata": {"name": name, "labels": enginecheck.labels(p.name),
                                 "annotations": {enginecheck.REQUEST_ID_ANNOTATION: req.id,
                                                 enginecheck.NODE_ANNOTATION: node}},
                    "spec": {"nodeName": node, "restartPolicy": "Never", "containers": containers}}, ns)
    kubelet = Kube(kube.api_client(kube.node_token(node)))
    kubelet.merge_patch(PODS, name, {"status": {"phase": phase, "containerStatuses": statuses}},
                        sub="status", namespace=ns)


def run_agent(kube, tmp_path: Path, profile: str, node: str, answer=None, args: tuple[str, ...] = ()) -> int:
    """`nodewarm bootstrap run --once` as ``node`` (its kubelet token), its NVMe folder under ``tmp_path``, while
    ``answer()`` (when given) plays the controller and the kubelet in a thread; the agent's exit status."""
    from nodewarm.cli import main
    from support.bootstrap_fixtures import node_kubeconfig

    t = threading.Thread(target=answer, daemon=True) if answer is not None else None
    if t is not None:
        t.start()
    mount = tmp_path / "nvme"
    mount.mkdir(exist_ok=True)
    rc = main(["bootstrap", "run", "--profile", profile, "--mount", str(mount), "--node-name", node,
               "--kubeconfig", str(node_kubeconfig(kube, tmp_path, node)), "--skip-load-check", "--once",
               "--state-dir", str(tmp_path / "state"), *args])
    if t is not None:
        t.join(30)
    return rc
