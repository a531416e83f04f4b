"""Device plugins phase -> condition DevicePluginsTolerate: the device plugins that must run on a warming node, and
whether they can (``check`` is pure: DaemonSet objects in, a verdict out; ``reconcile`` is the phase).

The vLLM pod requests ``nvidia.com/gpu``; a node advertises that resource only once a device plugin registered
with its kubelet. Device plugins run as DaemonSets, and a DaemonSet pod is kept off a node by any NoSchedule
taint it does not tolerate (the DaemonSet controller adds tolerations only for the node lifecycle taints). The
NVIDIA device plugin usually tolerates ``nvidia.com/gpu`` and nothing else, so on a node still carrying
nodewarm's startup taint it does not start, the node advertises no GPU until the taint lifts, and the vLLM pod
that the lift let in waits a second time (device plugin image pull, start, registration).

Which DaemonSets count as device plugins (the rule, in order):

1. the pod template mounts the hostPath ``/var/lib/kubelet/device-plugins`` (or a path under it): every device
   plugin must, because its registration socket (``kubelet.sock``) and its own socket live there. That covers
   the NVIDIA plugin however it was installed (Helm chart, GPU operator, EKS add-on, a renamed copy);
2. failing that, a container name or image that says ``device-plugin`` (``nvidia-device-plugin``,
   ``k8s-device-plugin``): a plugin that reaches the socket another way (a broader hostPath such as
   ``/var/lib/kubelet``) is still recognised.

A device plugin does not *request* ``nvidia.com/gpu``, it advertises it, so its resources say nothing.

Which nodes it may run on: its ``nodeSelector`` and required node affinity, checked against what the profile's
nodes are known to carry before they are warm (the NodePool label, the OS, the instance types the profile
allows). A term on a label nodewarm cannot know in advance (``nvidia.com/gpu.present``, set by GPU feature
discovery) counts as matching: only a DaemonSet that provably never runs on these nodes is left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nodewarm.nodeclasses import deviceplugin
from nodewarm.api.names import INSTANCE_TYPE_LABEL
from nodewarm.nodeclasses.nodepool import startup_taint
from nodewarm.api.views import Condition
from nodewarm.api.warmprofile import WarmProfile

from ..profiles import ProfileView
from ..shared import Manager
from .conditions import Step, warning

DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
NAME_HINTS = ("device-plugin",)
CONDITION = "DevicePluginsTolerate"


@dataclass(frozen=True)
class DaemonSetView:
    """What the controller keeps of a DaemonSet: only device plugins keep their scheduling fields."""

    namespace: str
    name: str
    device_plugin: bool
    node_selector: tuple[tuple[str, str], ...] = ()
    affinity_terms: tuple[tuple[dict, ...], ...] = ()   # required nodeSelectorTerms, each its matchExpressions
    tolerations: tuple[tuple[tuple[str, str], ...], ...] = ()
    resource_version: str = field(default="", compare=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_obj(cls, o: dict) -> "DaemonSetView":
        md = o["metadata"]
        spec = (((o.get("spec") or {}).get("template") or {}).get("spec")) or {}
        if not is_device_plugin(spec):
            return cls(md.get("namespace", ""), md["name"], False, resource_version=md.get("resourceVersion", ""))
        req = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
               .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        terms = tuple(tuple(t.get("matchExpressions") or ()) for t in req.get("nodeSelectorTerms") or ())
        tols = tuple(tuple(sorted((k, str(v)) for k, v in t.items() if v is not None)) for t in spec.get("tolerations") or ())
        return cls(md.get("namespace", ""), md["name"], True, tuple(sorted((spec.get("nodeSelector") or {}).items())),
                   terms, tols, md.get("resourceVersion", ""))


def daemonset_key(o: dict) -> str:
    return f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}"


def _norm(path: str) -> str:
    return "/" + "/".join(p for p in str(path).split("/") if p)


def is_device_plugin(pod_spec: dict) -> bool:
    """The rule in the module doc: the device-plugins hostPath, else a container name or image naming one."""
    for vol in pod_spec.get("volumes") or ():
        path = (vol.get("hostPath") or {}).get("path")
        if path and (_norm(path) + "/").startswith(DEVICE_PLUGIN_DIR + "/"):
            return True
    for c in [*(pod_spec.get("initContainers") or ()), *(pod_spec.get("containers") or ())]:
        text = f"{c.get('name', '')} {c.get('image', '')}".lower()
        if any(h in text for h in NAME_HINTS):
            return True
    return False


def tolerates(tolerations, taint: dict) -> bool:
    """Kubernetes' toleration match: an empty key with Exists tolerates everything; an empty effect any effect;
    Exists any value, Equal (the default) the taint's value."""
    for t in tolerations:
        t = dict(t)
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t["key"] != taint["key"]:
            continue
        if op == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def known_labels(p: WarmProfile) -> dict[str, set[str]]:
    """Labels the profile's nodes carry before they are warm, each with the values it may have."""
    out = {"karpenter.sh/nodepool": {p.nodes.node_pool}, "kubernetes.io/os": {"linux"}}
    if p.nodes.instance_types:
        out[INSTANCE_TYPE_LABEL] = set(p.nodes.instance_types)
    return out


def _expr_may_match(expr: dict, known: dict[str, set[str]]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", ""), set(expr.get("values") or ())
    if key not in known:
        return True                       # a label we cannot know in advance: assume it may match
    have = known[key]
    if op == "In":
        return bool(have & values)
    if op == "NotIn":
        return bool(have - values)
    if op == "Exists":
        return True
    if op == "DoesNotExist":
        return False
    return True                           # Gt/Lt on our labels: not worth guessing


def may_run_on(ds: DaemonSetView, p: WarmProfile) -> bool:
    known = known_labels(p)
    for k, v in ds.node_selector:
        if k in known and v not in known[k]:
            return False
    if ds.affinity_terms:
        # Terms are ORed, expressions in a term ANDed; an empty term matches nothing.
        return any(term and all(_expr_may_match(e, known) for e in term) for term in ds.affinity_terms)
    return True


def toleration(p: WarmProfile) -> dict:
    """What a device plugin needs to start on a warming node (what `render --device-plugin-patch` adds)."""
    return deviceplugin.toleration(p.readiness.taint_key)


@dataclass(frozen=True)
class Verdict:
    condition: Condition
    plugins: tuple[str, ...]        # namespace/name of the device plugins that may run on the profile's nodes
    missing: tuple[str, ...]        # ... of those, the ones that do not tolerate the startup taint


def check(daemonsets, p: WarmProfile) -> Verdict:
    taint = startup_taint(p)
    plugins = sorted((d for d in daemonsets if d.device_plugin and may_run_on(d, p)), key=lambda d: d.key)
    missing = tuple(d.key for d in plugins if not tolerates(d.tolerations, taint))
    names = tuple(d.key for d in plugins)
    tol = toleration(p)
    if missing:
        return Verdict(Condition(
            CONDITION, "False", "MissingToleration",
            f"device plugin DaemonSet{'s' if len(missing) > 1 else ''} {', '.join(missing)} (mounting "
            f"{DEVICE_PLUGIN_DIR}) may run on NodePool {p.nodes.node_pool}'s nodes but do"
            f"{'es' if len(missing) == 1 else ''} not tolerate the startup taint {taint['key']}:NoSchedule: on a "
            "warming node it cannot start, so the node advertises no nvidia.com/gpu until the taint lifts and the "
            f"vLLM pod waits a second time. Add the toleration {{key: {tol['key']}, operator: Exists, effect: "
            f"NoSchedule}}: `nodewarm render -f PROFILE --device-plugin-patch {missing[0]}` prints the patch"),
            tuple(names), missing)
    if names:
        return Verdict(Condition(CONDITION, "True", "Tolerated",
                                 f"device plugin DaemonSet{'s' if len(names) > 1 else ''} {', '.join(names)} "
                                 f"tolerate{'s' if len(names) == 1 else ''} {taint['key']}: nodes advertise "
                                 "nvidia.com/gpu while they warm"), tuple(names), ())
    return Verdict(Condition(CONDITION, "Unknown", "NoDevicePluginFound",
                             f"no DaemonSet mounting {DEVICE_PLUGIN_DIR} may run on NodePool {p.nodes.node_pool}'s "
                             "nodes: nothing in the cluster advertises nvidia.com/gpu to them yet (EKS Auto Mode "
                             "runs its own, outside the cluster's DaemonSets); install the NVIDIA device plugin with "
                             f"the toleration {{key: {tol['key']}, operator: Exists, effect: NoSchedule}}"), (), ())


def reconcile(mgr: Manager, view: ProfileView | None, p: WarmProfile) -> Step | None:
    """The verdict for the profile's nodes: its condition, a Warning event when that changes, a metric, a log line."""
    if not mgr.daemonsets.synced.is_set():
        return None          # not listed (yet, or no RBAC for it): no verdict rather than a false one
    verdict = check(list(mgr.daemonsets.store.values()), p)
    mgr.metrics.device_plugins_missing.labels(p.name).set(len(verdict.missing))
    if not verdict.missing:
        return Step(verdict.condition)
    mgr.log.warning("device_plugins.missing_toleration", profile=p.name, daemonsets=list(verdict.missing),
                    taint=p.readiness.taint_key)
    return Step(verdict.condition, events=warning(view, verdict.condition))
