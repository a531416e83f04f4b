"""The node agent's own pod on the DaemonSet path (Auto Mode, Bottlerocket), by the names the renderer gives it and
the agent recognises it by.

The renderer (nodewarm/userdata/daemonset.py) names the agent's DaemonSet ``daemonset_name(nodepool)`` in the
profile's bootstrap namespace and hands its container, through the downward API (``DOWNWARD_ENV``), its node and its
own pod's namespace, name and uid. The agent reads them with ``own_pod`` and recognises its pods by them
(nodewarm/bootstrap/modelcache/plan.py): its pod mounts the whole NVMe root to write the models, which makes it no
user of any of them. On AL2023 the agent is a host service (a systemd unit): it has no pod, ``own_pod`` is None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

NAME = "nodewarm-bootstrap"     # the DaemonSet's prefix, its ServiceAccount and RBAC

NODE_NAME_ENV = "NODE_NAME"
POD_NAMESPACE_ENV = "POD_NAMESPACE"
POD_NAME_ENV = "POD_NAME"
POD_UID_ENV = "POD_UID"
# The agent container's env, each from the pod field the kubelet fills it with (fieldRef.fieldPath).
DOWNWARD_ENV: tuple[tuple[str, str], ...] = (
    (NODE_NAME_ENV, "spec.nodeName"),
    (POD_NAMESPACE_ENV, "metadata.namespace"),
    (POD_NAME_ENV, "metadata.name"),
    (POD_UID_ENV, "metadata.uid"),
)


def daemonset_name(nodepool: str) -> str:
    """The agent's DaemonSet for one NodePool (in the profile's ``spec.bootstrap.namespace``)."""
    return f"{NAME}-{nodepool}"


@dataclass(frozen=True)
class PodRef:
    """One pod, exactly: a pod deleted and made again under the same name has another uid."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def own_pod(env: Mapping[str, str]) -> PodRef | None:
    """The pod this agent runs in, from the env the rendered DaemonSet gives it; None outside a pod (AL2023's unit)
    or when any of the three is missing (then no pod is taken for the agent's own)."""
    ns, name, uid = (env.get(k) or "" for k in (POD_NAMESPACE_ENV, POD_NAME_ENV, POD_UID_ENV))
    return PodRef(ns, name, uid) if ns and name and uid else None
