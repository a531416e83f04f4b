"""The bootstrap as a privileged DaemonSet: the launcher where user data cannot carry it.

EKS Auto Mode accepts no user data and Bottlerocket has no shell, so there the warm-up runs in a pod on each
node of the NodePool. Its one container is the agent: it reads the WarmProfile at start, warms, reports the
condition on its own Node's status, and keeps following the profile so a serving or model change is warmed
on the nodes that already serve (no node replaced).
It tolerates only the readiness taint and GPU taints: the startup taint that nodewarm's controller lifts
keeps vLLM away while this pod alone may land. Its RBAC cannot touch taints: no `patch nodes`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from .errors import UserDataInvalid
from .launch import BootstrapLaunch

NAME = "nodewarm-bootstrap"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
GPU_TAINT_KEYS = ("nvidia.com/gpu",)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def manifests(
    launch: BootstrapLaunch,
    *,
    nodepool: str,
    image: str,
    readiness_taint_key: str,
    namespace: str = "nodewarm-system",
    gpu_taint_keys: Sequence[str] = GPU_TAINT_KEYS,
    service_account_annotations: Mapping[str, str] | None = None,
) -> list[dict]:
    """ServiceAccount, ClusterRole, ClusterRoleBinding and DaemonSet for one NodePool, in apply order.

    ``image`` must have ``nodewarm`` and ``python3`` on PATH. ``service_account_annotations`` carries an
    IRSA role (``eks.amazonaws.com/role-arn``) when Pod Identity is not used; the pod reads S3 with it.
    The namespace must exist.
    """
    ds_name = f"{NAME}-{nodepool}"
    if not _DNS_LABEL.match(nodepool) or len(ds_name) > 63:
        raise UserDataInvalid(f"NodePool name {nodepool!r} cannot name the DaemonSet {ds_name!r}: it must be a DNS "
                              f"label of at most {63 - len(NAME) - 1} characters")
    if not _DNS_LABEL.match(namespace):
        raise UserDataInvalid(f"namespace {namespace!r} is not a DNS label")
    selector = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/instance": nodepool}
    labels = {**selector, "app.kubernetes.io/managed-by": "nodewarm"}
    service_account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": NAME, "namespace": namespace, "labels": {"app.kubernetes.io/name": NAME},
                     "annotations": dict(service_account_annotations or {})},
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": NAME}},
        # Read its Node, write its condition. RBAC cannot scope this to "own node"; it is still far less than
        # the controller's taint removal (patch nodes), which this identity must never have.
        "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
            # The agent resolves model, serving and compile-cache settings from its WarmProfile at boot and
            # follows it: exactly get and watch.
            {"apiGroups": ["nodewarm.io"], "resources": ["warmprofiles"], "verbs": ["get", "watch"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{NAME}:{namespace}", "labels": {"app.kubernetes.io/name": NAME}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}],
    }
    cache = {"name": "nvme", "mountPath": launch.cache_mount, "mountPropagation": "HostToContainer"}
    # No region: pods on Auto Mode cannot reach instance metadata; the agent reads its Node's
    # topology.kubernetes.io/region label (or the profile's spec.nodes.region).
    env = [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    tolerations = [{"key": readiness_taint_key, "operator": "Exists"}]
    tolerations += [{"key": key, "operator": "Exists"} for key in gpu_taint_keys]
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": ds_name, "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": NAME,
                    "nodeSelector": {NODEPOOL_LABEL: nodepool, "kubernetes.io/os": "linux"},
                    "tolerations": tolerations,
                    "containers": [{
                        "name": "agent",
                        "image": image,
                        "command": ["nodewarm"],
                        "args": launch.bootstrap_argv(),
                        "env": env,
                        # Bottlerocket's SELinux policy lets only privileged containers write host paths.
                        "securityContext": {"privileged": True},
                        "volumeMounts": [cache],
                        # Its request stays reserved for the pod's life: keep it small so it never takes room
                        # meant for vLLM.
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                    }],
                    "volumes": [{
                        "name": "nvme",
                        # Directory, not DirectoryOrCreate: without the RAID mount the pod must not start and
                        # fill the root volume with weights; it stays Pending with a clear hostPath event.
                        "hostPath": {"path": launch.cache_mount, "type": "Directory"},
                    }],
                },
            },
        },
    }
    return [service_account, role, binding, daemonset]
