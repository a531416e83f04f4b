"""The controller's ServiceAccount, least-privilege RBAC and Deployment, as plain dicts (pure).

What it may do, and why each rule exists:
* nodes: get/list/watch (link NodeClaims by providerID, read the Warm condition) and patch (lift the
  readiness taint, label the node, record its state). No update/delete: it never replaces or removes nodes.
* nodeclaims: get/list/watch, and delete (``onDeadline: replace`` is "delete the NodeClaim so Karpenter
  launches another"). No patch: NodeClaims are Karpenter's.
* nodepools, ec2nodeclasses, Auto Mode nodeclasses: get/list/watch + patch (server-side apply, never forced,
  of the startup taint / RAID0 + user data / ephemeral storage size). No create: render creates them.
* warmprofiles: get/list/watch, patch (its finalizer, so a deleted profile's startup taint is cleaned up);
  warmprofiles/status: patch (the Injected condition and what was injected).
* daemonsets (apps): get/list/watch, read only: finds the device plugins that must start on a warming node and
  reports on the WarmProfile when they do not tolerate its startup taint (warmprofile/deviceplugins.py).
* events: create, in the ``default`` namespace only (where events about cluster-scoped objects go).
* leases: in the controller's own namespace only (leader election).
* pods: nowhere here. A profile with ``readiness.engineCheck`` renders a Role in its serving namespace that lets the
  controller create, find and delete the check pods there and read their PodTemplate
  (nodewarm/nodeclasses/enginecheck.py), so it touches pods only where a profile asks.
* secrets, roles, rolebindings: nowhere here either. A profile with spec.weights.peers renders a Role in its
  spec.bootstrap.namespace for the key Secret and who may read it (nodewarm/nodeclasses/peeraccess.py says why
  nothing cluster-wide).

Besides: a Service in front of the replicas' ``metrics`` port (what a Prometheus scrape or a ServiceMonitor
selects) and the ServiceMonitor itself (for the Prometheus Operator; the Helm chart renders it only with
serviceMonitor.enabled, since its CRD may be absent). ``nodewarm/controller/install.py`` writes the Helm chart
(deploy/helm/nodewarm) from these functions and ``nodewarm.api.schema.crd()``: they are its one source.
"""

from __future__ import annotations

from nodewarm.api.names import CONTROLLER_NAME, CONTROLLER_NAMESPACE

NAME = CONTROLLER_NAME


def _rule(groups, resources, verbs, names=None) -> dict:
    r = {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}
    if names:
        r["resourceNames"] = list(names)
    return r


def cluster_rules() -> list[dict]:
    read = ["get", "list", "watch"]
    return [
        _rule([""], ["nodes"], read + ["patch"]),
        _rule(["karpenter.sh"], ["nodeclaims"], read + ["delete"]),
        _rule(["karpenter.sh"], ["nodepools"], read + ["patch"]),
        _rule(["karpenter.k8s.aws"], ["ec2nodeclasses"], read + ["patch"]),
        _rule(["eks.amazonaws.com"], ["nodeclasses"], read + ["patch"]),
        _rule(["nodewarm.io"], ["warmprofiles"], read + ["patch"]),
        _rule(["nodewarm.io"], ["warmprofiles/status"], ["patch"]),
        _rule(["apps"], ["daemonsets"], read),
    ]


def rbac(namespace: str = CONTROLLER_NAMESPACE, events_namespace: str = "default") -> list[dict]:
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "nodewarm"}
    sa = {"kind": "ServiceAccount", "name": NAME, "namespace": namespace}
    meta = lambda ns=None, name=NAME: {"name": name, **({"namespace": ns} if ns else {}), "labels": labels}  # noqa: E731
    role_ref = lambda kind, name=NAME: {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}  # noqa: E731
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(namespace)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta(),
         "rules": cluster_rules()},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta(),
         "roleRef": role_ref("ClusterRole"), "subjects": [sa]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(namespace, f"{NAME}-leader"),
         "rules": [_rule(["coordination.k8s.io"], ["leases"], ["get", "create", "update"])]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(namespace, f"{NAME}-leader"),
         "roleRef": role_ref("Role", f"{NAME}-leader"), "subjects": [sa]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(events_namespace, f"{NAME}-events"),
         "rules": [_rule([""], ["events"], ["create"])]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": meta(events_namespace, f"{NAME}-events"), "roleRef": role_ref("Role", f"{NAME}-events"),
         "subjects": [sa]},
    ]


def deployment(image: str, namespace: str = CONTROLLER_NAMESPACE, replicas: int = 2, metrics_port: int = 8080,
               health_port: int = 8081, extra_args: tuple[str, ...] = ()) -> dict:
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "nodewarm"}
    args = ["controller", "--leader-elect", f"--lease-namespace={namespace}", f"--metrics-port={metrics_port}",
            f"--health-port={health_port}", *extra_args]
    probe = lambda path: {"httpGet": {"path": path, "port": "health"}, "periodSeconds": 10}  # noqa: E731
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": NAME,
                    # Spread the two replicas so losing one node never loses both.
                    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                   "whenUnsatisfiable": "ScheduleAnyway",
                                                   "labelSelector": {"matchLabels": {"app.kubernetes.io/name": NAME}}}],
                    # It must never wait for a GPU node: it is what makes GPU nodes schedulable.
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]}]}}},
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "controller", "image": image, "command": ["nodewarm"], "args": args,
                        "ports": [{"name": "metrics", "containerPort": metrics_port},
                                  {"name": "health", "containerPort": health_port}],
                        "livenessProbe": probe("/healthz"), "readinessProbe": probe("/readyz"),
                        # bench/controller.py --fleet 5000: peak RSS 119 MiB for 5,000 realistic Nodes + NodeClaims
                        # (67 MiB of it the interpreter and client); ~11 KiB more per Node+NodeClaim after that.
                        # The request covers that fleet; the limit leaves room for ~15,000 nodes.
                        "resources": {"requests": {"cpu": "100m", "memory": "160Mi"}, "limits": {"memory": "256Mi"}},
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}},
                    }],
                },
            },
        },
    }


def metrics_service(namespace: str = CONTROLLER_NAMESPACE, metrics_port: int = 8080) -> dict:
    """A ClusterIP Service over every replica's ``metrics`` port (each replica serves /metrics, leader or not)."""
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "nodewarm"}
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{NAME}-metrics", "namespace": namespace, "labels": labels},
        "spec": {"selector": {"app.kubernetes.io/name": NAME},
                 "ports": [{"name": "metrics", "port": metrics_port, "targetPort": "metrics", "protocol": "TCP"}]},
    }


def service_monitor(namespace: str = CONTROLLER_NAMESPACE) -> dict:
    """The Prometheus Operator's ServiceMonitor for :func:`metrics_service` (needs monitoring.coreos.com/v1)."""
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "nodewarm"}
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": {"name": NAME, "namespace": namespace, "labels": labels},
        "spec": {"selector": {"matchLabels": dict(labels)}, "namespaceSelector": {"matchNames": [namespace]},
                 "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}]},
    }


def render(image: str, namespace: str = CONTROLLER_NAMESPACE, replicas: int = 2) -> list[dict]:
    """Everything to run the controller, in apply order (Namespace first)."""
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    return [ns, *rbac(namespace), metrics_service(namespace), deployment(image, namespace, replicas)]
