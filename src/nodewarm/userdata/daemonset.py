"""The bootstrap as a DaemonSet: the launcher where user data cannot carry it.

EKS Auto Mode accepts no user data and Bottlerocket has no shell, so there the warm-up runs in a pod on each
node of the NodePool. Its one container is the agent: it reads the WarmProfile at start, warms, reports on its
own Node, and keeps following the profile so a serving or model change is warmed on the nodes that already
serve (no node replaced). It tolerates only the readiness taint and GPU taints: the startup taint that
nodewarm's controller lifts keeps vLLM away while this pod alone may land.

Least privilege, and one node only:
* it lives in its own namespace (``nodewarm-system``), the only one labelled for Pod Security ``privileged``
  (a hostPath volume needs it); the serving namespace is never relaxed;
* its container is not privileged: it writes only under the NVMe mount (hostPath), and Bottlerocket's SELinux
  policy labels /mnt ``local_t``, which unprivileged containers may write (docs/agent.md, "Bottlerocket and SELinux");
* it writes only through ``nodes/status``: one patch carries its condition, labels and annotations, and the API
  server resets ``spec`` on that subresource, so this identity can never touch a taint (no ``patch nodes``);
* RBAC cannot say "its own node", so ``admission_policy`` renders a ValidatingAdmissionPolicy that compares the
  node name bound into the pod's ServiceAccount token with the Node being written (Kubernetes >= 1.30).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from nodewarm.api.agentpod import DOWNWARD_ENV, NAME, daemonset_name
from nodewarm.api.defaults import default

from .errors import UserDataInvalid
from .launch import BootstrapLaunch

PREPULL_ROLE = f"{NAME}-image-prepull"
# The agent's state folder (its agent-result.json) in the pod: its root filesystem is read-only and the host's
# /var/lib/nodewarm is not its to write, so the result lives in the pod's /tmp (an emptyDir) for the pod's life;
# the Node's condition and annotations carry what the cluster needs.
STATE_DIR = "/tmp/nodewarm"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
GPU_TAINT_KEYS = ("nvidia.com/gpu",)
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
OWN_PREFIX = "nodewarm.io/"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

# The agent's own node only: the token's bound node (userInfo.extra, set by the API server for tokens bound to
# a pod since Kubernetes 1.30) must name the Node written; a token without one is refused.
OWN_NODE = (f"'{NODE_NAME_EXTRA}' in request.userInfo.extra && "
            f"request.userInfo.extra['{NODE_NAME_EXTRA}'].exists(n, n == object.metadata.name)")


def _only_own_keys(field: str) -> str:
    """Labels/annotations outside nodewarm.io/ are neither added, changed nor removed."""
    new = f"(has(object.metadata.{field}) ? object.metadata.{field} : {{}})"
    old = f"(has(oldObject.metadata.{field}) ? oldObject.metadata.{field} : {{}})"
    return (f"{new}.all(k, k.startsWith('{OWN_PREFIX}') || (k in {old} && {old}[k] == {new}[k])) && "
            f"{old}.all(k, k.startsWith('{OWN_PREFIX}') || k in {new})")


def admission_policy(namespace: str) -> list[dict]:
    """ValidatingAdmissionPolicy + binding (admissionregistration.k8s.io/v1, Kubernetes >= 1.30)."""
    user = f"system:serviceaccount:{namespace}:{NAME}"
    policy_name = f"{NAME}-own-node"
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": policy_name, "labels": {"app.kubernetes.io/name": NAME}},
         "spec": {
             "failurePolicy": "Fail",
             "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                                                     "resources": ["nodes", "nodes/status"]}]},
             "matchConditions": [{"name": "nodewarm-agent", "expression": f"request.userInfo.username == '{user}'"}],
             "validations": [
                 {"expression": OWN_NODE, "reason": "Forbidden",
                  "message": "the nodewarm agent may only write the Node its pod runs on (token node-name)"},
                 {"expression": _only_own_keys("labels"), "reason": "Forbidden",
                  "message": f"the nodewarm agent may only change {OWN_PREFIX}* labels"},
                 {"expression": _only_own_keys("annotations"), "reason": "Forbidden",
                  "message": f"the nodewarm agent may only change {OWN_PREFIX}* annotations"},
             ],
         }},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": policy_name, "labels": {"app.kubernetes.io/name": NAME}},
         "spec": {"policyName": policy_name, "validationActions": ["Deny"]}},
    ]


def namespace_doc(namespace: str) -> dict:
    # hostPath volumes are forbidden from the "baseline" level up: only this namespace is privileged.
    level = "privileged"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": {
        "pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/warn": level,
        "pod-security.kubernetes.io/audit": level, "app.kubernetes.io/managed-by": "nodewarm"}}}


def manifests(
    launch: BootstrapLaunch,
    *,
    nodepool: str,
    image: str,
    readiness_taint_key: str,
    namespace: str = default("bootstrap.namespace"),
    gpu_taint_keys: Sequence[str] = GPU_TAINT_KEYS,
    service_account_annotations: Mapping[str, str] | None = None,
    with_admission_policy: bool = True,
) -> list[dict]:
    """Namespace, ServiceAccount, ClusterRole, ClusterRoleBinding, the Role and RoleBinding that let it watch the
    image pre-pull pod, the admission policy and the DaemonSet for one NodePool, in apply order.

    ``image`` must have ``nodewarm`` and ``python3`` on PATH. ``service_account_annotations`` carries an IRSA role
    (``eks.amazonaws.com/role-arn``); with Pod Identity the association names this ServiceAccount instead.
    """
    ds_name = daemonset_name(nodepool)
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
        "metadata": {"name": NAME, "namespace": namespace, "labels": {"app.kubernetes.io/name": NAME}},
    }
    if service_account_annotations:
        # Only when there are some: an empty map is never stored, so re-applying it would rewrite the object.
        service_account["metadata"]["annotations"] = dict(service_account_annotations)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": NAME, "labels": {"app.kubernetes.io/name": NAME}},
        "rules": [
            # Read its Node (region label, its own condition); write only through the status subresource.
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
            # Its settings: exactly get and watch on WarmProfiles.
            {"apiGroups": ["nodewarm.io"], "resources": ["warmprofiles"], "verbs": ["get", "watch"]},
            # Which generations still run on its node before it frees their weights (field selector on its node).
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{NAME}:{namespace}", "labels": {"app.kubernetes.io/name": NAME}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}],
    }
    # It waits for the image pre-pull pod on its node (nodewarm.nodeclasses.prepull) with a watch: in its own namespace
    # only, where that pod lives, not on every pod of the cluster.
    prepull_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": PREPULL_ROLE, "namespace": namespace, "labels": {"app.kubernetes.io/name": NAME}},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}],
    }
    prepull_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": PREPULL_ROLE, "namespace": namespace, "labels": {"app.kubernetes.io/name": NAME}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": PREPULL_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}],
    }
    cache = {"name": "nvme", "mountPath": launch.cache_mount, "mountPropagation": "HostToContainer"}
    # No region: pods on Auto Mode cannot reach instance metadata; the agent reads its Node's
    # topology.kubernetes.io/region label (or the profile's spec.nodes.region). Its node, and its own pod: that pod
    # mounts the whole NVMe root, and the agent must not count it as a user of the models there
    # (bootstrap/modelcache/plan.py).
    env = [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}} for name, path in DOWNWARD_ENV]
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
                        "args": [*launch.bootstrap_argv(), "--state-dir", STATE_DIR],
                        "env": env,
                        # Root (it owns the files it writes under the mount), but no capability, no escalation,
                        # a read-only image: hostPath write under the NVMe mount is all it needs.
                        "securityContext": {"privileged": False, "allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True, "runAsUser": 0,
                                            "capabilities": {"drop": ["ALL"]},
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                        "volumeMounts": [cache, {"name": "tmp", "mountPath": "/tmp"}],
                        # Its request stays reserved for the pod's life: keep it small so it never takes room
                        # meant for vLLM.
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                    }],
                    "volumes": [
                        # Directory, not DirectoryOrCreate: without the RAID mount the pod must not start and
                        # fill the root volume with weights; it stays Pending with a clear hostPath event.
                        {"name": "nvme", "hostPath": {"path": launch.cache_mount, "type": "Directory"}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }
    policy = admission_policy(namespace) if with_admission_policy else []
    return [namespace_doc(namespace), service_account, role, binding, prepull_role, prepull_binding, *policy,
            daemonset]
