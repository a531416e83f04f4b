"""The vLLM Deployment and Service, tuned as in the AWS "fast model loading" guide, reading the weights
nodewarm put on the node's NVMe instead of streaming them from S3 again.

(Over 300 lines: the serving pod is sized as one object (its requests, /dev/shm, the streamer's buffer, probes,
args, env, and the publisher sidecar with what it runs as), and those quantities are derived from each other: the
GPUs set the CPU and memory, and the memory bounds the buffer and /dev/shm.)

Deliberate choices:
* ``--load-format=runai_streamer`` with ``concurrency = ceil(sizeGB / chunkSizeGB)`` (the streamer's own default
  for a model without a size); ``distributed`` only when TP > 1 (with TP = 1 it buys nothing, and it needs the V1
  engine).
* no ``--enforce-eager`` unless ``spec.serving.allowEager``: it turns torch.compile off, so the restored compile
  cache would be unused (nodewarm.api.servingspec refuses it, and every flag the profile already sets, in any spelling).
* CPU/memory requests per GPU as in the AWS guide, capped to fit the smallest allowed instance type; a memory-backed
  /dev/shm for NCCL and vLLM's worker queues; the streamer's host buffer bounded by the memory request.
* a startup probe budget from the model size, a liveness probe after it, and a PodDisruptionBudget.
* XDG_CACHE_HOME / TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR on a hostPath on the NVMe mount, where
  the bootstrap restored the caches.
* NO toleration of the readiness taint: the pod must not land before the node is warm. Only the GPU
  taint is tolerated.
* a nodeSelector on ``nodewarm.io/generation``: the node agent labels its Node with the generation it holds
  (nodewarm.api.generation), so a rolling update of the serving image or model puts new pods only on nodes
  already warm for them, and no node is replaced or re-tainted for it.
* each of spec.models is rendered from its view (nodewarm.api.models) by the same functions: its own Deployment,
  Service and PDB, placed by its own Node label instead (``placement``); the start script's ConfigMap and the
  publisher's ServiceAccount are the profile's, shared.
* with ``spec.serving.snapshot``, the first model's pod is set up for the node's runtime handler to restore its vLLM
  container (nodewarm.nodeclasses.snapshot says how and why); the further models' pods are not.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from nodewarm import instancetypes
from nodewarm.api import models
from nodewarm.api.errors import ProfileError
from nodewarm.api.generation import generation
from nodewarm.api.names import GENERATION_LABEL, GPU_TAINT, MANAGED_BY, NODEPOOL_LABEL, PROFILE_LABEL
from nodewarm.api.podlayout import BASELINE_FILE, CACHE_MOUNT, cache_dirs, compile_cache_dir, model_path
from nodewarm.api.servingspec import serving_spec
from nodewarm.api.snapshot import CONTAINER
from nodewarm.api.warmprofile import WarmProfile
from nodewarm.instancetypes import InstanceType
from nodewarm.profile import largest_weights_gb

from . import identity
from . import servestart
from . import snapshot
from .vllmargs import spec_args, vllm_extra_args

GIB = 2**30
MIB = 2**20
AOT_COMPILE_ENV = "VLLM_USE_AOT_COMPILE"


def model_loader_extra_config(p: WarmProfile) -> dict:
    cfg: dict = {} if p.concurrency is None else {"concurrency": p.concurrency}
    if p.serving.tensor_parallel_size > 1:
        cfg["distributed"] = True
    return cfg


# --- CPU, memory, /dev/shm ---------------------------------------------------------------------------------

# The AWS guide requests 12 CPU / 80Gi for its TP=2 pod: per GPU the pod requests, by default.
CPU_PER_GPU_MILLI = 6000
MEMORY_PER_GPU = 40 * GIB
# /dev/shm per GPU. NCCL's SHM transport (GPUs without NVLink/P2P: g4dn/g5/g6/g6e) allocates about 9 MiB per
# channel per peer (its SIMPLE + LL128 + LL buffers); at 8 GPUs and up to 32 channels that is ~2 GiB per GPU,
# and vLLM's shared-memory broadcast queue to its workers adds tens of MiB. 4 GiB leaves the rest as slack.
# It is a ceiling, not a reservation: tmpfs pages count against the pod's memory only once written, and a pod
# over the ceiling is evicted, so it must not be tight. Docker's 64 MiB default is what makes NCCL fail.
SHM_PER_GPU = 4 * GIB
# The publisher sidecar's requests (publisher_container): the same pod must fit the node.
PUBLISHER_CPU_MILLI = 100
PUBLISHER_MEMORY = 256 * MIB


@dataclass(frozen=True)
class PodRequests:
    """The vLLM container's CPU and memory requests."""
    cpu_milli: int
    memory_bytes: int

    def quantities(self) -> dict[str, str]:
        return {"cpu": cpu_quantity(self.cpu_milli), "memory": memory_quantity(self.memory_bytes)}


def cpu_quantity(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def memory_quantity(n: int) -> str:
    return f"{n // GIB}Gi" if n % GIB == 0 else f"{n // MIB}Mi"


def parse_cpu_milli(text: str) -> int:
    """The schema's CPU spellings: "12", "1.5", "500m"."""
    try:
        return int(text[:-1]) if text.endswith("m") else int(Decimal(text) * 1000)
    except (ValueError, InvalidOperation):
        raise ProfileError("spec.serving.resources.cpu", text, 'a CPU quantity such as "12" or "500m"') from None


_MEMORY_UNITS = {"Mi": MIB, "Gi": GIB, "Ti": 2**40, "M": 10**6, "G": 10**9, "T": 10**12}


def parse_memory_bytes(text: str) -> int:
    """The schema's memory spellings: a whole number with Mi/Gi/Ti/M/G/T."""
    for unit in sorted(_MEMORY_UNITS, key=len, reverse=True):
        if text.endswith(unit) and text[:-len(unit)].isdigit():
            return int(text[:-len(unit)]) * _MEMORY_UNITS[unit]
    raise ProfileError("spec.serving.resources.memory", text, "a memory quantity such as 80Gi or 512Mi")


def pod_gpus(p: WarmProfile) -> int:
    spec = serving_spec(p)
    return spec.tp * spec.pp


def system_reserve(it: InstanceType) -> tuple[int, int]:
    """(millicores, bytes) of a node no vLLM pod may count on: EKS's kube-reserved and eviction threshold (about
    0.1 CPU and 1-3 GiB, growing with max pods) plus the DaemonSets on every GPU node (VPC CNI, kube-proxy, the
    NVIDIA device plugin, nodewarm's agent and image pre-pull, usually a log/metrics agent). At least 1 CPU and
    3 GiB; 5% on large nodes, where kube-reserved and per-node agents grow with the node."""
    return max(1000, it.vcpus * 50), max(3 * GIB, it.memory_mib * MIB // 20)


def _room(p: WarmProfile, it: InstanceType) -> tuple[int, int]:
    """What the vLLM container of one pod may request on an otherwise empty node of this type."""
    cpu, mem = system_reserve(it)
    if p.compile_cache.publisher:
        cpu, mem = cpu + PUBLISHER_CPU_MILLI, mem + PUBLISHER_MEMORY
    return it.vcpus * 1000 - cpu, it.memory_mib * MIB - mem


def _sized_types(p: WarmProfile, types: dict[str, InstanceType] | None) -> list[InstanceType]:
    """The allowed types whose vCPUs and memory are known (profile.check refuses unknown names)."""
    if types is None:
        types = instancetypes.lookup(list(p.nodes.instance_types))
    return [types[n] for n in p.nodes.instance_types if n in types and types[n].vcpus and types[n].memory_mib]


def requests(p: WarmProfile, types: dict[str, InstanceType] | None = None) -> PodRequests:
    """Explicit spec.serving.resources, refused when they cannot fit the smallest allowed type; else 6 CPU and
    40Gi per GPU, capped to the pod's share of the smallest type: its room (after system_reserve) times the
    fraction of the node's GPUs the pod takes, so pods that share a node (TP x PP < GPUs) all fit beside each
    other. ``types``: instancetypes.lookup's facts; None looks the allowed types up in the offline table."""
    gpus = pod_gpus(p)
    sized = _sized_types(p, types)
    out: list[int] = []
    for field, text, parse, fmt, per_gpu, dim in (
            ("cpu", p.serving.cpu_request, parse_cpu_milli, cpu_quantity, CPU_PER_GPU_MILLI, 0),
            ("memory", p.serving.memory_request, parse_memory_bytes, memory_quantity, MEMORY_PER_GPU, 1)):
        if text is not None:
            want = parse(text)
            for it in sorted(sized, key=lambda t: _room(p, t)[dim]):
                room = _room(p, it)[dim]
                if want > room:
                    have = f"{it.vcpus} vCPUs" if dim == 0 else f"{memory_quantity(it.memory_mib * MIB)} of memory"
                    raise ProfileError(f"spec.serving.resources.{field}", text,
                                       f"{it.name} has {have}; after the kubelet's reserve and the node's system "
                                       f"DaemonSets{' and the publisher sidecar' if p.compile_cache.publisher else ''}"
                                       f" a vLLM pod can request at most {fmt(room)} there: lower it, or drop "
                                       f"{it.name} from spec.nodes.instanceTypes")
            out.append(want)
            continue
        want = per_gpu * gpus
        for it in sized:
            want = min(want, _room(p, it)[dim] * min(gpus, it.gpus) // it.gpus)
        # Round numbers: whole tenths of a CPU, whole GiB.
        out.append(max(100, want // 100 * 100) if dim == 0 else max(GIB, want // GIB * GIB))
    return PodRequests(*out)


def streamer_memory_limit(memory_bytes: int) -> int:
    """RUNAI_STREAMER_MEMORY_LIMIT: half the container's memory request (see env)."""
    return memory_bytes // 2


def shm_size_bytes(p: WarmProfile, memory_bytes: int) -> int:
    """/dev/shm's sizeLimit: SHM_PER_GPU per GPU, at most a quarter of the memory request (tmpfs pages are the
    pod's memory; with the streamer's half, vLLM keeps at least a quarter whatever /dev/shm holds)."""
    return min(SHM_PER_GPU * pod_gpus(p), memory_bytes // 4 // MIB * MIB)


# --- probes --------------------------------------------------------------------------------------------------

# The startup budget: the kubelet restarts a container whose startup probe runs out, and a restart starts the
# load over, so a budget too small is a restart loop that never serves. Rates are deliberately low.
NVME_LOAD_GBPS = 0.5     # RAID0 NVMe reads several GB/s; the streamer into GPU memory on a busy node is slower
S3_LOAD_GBPS = 0.2       # a cold start streams from S3 first: 1.6 Gbit/s, far below what one pod gets on ENA
COMPILE_BUDGET_S = 900   # torch.compile and CUDA graph capture with a cold compile cache (minutes for big models)
ENGINE_START_S = 120     # imports, NCCL init, KV-cache profiling
STARTUP_PERIOD_S = 10
STARTUP_DELAY_S = 30


def startup_budget_s(p: WarmProfile, types: dict[str, InstanceType] | None = None) -> int:
    """Seconds the startup probe allows: the model read from S3 (a cold start) and from NVMe (both, not the
    larger: a cold start may copy to NVMe before vLLM reads it there), plus compile and engine start. A model
    without a size (a further model not required may leave it out) counts as the largest weights the pod's GPUs can
    serve: too small a budget is a restart loop, too large one only notices a hung start later. ``types``: as for
    requests."""
    size = p.model.size_gb
    if size is None:
        size = largest_weights_gb(p, types if types is not None else instancetypes.lookup(list(p.nodes.instance_types)))
    return math.ceil(size / S3_LOAD_GBPS + size / NVME_LOAD_GBPS + COMPILE_BUDGET_S + ENGINE_START_S)


def probes(p: WarmProfile, types: dict[str, InstanceType] | None = None) -> dict[str, dict]:
    health = {"path": "/health", "port": p.serving.port}
    return {
        "startupProbe": {"httpGet": health, "periodSeconds": STARTUP_PERIOD_S, "timeoutSeconds": 3,
                         "initialDelaySeconds": STARTUP_DELAY_S,
                         "failureThreshold": math.ceil(startup_budget_s(p, types) / STARTUP_PERIOD_S)},
        "readinessProbe": {"httpGet": dict(health), "periodSeconds": 5, "timeoutSeconds": 3},
        # Only after the startup probe passed. A dead engine core leaves the API server up answering /health
        # with 503: readiness takes the pod out of the Service, but nothing replaces it (a Deployment does not
        # restart NotReady pods), so the replica would be lost for good. A minute of failures (not one slow
        # answer under load) restarts the container; the node is warm, so it reloads from NVMe.
        "livenessProbe": {"httpGet": dict(health), "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
    }


def args(p: WarmProfile) -> list[str]:
    s = p.serving
    serving_spec(p)     # refuses extraArgs that repeat a field, before anything is rendered
    out = [
        f"--model={model_path(p.name)}",
        f"--served-model-name={p.name}",
        "--load-format=runai_streamer",
        "--model-loader-extra-config=" + json.dumps(model_loader_extra_config(p), separators=(",", ":")),
        f"--tensor-parallel-size={s.tensor_parallel_size}",
        f"--dtype={s.dtype}",
        "--host=0.0.0.0",
        f"--port={s.port}",
    ]
    if s.max_model_len:
        out.append(f"--max-model-len={s.max_model_len}")
    out += vllm_extra_args(p)
    return out


def env(p: WarmProfile, memory_bytes: int) -> list[dict]:
    """``memory_bytes``: the vLLM container's memory request (PodRequests.memory_bytes)."""
    s = p.serving
    d = cache_dirs(CACHE_MOUNT)
    return [
        {"name": "RUNAI_STREAMER_CHUNK_BYTESIZE", "value": str(p.serving.chunk_bytes)},
        # The streamer's host buffer defaults to 40 GB (runai-model-streamer 0.17 divides it between the ranks
        # on a node when distributed is on, TP > 1), more than a pod on a small type requests, and not bounded by
        # anything else: the pod sets no memory limit. Half the request, so the rest stays for vLLM's own
        # processes (API server, engine core, a worker per GPU). At TP = 1 too: the single reader buffers the
        # same way. The variable, not the loader config's memory_limit key: a vLLM whose loader does not know
        # that key refuses to start, and every streamer version reads the variable.
        {"name": "RUNAI_STREAMER_MEMORY_LIMIT", "value": str(streamer_memory_limit(memory_bytes))},
        {"name": "RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS", "value": str(s.s3_request_timeout_ms)},
        {"name": "RUNAI_STREAMER_S3_LOW_SPEED_LIMIT", "value": str(s.s3_low_speed_limit)},
        {"name": "XDG_CACHE_HOME", "value": str(d["xdg"])},
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": str(d["inductor"])},
        {"name": "TRITON_CACHE_DIR", "value": str(d["triton"])},
        # Inductor keeps its precompiled C++ headers under $TMPDIR whatever TORCHINDUCTOR_CACHE_DIR says;
        # on the NVMe volume they are restored with the rest of the bundle instead of rebuilt per pod.
        {"name": "TMPDIR", "value": str(d["tmp"])},
        # vLLM's AOT artifact (its default from torch 2.10) does not load back on every platform: on CPU,
        # vLLM 0.32 fails every load ('function' object has no attribute 'finalize_loading') and compiles
        # again, which a restore cannot fix. Without AOT, Inductor's cache in the dirs above is what a
        # restore fills and what serving loads (docs/compile-cache.md). It is a VLLM_* variable, so it is
        # in vLLM's hash and in nodewarm's key alike.
        {"name": AOT_COMPILE_ENV, "value": "0"},
    ]


SIGNING_MOUNT = "/var/run/nodewarm/signing"


def publisher_container(p: WarmProfile, serving_env: list[dict]) -> dict:
    """`nodewarm publish` beside vLLM: once vLLM is ready it proves the compile-cache hit against the agent's
    baseline, records hit|miss|cold on the Node (its ServiceAccount may patch nodes/status), marks a missed
    bundle stale, and publishes this node's caches when the key has no good bundle; then it idles, so the
    pod does not restart it.
    It runs the serving image (with nodewarm installed) because the key must describe the serving
    runtime, and it gets vLLM's environment because VLLM_*/TORCHINDUCTOR_* variables are part of the key.
    """
    pub = p.compile_cache.publisher
    d = cache_dirs(CACHE_MOUNT)
    # The pod cannot read instance metadata (hop limit 1): the buckets' region is spelled out.
    region = [{"name": "AWS_REGION", "value": p.nodes.region}, {"name": "AWS_DEFAULT_REGION", "value": p.nodes.region}]
    argv = ["nodewarm", "publish", "--uri", p.compile_cache.uri, "--signing-key", f"{SIGNING_MOUNT}/signing.pem",
            "--quiet-seconds", str(pub.quiet_seconds), *spec_args(serving_spec(p)),
            "--ready-url", f"http://127.0.0.1:{p.serving.port}/health",
            "--baseline", f"{CACHE_MOUNT}/{BASELINE_FILE}", "--start-record", servestart.RECORD_FILE,
            "--vllm-cache-root", str(d["vllm"]), "--inductor-dir", str(d["inductor"]),
            "--triton-dir", str(d["triton"]), "--pch-dir", str(d["pch"])]
    node = [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    return {
        "name": "nodewarm-publish",
        "image": pub.image,
        "command": ["sh", "-c", 'nodewarm "$@"; exec sleep infinity', "nodewarm-publish"],
        "args": argv[1:],
        "env": serving_env + region + node,
        "resources": {"requests": {"cpu": cpu_quantity(PUBLISHER_CPU_MILLI),
                                   "memory": memory_quantity(PUBLISHER_MEMORY)}},
        "volumeMounts": [{"name": "compile-cache", "mountPath": CACHE_MOUNT},
                         {"name": "signing-key", "mountPath": SIGNING_MOUNT, "readOnly": True},
                         *servestart.record_mounts(p)],
    }


def publisher_service_account(p: WarmProfile) -> dict:
    md = {"name": identity.publisher_service_account(p), "namespace": p.serving.namespace,
          "labels": {**labels(p), MANAGED_BY: "nodewarm"}}
    annotations = identity.service_account_annotations(p, "publisher")
    if annotations:          # an empty map is never stored: re-applying it would rewrite the object
        md["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": md}


def publisher_node_status_rbac(p: WarmProfile) -> list[dict]:
    """`patch nodes/status` for the publisher's ServiceAccount: it records the serving-time compile-cache outcome
    (hit|miss|cold) on its Node. The status subresource resets spec, so no taint can be touched through it;
    publisher_admission_policy narrows it to its own Node and the compile-cache annotations."""
    sa = identity.publisher_service_account(p)
    name = f"nodewarm-publisher:{p.serving.namespace}:{sa}"
    meta = {"name": name, "labels": {**labels(p), MANAGED_BY: "nodewarm"}}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta,
         "rules": [{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": dict(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": p.serving.namespace}]},
    ]


def publisher_admission_policy(p: WarmProfile) -> list[dict]:
    """`patch nodes/status` is cluster-wide in RBAC; this ValidatingAdmissionPolicy (Kubernetes >= 1.30) narrows
    the publisher to its own Node (the token's bound node) and to the two compile-cache annotations: no label,
    no other annotation and no condition (Warm included) may change through it."""
    from nodewarm.api.names import CACHE_ANNOTATION, CACHE_REASON_ANNOTATION
    from nodewarm.userdata.daemonset import OWN_NODE

    user = f"system:serviceaccount:{p.serving.namespace}:{identity.publisher_service_account(p)}"
    name = f"nodewarm-publisher-{p.serving.namespace}-{p.name}"
    ours = f"['{CACHE_ANNOTATION}', '{CACHE_REASON_ANNOTATION}']"
    new_a, old_a = ("(has(%s.metadata.annotations) ? %s.metadata.annotations : {})" % (o, o)
                    for o in ("object", "oldObject"))
    new_l, old_l = ("(has(%s.metadata.labels) ? %s.metadata.labels : {})" % (o, o) for o in ("object", "oldObject"))
    new_c, old_c = ("(has(%s.status.conditions) ? %s.status.conditions : [])" % (o, o) for o in ("object", "oldObject"))
    only_ours = (f"{new_a}.all(k, k in {ours} || (k in {old_a} && {old_a}[k] == {new_a}[k])) && "
                 f"{old_a}.all(k, k in {ours} || k in {new_a})")
    meta = {"name": name, "labels": {**labels(p), MANAGED_BY: "nodewarm"}}
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": meta,
         "spec": {
             "failurePolicy": "Fail",
             "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                                                     "resources": ["nodes", "nodes/status"]}]},
             "matchConditions": [{"name": "nodewarm-publisher", "expression": f"request.userInfo.username == '{user}'"}],
             "validations": [
                 {"expression": OWN_NODE, "reason": "Forbidden",
                  "message": "the compile-cache publisher may only write the Node its pod runs on"},
                 {"expression": only_ours, "reason": "Forbidden",
                  "message": f"the compile-cache publisher may only change {CACHE_ANNOTATION}(-reason)"},
                 {"expression": f"{new_l} == {old_l} && {new_c} == {old_c}", "reason": "Forbidden",
                  "message": "the compile-cache publisher may change no label and no condition"},
             ]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": dict(meta), "spec": {"policyName": name, "validationActions": ["Deny"]}},
    ]


def labels(p: WarmProfile) -> dict:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": p.name, PROFILE_LABEL: p.name}


def start_script_configmap(p: WarmProfile) -> dict:
    """The vLLM container's start script (servestart.py), labelled as the rest of the vLLM app."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": servestart.configmap_name(p), "namespace": p.serving.namespace,
                         "labels": {**labels(p), MANAGED_BY: "nodewarm"}},
            "data": {servestart.SCRIPT_KEY: servestart.script_text()}}


def placement(p: WarmProfile) -> dict:
    """Where the pods of view ``p`` may run: the profile's NodePool, on a node that holds the view's generation
    verified (its models.label_key). The first model keeps its nodeSelector on nodewarm.io/generation, so a profile
    without spec.models renders as before. A further model's key is no NodePool requirement (adding one would
    replace every live node as RequirementsDrifted, and a NodeClaim would take the label at launch, before the
    agent pulled), so Karpenter never launches a node for its pods: they land on nodes the first model's pods
    brought up, once the controller labels them."""
    if not models.is_extra(p):
        return {"nodeSelector": {NODEPOOL_LABEL: p.nodes.node_pool, GENERATION_LABEL: generation(p)}}
    term = {"key": models.label_key(p), "operator": "In", "values": [generation(p)]}
    return {"nodeSelector": {NODEPOOL_LABEL: p.nodes.node_pool},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [term]}]}}}}


def pod_spec(p: WarmProfile, types: dict[str, InstanceType] | None = None) -> dict:
    """``types``: the allowed instance types' facts (render's); None: the offline table (see requests)."""
    s = p.serving
    gpus = str(pod_gpus(p))
    req = requests(p, types)
    spec = {
        **placement(p),
        "tolerations": [{"key": GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
        "initContainers": [servestart.init_container(p, env(p, req.memory_bytes))],
        "containers": [{
            "name": CONTAINER,
            "image": s.image,
            # The start script (servestart): NVMe when the agent's copy is complete, else S3, else wait; it execs
            # vLLM's OpenAI server with these args (serve_start_script.serve_command).
            "command": servestart.command(p),
            "args": args(p),
            "ports": [{"containerPort": s.port, "name": "http", "protocol": "TCP"}],
            "env": env(p, req.memory_bytes),
            # No CPU or memory limit (as in the AWS guide): a CPU limit throttles the tokenizer and scheduler
            # under load, and a memory limit would OOM-kill a pod mid-load; the request reserves the node's share.
            "resources": {"requests": {**req.quantities(), "nvidia.com/gpu": gpus},
                          "limits": {"nvidia.com/gpu": gpus}},
            "volumeMounts": [
                *servestart.volume_mounts(p),       # the weights (read-only) and the start script
                {"name": "compile-cache", "mountPath": CACHE_MOUNT},
            ],
            **probes(p, types),
        }],
        "volumes": [
            # The weights (DirectoryOrCreate: the start script, not the kubelet, refuses an incomplete copy) and
            # the start script's ConfigMap.
            *servestart.volumes(p),
            {"name": "compile-cache", "hostPath": {"path": compile_cache_dir(p), "type": "DirectoryOrCreate"}},
        ],
    }
    # NCCL and vLLM's worker queues use /dev/shm; the runtime's default is 64 MiB (see SHM_PER_GPU).
    spec["containers"][0]["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    spec["volumes"].append({"name": "dshm", "emptyDir": {
        "medium": "Memory", "sizeLimit": memory_quantity(shm_size_bytes(p, req.memory_bytes))}})
    if p.compile_cache.publisher:
        # The writer's identity (Pod Identity association or IRSA annotation), never the namespace's default.
        # A ServiceAccount is per pod: the vLLM container shares it (docs/agent.md, "AWS identity").
        spec["serviceAccountName"] = identity.publisher_service_account(p)
        spec["containers"].append(publisher_container(p, env(p, req.memory_bytes)))
        spec["volumes"].append({"name": "signing-key", "secret": {
            "secretName": p.compile_cache.publisher.signing_key_secret, "defaultMode": 0o400}})
    # The first model only: the agent checkpoints the engine check's vLLM, and the check runs the first model.
    # Each of spec.models boots as it always did; a restore of it would find no snapshot under its key anyway.
    if p.serving.snapshot and not models.is_extra(p):
        spec = snapshot.restorable(spec)
    return spec


def deployment(p: WarmProfile, types: dict[str, InstanceType] | None = None) -> dict:
    lab = labels(p)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{p.name}-vllm", "namespace": p.serving.namespace,
                     "labels": {**lab, MANAGED_BY: "nodewarm"}},
        "spec": {
            "replicas": p.serving.replicas,
            "selector": {"matchLabels": lab},
            # The generation is in the template, not the selector (immutable): the agent on a node finds the
            # pods still serving an older generation by it before it frees their weights.
            "template": {"metadata": {"labels": {**lab, GENERATION_LABEL: generation(p)}}, "spec": pod_spec(p, types)},
        },
    }


def pod_disruption_budget(p: WarmProfile) -> dict:
    """Karpenter honours PDBs when it consolidates, expires or drifts nodes: without one a voluntary disruption
    may evict every replica at once, and each takes minutes to come back. maxUnavailable, not minAvailable, so
    a single replica can still be moved. AlwaysAllow (beta and on by default from Kubernetes 1.27, GA in 1.31): a
    pod that is not Ready (loading, or stuck) protects no serving capacity, so it must never block draining its
    node."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": f"{p.name}-vllm", "namespace": p.serving.namespace,
                     "labels": {**labels(p), MANAGED_BY: "nodewarm"}},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels(p)},
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }


def service(p: WarmProfile) -> dict:
    # `protocol` is spelled out: it is a key of the ports list, and server-side apply on older API
    # servers rejects list entries that omit a key even where the field has a default.
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{p.name}-vllm", "namespace": p.serving.namespace,
                     "labels": {**labels(p), MANAGED_BY: "nodewarm"}},
        "spec": {"selector": labels(p), "ports": [{"name": "http", "port": p.serving.port, "targetPort": "http", "protocol": "TCP"}]},
    }
