"""The serving image, pulled by the kubelet while the node warms: one small DaemonSet per WarmProfile.

A vLLM image is 10-20 GB. Pulled only once the startup taint lifts, it adds minutes between Warm and serving.
So every node of the pool gets a pod whose init container ``serving-image`` is the serving image running a
no-op: the kubelet pulls it while the agent pulls weights and restores compile caches, and the agent waits for
that container's status (``imageID`` set, nodewarm.bootstrap.imageprepull) before it reports Warm; both sides name
the pod through nodewarm.api.prepullpod.

* Its own DaemonSet, not an init container of the agent's pod: that would hold the agent back until the image
  is on the node (the three would run one after the other), and on AL2023 the agent is no pod at all.
* Every launcher (AL2023 user data, Bottlerocket, Auto Mode) gets it, in the bootstrap namespace; it selects
  and tolerates what the agent's DaemonSet does: the pool's nodes, the startup taint, GPU taints.
* The image must have ``/bin/true`` (every vLLM image has). Without it the image is still pulled and reported,
  but the pod then restarts its init container forever.
* Nothing to protect, nothing to grant: no ServiceAccount token, no volumes, no privilege, no capability, a
  read-only root. It meets Pod Security ``baseline``; not ``restricted``, which needs runAsNonRoot, because the
  serving image decides its own user.
* The main container is ``pause``, so the pod stays Running (a DaemonSet pod cannot complete) at no cost.
* Not the ``nodewarm.io/profile`` label: the agent takes a pod with that label on its node for a vLLM pod of an
  older generation, and would wait for it to leave before freeing old weights.
* Nothing here reaches a node object, so a serving image change drifts no node: it rolls this DaemonSet only.
"""

from __future__ import annotations

from nodewarm.api.names import GPU_TAINT, MANAGED_BY, NODEPOOL_LABEL
from nodewarm.api.prepullpod import CONTAINER, daemonset_name, selector
from nodewarm.api.warmprofile import WarmProfile

NOOP = ["/bin/true"]
PAUSE_IMAGE = "registry.k8s.io/pause:3.9"


def _container(name: str, image: str, command: list[str] | None) -> dict:
    c = {
        "name": name,
        "image": image,
        "securityContext": {"privileged": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        # Held for the pod's life on a GPU node: it must never take room meant for vLLM.
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "16Mi"}},
    }
    if command:
        c["command"] = command
    return c


def daemonset(p: WarmProfile) -> dict:
    labels = {**selector(p.name), MANAGED_BY: "nodewarm"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": daemonset_name(p.name), "namespace": p.bootstrap.namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": selector(p.name)},
            # A new serving image is pulled on every node at once, not one node after another: the pods serve
            # nothing, so none of them being up costs nothing, and an agent warming the new generation waits on it.
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "automountServiceAccountToken": False,
                    "nodeSelector": {NODEPOOL_LABEL: p.nodes.node_pool, "kubernetes.io/os": "linux"},
                    "tolerations": [{"key": p.readiness.taint_key, "operator": "Exists"},
                                    {"key": GPU_TAINT, "operator": "Exists"}],
                    "initContainers": [_container(CONTAINER, p.serving.image, NOOP)],
                    "containers": [_container("pause", PAUSE_IMAGE, None)],
                },
            },
        },
    }
