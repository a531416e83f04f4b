"""The node agent's DaemonSet pod on a real node (testenv.realnode), as the demo and the real-node tests see it: what
the runtime adds to a rendered pod spec here, and which of the DaemonSet's pods is the one on a given node."""

from __future__ import annotations

import copy

from nodewarm.api.agentpod import NAME as AGENT
from nodewarm.controller.kube import PODS, Kube

from .kube import S3_SERVICE


def with_env(pod_spec: dict, env: dict[str, str]) -> dict:
    """``pod_spec`` with ``env`` added to every container (init containers too), replacing same-named entries."""
    spec = copy.deepcopy(pod_spec)
    for c in spec.get("initContainers", []) + spec["containers"]:
        kept = [e for e in c.get("env") or () if e["name"] not in env]
        c["env"] = kept + [{"name": k, "value": v} for k, v in env.items()]
    return spec


def s3_env(s3_credentials: dict[str, str]) -> dict[str, str]:
    """What a pod gets here in place of a cluster's Pod Identity agent and S3: the S3 server's credentials and its
    endpoint through the ClusterIP Service that realnode's ``services`` carry (kube.S3_SERVICE)."""
    return {**s3_credentials, "AWS_ENDPOINT_URL": f"http://{S3_SERVICE}"}


def give_s3(rendered: list[dict], s3_credentials: dict[str, str]) -> dict:
    """The rendered agent DaemonSet among ``rendered``, its pod template given ``s3_env`` (in place); returned."""
    ds = next(d for d in rendered if d["kind"] == "DaemonSet" and d["metadata"]["name"].startswith(AGENT))
    tmpl = ds["spec"]["template"]
    tmpl["spec"] = with_env(tmpl["spec"], s3_env(s3_credentials))
    return ds


def on_node(k: Kube, namespace: str, node: str) -> dict | None:
    """The agent DaemonSet's pod bound to ``node``, or None while the DaemonSet controller has made none."""
    pods = k.list(PODS, namespace, labelSelector=f"app.kubernetes.io/name={AGENT}")["items"]
    return next((p for p in pods if p["spec"].get("nodeName") == node), None)
