"""What the node agent may read in the cluster: its WarmProfile, with exactly `get` and `watch`.

On AL2023 the agent runs on the host with the kubelet's credentials (user ``system:node:<name>``, group
``system:nodes``): the Node authorizer has no opinion on custom resources, so RBAC decides, and this
binding is what lets a booting node read the settings that are deliberately *not* in its user data.
On the DaemonSet path the agent's ServiceAccount gets the same rule (nodewarm/userdata/daemonset.py).
"""

from __future__ import annotations

NAME = "nodewarm-agent"
NODES_GROUP = "system:nodes"
RULE = {"apiGroups": ["nodewarm.io"], "resources": ["warmprofiles"], "verbs": ["get", "watch"]}


def node_rbac() -> list[dict]:
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "nodewarm"}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": NAME, "labels": labels}, "rules": [RULE]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{NAME}:nodes", "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": NODES_GROUP}]},
    ]
