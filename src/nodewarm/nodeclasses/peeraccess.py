"""What the controller may do for a profile with ``spec.weights.peers``, where the key lives: its bootstrap namespace.

The controller mints the peers' key there, rotates it, and lets each node of the profile read it
(nodewarm/controller/warmprofile/peerkeys.py): read, create, update (rotate) and delete the key Secret; read,
create, update and delete the Role that lets the profile's nodes get it; list the per-node RoleBindings, create,
re-own (update) and delete them. ``get`` on secrets is also what Kubernetes' escalation check asks of whoever
creates a Role granting it, or a RoleBinding to that Role (without the broader ``escalate``/``bind`` verbs). No
list/watch on secrets: the key is read by name. Nothing cluster-wide: Secret names follow profile names, so
resourceNames cannot narrow them, and a ClusterRole would read every Secret in the cluster. `nodewarm render` emits
this Role beside the profile; without it the profile's condition Peers says Forbidden and names it.
"""

from __future__ import annotations

from nodewarm.api.names import CONTROLLER_NAME, CONTROLLER_NAMESPACE
from nodewarm.api.warmprofile import WarmProfile

NAME = f"{CONTROLLER_NAME}-peers"
RULES = (
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "update", "delete"]},
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["get", "create", "update", "delete"]},
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"],
     "verbs": ["list", "create", "update", "delete"]},
)


def controller_rbac(bootstrap_namespace: str, controller_namespace: str = CONTROLLER_NAMESPACE) -> list[dict]:
    """The Role and RoleBinding in ``bootstrap_namespace`` for the controller's ServiceAccount in
    ``controller_namespace`` (the Helm release's namespace). One per bootstrap namespace: profiles sharing one render
    the same two documents."""
    labels = {"app.kubernetes.io/name": CONTROLLER_NAME, "app.kubernetes.io/part-of": "nodewarm"}
    meta = {"name": NAME, "namespace": bootstrap_namespace, "labels": labels}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [dict(r) for r in RULES]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": dict(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
         "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER_NAME, "namespace": controller_namespace}]},
    ]


def manifests(p: WarmProfile, controller_namespace: str = CONTROLLER_NAMESPACE) -> list[dict]:
    """Nothing unless the profile turns peers on: a profile without them renders what it always did."""
    return controller_rbac(p.bootstrap.namespace, controller_namespace) if p.weights.peers.enabled else []
