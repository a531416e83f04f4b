"""Applying rendered RBAC (and what it binds to) on the RBAC-enforcing API server, the way each test needs it."""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException

from nodewarm.controller.kube import Kube, Resource

KINDS = {
    "Namespace": Resource("", "v1", "namespaces", "Namespace"),
    "ServiceAccount": Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True),
    "ClusterRole": Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole"),
    "ClusterRoleBinding": Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding"),
    "Role": Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", namespaced=True),
    "RoleBinding": Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", namespaced=True),
}

def apply_replacing(admin_k: Kube, docs: list[dict]) -> None:
    """Create, or replace what an earlier test left under the same cluster-scoped name (a ClusterRole or
    ClusterRoleBinding bound to another test's ServiceAccount must not decide this test)."""
    for d in docs:
        res = KINDS[d["kind"]]
        ns = d["metadata"].get("namespace")
        try:
            admin_k.create(res, d, ns)
        except ApiException as e:
            if e.status != 409:
                raise
            if d["kind"] != "Namespace":
                cur = admin_k.get(res, d["metadata"]["name"], ns)
                body = {**d, "metadata": {**d["metadata"], "resourceVersion": cur["metadata"]["resourceVersion"]}}
                admin_k.replace(res, d["metadata"]["name"], body, ns)
