"""The engine check's objects (``spec.readiness.engineCheck``): the check pod's PodTemplate, and the Role that lets
the controller create pods from it in the serving namespace. Pure; `nodewarm render` adds them only when enabled.

Why a PodTemplate the controller instantiates, not a pod the agent creates: on AL2023 the agent acts as the node,
and NodeRestriction lets a node create only mirror pods. The controller creates the pod for a node's request
(nodewarm/controller/enginecheck.py) from the live PodTemplate, so what was rendered and applied is what runs.

The pod is the serving pod's vLLM container, not a copy of it: the same ServiceAccount (the serving pod's identity
and nothing more), the same mounts (weights read-only, start script, compile caches, /dev/shm, the start record),
the same requests and limits (GPUs included), the same env plus vLLM's strict AOT mode, the same command and args
handed to the runner after ``--``. What differs, and why:

* the image: the runner (`nodewarm engine-check`) must be in it, so it is engineCheck.image or the publisher's
  (api.warmprofile.engine_check_image), the serving image with nodewarm installed;
* tolerations: the serving pod's (the GPU taint) and the startup taint, nothing else: it must land on a node
  that is not Warm yet, and nowhere else;
* no generation nodeSelector (the node has no generation label before it is Warm) and no node at all here: the
  controller binds each pod to its node by required node affinity on metadata.name, as DaemonSet pods are bound,
  so the scheduler still accounts the GPUs it takes;
* no publisher sidecar and no signing key: the runner never signs; with a publisher its identity may mark a
  bundle that did not load stale (``--uri``), as the publisher's own miss does;
* no init container (the agent asks for the check only once its copy is complete), no probes and no port (the
  runner talks to vLLM on the pod's loopback), ``restartPolicy: Never`` and an ``activeDeadlineSeconds`` a little
  over the timeout, so a hung boot ends; the Result is the container's termination message.

With ``spec.serving.snapshot`` the engine the agent checkpoints must be the serving container exactly (the
snapshot's key compares its name, args, env, working directory, user and image), so the pod runs that container
verbatim, with the serving pod's runtime class and service links, and the runner beside it in observe mode
(``RunnerArgs.observe``): no GPUs, only the compile caches and the start record mounted, the same termination
message. vLLM outlives the runner's answer until the agent checkpoints it (which ends it) or the deadline does.

Nothing here touches a NodePool, a NodeClass or user data: enabling the check drifts no node.
"""

from __future__ import annotations

from nodewarm.api import enginecheck as contract
from nodewarm.api import snapshot
from nodewarm.api.snapshot import CHECKPOINT_TIMEOUT_S
from nodewarm.api.names import CONTROLLER_NAME, CONTROLLER_NAMESPACE, MANAGED_BY, PROFILE_LABEL
from nodewarm.api.podlayout import BASELINE_FILE, CACHE_MOUNT, cache_dirs
from nodewarm.api.warmprofile import WarmProfile, engine_check_image
from nodewarm.instancetypes import InstanceType

from . import servestart, vllm
from .nodepool import startup_taint

# activeDeadlineSeconds over the runner's own timeout: the runner stops vLLM and writes its Result at the timeout;
# the kubelet kills the pod only when that itself hangs.
GRACE_S = 60
# In snapshot mode, past the runner's answer: the vLLM container keeps running until the agent checkpoints it
# (which ends it), so the deadline leaves time for the agent to see the answer and for runc's checkpoint, whose own
# limit is api.snapshot.CHECKPOINT_TIMEOUT_S, plus a minute to see the answer; a checkpoint cut by the deadline is
# lost. If the agent never checkpoints, the deadline is what ends the pod (or the controller's delete once the node
# reported).
CHECKPOINT_S = CHECKPOINT_TIMEOUT_S + 60
# The serving pod's keys that shape what its vLLM container's process sees, and so the snapshot's key: the
# runtime (the snapshot handler) and the env the kubelet adds (service links), the user (pod securityContext).
SERVING_POD_KEYS = ("runtimeClassName", "enableServiceLinks", "securityContext")
# The observing runner only waits, asks once and scans the cache dirs: small requests, so the check pod still fits
# where the serving pod does (whose vLLM container may take the node's whole room, vllm.requests); no limit, so a
# large cache tree's scan is not OOM-killed.
OBSERVER_RESOURCES = {"requests": {"cpu": "50m", "memory": "128Mi"}}


def _labels(p: WarmProfile) -> dict[str, str]:
    return {**contract.labels(p.name), PROFILE_LABEL: p.name, MANAGED_BY: "nodewarm"}


def runner_args(p: WarmProfile, vllm_container: dict, observe: bool = False) -> contract.RunnerArgs:
    """`nodewarm engine-check`'s flags: the vLLM container's command and args after ``--`` (none when it only
    observes that container), the cache layout the agent restored into, and where a miss may be marked (only with a
    publisher: only its identity may write)."""
    d = cache_dirs(CACHE_MOUNT)
    with_record = any(m["name"] == servestart.RECORD_VOLUME for m in vllm_container["volumeMounts"])
    return contract.RunnerArgs(
        port=p.serving.port, served_model_name=p.name, timeout_s=p.readiness.engine_check.timeout_s,
        baseline=f"{CACHE_MOUNT}/{BASELINE_FILE}", vllm_cache_root=str(d["vllm"]), inductor_dir=str(d["inductor"]),
        triton_dir=str(d["triton"]), pch_dir=str(d["pch"]),
        engine=() if observe else (*vllm_container["command"], *vllm_container["args"]),
        cache_uri=p.compile_cache.uri if p.compile_cache.publisher is not None else None,
        start_record=servestart.RECORD_FILE if with_record else None, observe=observe)


def runner_env(p: WarmProfile) -> list[dict]:
    """What the publisher's container adds to vLLM's env: the region (the pod cannot read instance metadata) and
    the node's name."""
    region = [{"name": "AWS_REGION", "value": p.nodes.region},
              {"name": "AWS_DEFAULT_REGION", "value": p.nodes.region}] if p.nodes.region else []
    return [*region, {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]


def env(p: WarmProfile, vllm_container: dict) -> list[dict]:
    """vLLM's env, its strict mode, and the runner's own (runner_env)."""
    strict = [{"name": k, "value": v} for k, v in contract.STRICT_ENV.items()]
    return [*vllm_container["env"], *strict, *runner_env(p)]


def tolerations(p: WarmProfile, serving: dict) -> list[dict]:
    taint = startup_taint(p)
    return [*serving["tolerations"], {"key": taint["key"], "operator": "Exists", "effect": taint["effect"]}]


def _runner(p: WarmProfile, args: contract.RunnerArgs, env: list[dict], resources: dict,
            mounts: list[dict]) -> dict:
    return {
        "name": contract.CONTAINER,
        "image": engine_check_image(p),
        "command": ["nodewarm", "engine-check"],
        "args": args.to_argv(),
        "env": env,
        "resources": resources,
        "volumeMounts": mounts,
        "terminationMessagePath": contract.TERMINATION_LOG,
        "terminationMessagePolicy": "File",
    }


def _containers(p: WarmProfile, c: dict) -> list[dict]:
    """The runner booting vLLM itself; in snapshot mode, the serving container verbatim and the runner observing
    it, with only what it judges from mounted: the compile caches (and the baseline in them) and the start record."""
    if not p.serving.snapshot:
        return [_runner(p, runner_args(p, c), env(p, c), c["resources"], c["volumeMounts"])]
    assert c["name"] == snapshot.CONTAINER, c["name"]      # the snapshot store's slot is this container's name
    mounts = [m for m in c["volumeMounts"] if m["mountPath"] == CACHE_MOUNT or m["name"] == servestart.RECORD_VOLUME]
    # Its pod's namespace, for the message that says where vLLM's log is (the runner cannot read it).
    ns = [{"name": contract.NAMESPACE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
    return [c, _runner(p, runner_args(p, c, observe=True), [*runner_env(p), *ns], OBSERVER_RESOURCES, mounts)]


def pod_spec(p: WarmProfile, types: dict[str, InstanceType] | None = None) -> dict:
    """The check pod's spec, from the serving pod's (vllm.pod_spec)."""
    serving = vllm.pod_spec(p, types)
    containers = _containers(p, serving["containers"][0])
    mounted = {m["name"] for c in containers for m in c["volumeMounts"]}
    spec: dict = {}
    if "serviceAccountName" in serving:
        spec["serviceAccountName"] = serving["serviceAccountName"]
    deadline = p.readiness.engine_check.timeout_s + GRACE_S
    if p.serving.snapshot:
        spec.update({k: serving[k] for k in SERVING_POD_KEYS if k in serving})
        deadline += CHECKPOINT_S
    spec.update({
        "restartPolicy": "Never",
        "activeDeadlineSeconds": deadline,
        "tolerations": tolerations(p, serving),
        "containers": containers,
        "volumes": [v for v in serving["volumes"] if v["name"] in mounted],
    })
    return spec


def pod_template(p: WarmProfile, types: dict[str, InstanceType] | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": contract.template_name(p.name), "namespace": p.serving.namespace,
                         "labels": _labels(p)},
            "template": {"metadata": {"labels": contract.labels(p.name)}, "spec": pod_spec(p, types)}}


# Exactly what the controller does in the serving namespace for the check: create the pod from the template, find
# a node's pods, delete them once answered. Nothing cluster-wide: its ClusterRole has no pods.
RULES = ({"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]},)


def controller_rbac(p: WarmProfile, controller_namespace: str = CONTROLLER_NAMESPACE) -> list[dict]:
    """The Role and RoleBinding (serving namespace) for the controller's ServiceAccount in ``controller_namespace``
    (where it is installed: the Helm release's namespace)."""
    name = f"{CONTROLLER_NAME}-{contract.template_name(p.name)}"
    meta = {"name": name, "namespace": p.serving.namespace, "labels": _labels(p)}
    rules = [dict(r) for r in RULES] + [{"apiGroups": [""], "resources": ["podtemplates"], "verbs": ["get"],
                                         "resourceNames": [contract.template_name(p.name)]}]
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": dict(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER_NAME, "namespace": controller_namespace}]},
    ]


def agent_rbac(p: WarmProfile) -> list[dict]:
    """Where the agent is a DaemonSet (Auto Mode, Bottlerocket) it is a ServiceAccount, not the node: it follows its
    node's check pod with a list and a watch in the serving namespace (a Role there), as it follows the image
    pre-pull pod in its own. The AL2023 host agent acts as the node, whose Node authorizer already allows it."""
    if not p.uses_daemonset:
        return []
    from nodewarm.userdata.daemonset import NAME as AGENT

    name = f"{AGENT}-{contract.template_name(p.name)}"
    meta = {"name": name, "namespace": p.serving.namespace, "labels": _labels(p)}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": dict(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": AGENT, "namespace": p.bootstrap.namespace}]},
    ]


def manifests(p: WarmProfile, types: dict[str, InstanceType] | None = None,
              controller_namespace: str = CONTROLLER_NAMESPACE) -> list[dict]:
    """What `nodewarm render` adds for the engine check: nothing unless spec.readiness.engineCheck.enabled."""
    if not p.readiness.engine_check.enabled:
        return []
    return [*controller_rbac(p, controller_namespace), *agent_rbac(p), pod_template(p, types)]
