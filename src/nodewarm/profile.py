"""The WarmProfile: the user's one document, parsed into its typed settings (nodewarm.api.warmprofile) and validated.

Validation happens in two layers, both reporting ``field: bad value: fix``:
1. the JSON Schema (shape, types, enums, unknown fields), shared with the CRD;
2. semantic checks the schema cannot express (TP against the GPUs of every allowed instance type,
   model size against their NVMe and their GPU memory, capacity reservations, the image pre-pull timeout
   against the readiness deadline, mode-specific required fields).

(Over 300 lines: the checks are most of it, each a few lines naming its field and its fix; they read the document
and the typed profile together and share the schema's field paths, so they stay with the loader.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from . import instancetypes, sizing
from .api import defaults, models
from .api.defaults import default
from .api.errors import ProfileError
from .api.schema import strict_schema
from .api.servingspec import checked_extra_args, serving_spec
from .api.snapshot import CHECKPOINT_TIMEOUT_S
from .api.warmprofile import (
    Aws, Background, Bootstrap, CompileCache, Disruption, DriftPace, DriftWindow, EngineCheck, ExtraModel, Injection, Model, NodeLimits, Nodes,
    Peers, Publisher, DEFAULT_PREPULL_TIMEOUT_S, Readiness, Serving, WarmProfile, Weights, engine_check_image,
    parse_duration_s,
)


def _path(err: jsonschema.ValidationError) -> str:
    parts = []
    for p in err.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else (("." if parts else "") + str(p)))
    return "".join(parts) or "(document)"


def _schema_fix(err: jsonschema.ValidationError) -> str:
    v = err.validator
    if v == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        return f"unknown field(s) {extra}; allowed: {sorted(err.schema.get('properties', {}))}"
    if v == "required":
        return err.message.replace("is a required property", "is required here")
    if v == "enum":
        return f"must be one of {err.validator_value}"
    if v == "pattern":
        return f"must match {err.validator_value}"
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxLength", "minLength"):
        return f"{v} is {err.validator_value}"
    if v == "type":
        return f"must be of type {err.validator_value}"
    return err.message


def validate_document(doc: Any) -> None:
    """Schema check; raises ProfileError for the first (most specific) error."""
    validator = jsonschema.Draft202012Validator(strict_schema())
    errors = sorted(validator.iter_errors(doc), key=lambda e: (len(list(e.absolute_path)), e.message), reverse=True)
    if errors:
        e = errors[0]
        value = e.instance if e.validator not in ("required", "additionalProperties") else None
        raise ProfileError(_path(e), value, _schema_fix(e))


def _aws(a: dict, spec: dict) -> Aws:
    pods = (spec["nodes"]["mode"] == "automode" or spec["nodes"].get("amiAlias", "").startswith("bottlerocket@")
            or "publisher" in spec["compileCache"])
    return Aws(identity=a.get("identity", "podIdentity" if pods else "node"), cluster_name=a.get("clusterName"),
               agent_role_arn=a.get("agentRoleArn"), publisher_role_arn=a.get("publisherRoleArn"),
               kms_key_arn=a.get("kmsKeyArn"))


def check_aws(p: WarmProfile) -> None:
    """Every pod that needs AWS must have a way to get credentials, spelled out before anything renders."""
    a = p.aws
    if a.identity == "node" and p.pods_need_aws:
        who = "the bootstrap DaemonSet" if p.uses_daemonset else "the publisher sidecar"
        raise ProfileError("spec.aws.identity", "node", f"{who} is a pod, and pods cannot reach instance metadata "
                           "(hop limit 1 on Karpenter's and Auto Mode's nodes): use podIdentity or irsa")
    if a.identity in ("podIdentity", "irsa"):
        if p.uses_daemonset and not a.agent_role_arn:
            raise ProfileError("spec.aws.agentRoleArn", None, f"{a.identity} needs the role the bootstrap DaemonSet "
                               "assumes (it reads the model, compile cache and artifact): an IAM role ARN")
        if p.compile_cache.publisher and not a.publisher_role_arn:
            raise ProfileError("spec.aws.publisherRoleArn", None, f"{a.identity} needs the role the publisher "
                               "assumes (it writes the compile-cache prefix): an IAM role ARN")
        if a.identity == "podIdentity" and not a.cluster_name:
            raise ProfileError("spec.aws.clusterName", None, "Pod Identity associations name the EKS cluster: set it")
    if p.compile_cache.publisher and not p.nodes.region:
        raise ProfileError("spec.nodes.region", None, "the publisher sidecar writes to S3 from a pod that cannot "
                           "read instance metadata: set the buckets' region")


MIN_DEADLINE_S = 60


def _check_deadline(doc: Any) -> None:
    """The schema's pattern also refuses < 1m, but this says why (checked first, for the clearer message)."""
    spec = doc.get("spec") if isinstance(doc, dict) else None
    r = spec.get("readiness") if isinstance(spec, dict) else None
    d = r.get("deadline") if isinstance(r, dict) else None
    if isinstance(d, str) and d[:-1].isdigit() and d[-1:] in ("s", "m", "h") and parse_duration_s(d) < MIN_DEADLINE_S:
        raise ProfileError("spec.readiness.deadline", d, "must be at least 1m (e.g. 20m): a node needs that long to "
                           "register and pull its weights; a shorter deadline would act on every node before it "
                           "could turn Warm")


def _check_prepull_timeout(doc: Any) -> None:
    """The schema's pattern refuses a bad duration too, but this says what a good one looks like."""
    spec = doc.get("spec") if isinstance(doc, dict) else None
    b = spec.get("bootstrap") if isinstance(spec, dict) else None
    t = b.get("imagePrepullTimeout") if isinstance(b, dict) else None
    bootstrap = strict_schema()["properties"]["spec"]["properties"]["bootstrap"]
    pattern = bootstrap["properties"]["imagePrepullTimeout"]["pattern"]
    if isinstance(t, str) and not re.match(pattern, t):
        raise ProfileError("spec.bootstrap.imagePrepullTimeout", t, "a whole number of seconds, minutes or hours "
                           "above zero, e.g. 90s, 10m (the default) or 1h")


def default_prepull_timeout(deadline: str) -> str:
    """10m, or half the readiness deadline when that is shorter: the pre-pull must give up (and say so) before
    the deadline acts on the node. Not a schema default, which could not follow the deadline."""
    s = min(DEFAULT_PREPULL_TIMEOUT_S, parse_duration_s(deadline) // 2)
    return f"{s // 60}m" if s % 60 == 0 else f"{s}s"


def _drift_pace(d: dict | None) -> DriftPace | None:
    if d is None:
        return None
    w = d.get("window")
    return DriftPace(nodes=d.get("nodes", default("nodes.disruption.drift.nodes")),
                     window=DriftWindow(w["start"], w["duration"]) if w else None)


def from_dict(doc: dict) -> WarmProfile:
    """Schema-validate and build the typed profile (defaults applied). Semantic checks: see ``check``."""
    _check_deadline(doc)
    _check_prepull_timeout(doc)
    validate_document(doc)
    s = doc["spec"]
    m, sv, n, cc = s["model"], s["serving"], s["nodes"], s["compileCache"]
    r, b = s.get("readiness", {}), s.get("bootstrap", {})
    return WarmProfile(
        name=doc["metadata"]["name"],
        model=Model(uri=m["uri"], size_gb=m.get("sizeGB"), revision=m.get("revision", "")),
        weights=_weights(s.get("weights", {})),
        serving=Serving(
            image=sv["image"],
            tensor_parallel_size=sv.get("tensorParallelSize", default("serving.tensorParallelSize")),
            max_model_len=sv.get("maxModelLen"),
            chunk_size_gb=sv.get("chunkSizeGB", default("serving.chunkSizeGB")),
            dtype=sv.get("dtype", default("serving.dtype")),
            replicas=sv.get("replicas", default("serving.replicas")),
            namespace=sv.get("namespace", default("serving.namespace")),
            port=sv.get("port", default("serving.port")),
            s3_request_timeout_ms=sv.get("s3RequestTimeoutMs", default("serving.s3RequestTimeoutMs")),
            s3_low_speed_limit=sv.get("s3LowSpeedLimit", default("serving.s3LowSpeedLimit")),
            extra_args=tuple(sv.get("extraArgs", ())),
            allow_eager=sv.get("allowEager", default("serving.allowEager")),
            cpu_request=sv.get("resources", {}).get("cpu"),
            memory_request=sv.get("resources", {}).get("memory"),
            snapshot=sv.get("snapshot", {}).get("enabled", default("serving.snapshot.enabled")),
        ),
        nodes=Nodes(
            mode=n["mode"],
            node_pool=n["nodePool"],
            node_class=n["nodeClass"],
            instance_types=tuple(n["instanceTypes"]),
            role=n.get("role"),
            ami_alias=n.get("amiAlias", ""),
            subnet_selector_terms=tuple(n.get("subnetSelectorTerms", ())),
            security_group_selector_terms=tuple(n.get("securityGroupSelectorTerms", ())),
            user_data=n.get("userData"),
            ephemeral_storage_size=n.get("ephemeralStorageSize"),
            region=n.get("region"),
            capacity_types=tuple(n.get("capacityTypes", ())),
            capacity_reservation_ids=tuple(n.get("capacityReservationIds", ())),
            limits=NodeLimits(gpus=n.get("limits", {}).get("gpus"), cpu=n.get("limits", {}).get("cpu"),
                              memory=n.get("limits", {}).get("memory")),
            disruption=Disruption(
                consolidation_policy=n.get("disruption", {}).get("consolidationPolicy",
                                                                 default("nodes.disruption.consolidationPolicy")),
                consolidate_after=n.get("disruption", {}).get("consolidateAfter",
                                                              default("nodes.disruption.consolidateAfter")),
                budgets=tuple(n.get("disruption", {}).get("budgets", ())),
                drift=_drift_pace(n.get("disruption", {}).get("drift"))),
        ),
        compile_cache=CompileCache(uri=cc["uri"], verify_key=cc.get("verifyKey"), publisher=(
            Publisher(cc["publisher"]["image"], cc["publisher"]["signingKeySecret"],
                      cc["publisher"].get("quietSeconds", default("compileCache.publisher.quietSeconds")))
            if "publisher" in cc else None)),
        readiness=Readiness(
            taint_key=r.get("taintKey", defaults.TAINT_KEY),
            deadline=r.get("deadline", defaults.DEADLINE),
            on_deadline=r.get("onDeadline", defaults.ON_DEADLINE),
            engine_check=EngineCheck(
                enabled=r.get("engineCheck", {}).get("enabled", default("readiness.engineCheck.enabled")),
                timeout=r.get("engineCheck", {}).get("timeout", default("readiness.engineCheck.timeout")),
                image=r.get("engineCheck", {}).get("image")),
        ),
        bootstrap=Bootstrap(
            image=b.get("image"),
            artifact_uri=b.get("artifactUri"),
            artifact_sha256=b.get("artifactSha256"),
            allow_non_nvme=b.get("allowNonNvme", default("bootstrap.allowNonNvme")),
            namespace=b.get("namespace", default("bootstrap.namespace")),
            image_prepull_timeout=b.get("imagePrepullTimeout") or default_prepull_timeout(r.get("deadline", defaults.DEADLINE)),
        ),
        aws=_aws(s.get("aws", {}), s),
        injection=Injection(mode=s.get("injection", {}).get("mode", default("injection.mode")),
                            on_live=s.get("injection", {}).get("onLive", default("injection.onLive"))),
        raw=doc,
        models=tuple(ExtraModel(name=e["name"], model=Model(uri=e["uri"], size_gb=e.get("sizeGB"),
                                                             revision=e.get("revision", ""), where=f"spec.models[{i}]"),
                                priority=e.get("priority", default("models.priority")),
                                required=e.get("required", default("models.required")),
                                replicas=e.get("replicas", default("models.replicas")))
                     for i, e in enumerate(s.get("models", ()))),
    )


def _weights(w: dict) -> Weights:
    p = w.get("peers", {})
    return Weights(peers=Peers(
        enabled=p.get("enabled", default("weights.peers.enabled")),
        port=p.get("port", default("weights.peers.port")),
        max_connections=p.get("maxConnections", default("weights.peers.maxConnections")),
        max_mbps=p.get("maxMBps", default("weights.peers.maxMBps")),
        key_rotation=p.get("keyRotation", default("weights.peers.keyRotation"))),
        background=Background(
            max_mbps=w.get("background", {}).get("maxMBps", default("weights.background.maxMBps")),
            concurrency=w.get("background", {}).get("concurrency", default("weights.background.concurrency"))))


# Taint keys owned by Kubernetes, Karpenter or the GPU stack: a startup taint under one of them would be
# lifted (or kept) by someone else, or lift theirs.
RESERVED_TAINT_PREFIXES = ("karpenter.sh/", "karpenter.k8s.aws/", "node.kubernetes.io/",
                           "node.cloudprovider.kubernetes.io/", "node-role.kubernetes.io/", "kubernetes.io/")
RESERVED_TAINT_KEYS = ("nvidia.com/gpu",)


def check_taint_key(key: str, field: str = "spec.readiness.taintKey") -> None:
    if key in RESERVED_TAINT_KEYS or any(key.startswith(pre) for pre in RESERVED_TAINT_PREFIXES):
        raise ProfileError(field, key, "this key belongs to Kubernetes, Karpenter or the GPU stack; use one of "
                           "your own, e.g. nodewarm.io/warming (the default)")


# vLLM's default --gpu-memory-utilization: the share of each GPU's memory vLLM lets itself use for the weights,
# the activations and the KV cache together.
VLLM_GPU_MEMORY_UTILIZATION = 0.9
# What must be left of that share after the weights for vLLM to serve at all: the activation peak of its profiling
# run (about 1-2 GiB at the default max_num_batched_tokens), CUDA graphs (about 0.5-1 GiB) and a KV cache that
# holds at least one max-model-len sequence (vLLM refuses to start otherwise; a 70B GQA model in bf16 needs
# 320 KiB a token: 2.5 GiB for 8k tokens, split over the TP ranks). A floor, not a sizing: weights that leave less
# cannot start; weights that leave more may still serve few concurrent sequences.
KV_ACTIVATION_RESERVE_GIB = 4.0


def pipeline_parallel_size(p: WarmProfile) -> int:
    """PP as vLLM will get it (extraArgs validated and read with vLLM's spelling rules)."""
    return serving_spec(p).pp


def gpu_memory_utilization(p: WarmProfile) -> float:
    # From the checked extraArgs, not the key's engine settings: vLLM's compile hash leaves the fraction out, so
    # the key does too, but the fit check needs it.
    given = [a.value for a in checked_extra_args(p) if a.name == "gpu-memory-utilization"]
    v = given[-1] if given else None
    try:
        u = float(v) if v is not None else VLLM_GPU_MEMORY_UTILIZATION
    except ValueError:
        return VLLM_GPU_MEMORY_UTILIZATION
    return u if 0 < u <= 1 else VLLM_GPU_MEMORY_UTILIZATION


def weights_budget_gib(p: WarmProfile, it: instancetypes.InstanceType) -> float:
    """What one GPU of ``it`` has for ``p``'s weights: vLLM's share of its memory less the KV-cache/activation
    reserve."""
    return gpu_memory_utilization(p) * it.gpu_memory_mib / 1024 - KV_ACTIVATION_RESERVE_GIB


def largest_weights_gb(p: WarmProfile, types: dict[str, instancetypes.InstanceType]) -> float:
    """The largest weights check_gpu_memory accepts for ``p``: what TP x PP GPUs of every allowed type hold."""
    per_gpu = min(weights_budget_gib(p, types[name]) for name in p.nodes.instance_types)
    return max(0.0, per_gpu) * p.serving.tensor_parallel_size * pipeline_parallel_size(p) * sizing.GIB / sizing.GB


def check_gpu_memory(p: WarmProfile, types: dict[str, instancetypes.InstanceType]) -> None:
    """The weights must fit every allowed type's GPUs: size / (TP x PP) per GPU, within vLLM's share of the GPU's
    memory less the KV-cache/activation reserve. Karpenter may launch any allowed type, so all must fit."""
    if p.model.size_gb is None:
        return
    tp, pp, util = p.serving.tensor_parallel_size, pipeline_parallel_size(p), gpu_memory_utilization(p)
    reserve = KV_ACTIVATION_RESERVE_GIB

    def per_gpu_gib(ranks: int) -> float:
        return p.model.size_gb * sizing.GB / ranks / sizing.GIB

    for i, name in enumerate(p.nodes.instance_types):
        it = types[name]
        mem_gib = it.gpu_memory_mib / 1024
        usable = util * mem_gib
        budget = weights_budget_gib(p, it)
        if per_gpu_gib(tp * pp) <= budget:
            continue
        layout = f"TP={tp}" + (f" x PP={pp}" if pp > 1 else "")
        fits = [d for d in range(tp, it.gpus + 1) if it.gpus % d == 0 and d * pp <= it.gpus
                and per_gpu_gib(d * pp) <= budget]
        facts = (f"{p.model.size_gb:g} GB of weights at {layout} is {p.model.size_gb / (tp * pp):.4g} GB "
                 f"({per_gpu_gib(tp * pp):.1f} GiB) per GPU; {name}'s {it.gpu_name} has {mem_gib:.0f} GiB "
                 f"({usable:.1f} GiB usable at gpu-memory-utilization {util:g}, minus {reserve:g} GiB for the KV cache "
                 f"and activations: {budget:.1f} GiB)")
        if fits:
            raise ProfileError("spec.serving.tensorParallelSize", tp, f"{facts}; use TP >= {fits[0]}")
        raise ProfileError(f"spec.nodes.instanceTypes[{i}]", name,
                           f"{facts}, and no tensorParallelSize on its {it.gpus} GPU(s) fits; choose types with more "
                           "or larger GPUs, or a smaller (quantized) model")


# The NodePool CRD's patterns for a budget (kubernetes-sigs/karpenter pkg/apis/v1/nodepool.go), stricter than the
# profile schema's; checked here so a bad budget is a profile error, not a failed apply.
_BUDGET_NODES = re.compile(r"^((100|[0-9]{1,2})%|[0-9]+)$")
_BUDGET_DURATION = re.compile(r"^((([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?)$")


def check_nodepool(p: WarmProfile) -> None:
    """Capacity types, reservations and disruption budgets: what the rendered NodePool/EC2NodeClass need."""
    n = p.nodes
    if n.capacity_reservation_ids:
        if n.mode != "karpenter":
            raise ProfileError("spec.nodes.capacityReservationIds", list(n.capacity_reservation_ids),
                               "Karpenter mode only (nodewarm renders them into the EC2NodeClass's "
                               "capacityReservationSelectorTerms); remove them in automode")
        if "reserved" not in n.capacity_types:
            raise ProfileError("spec.nodes.capacityTypes", list(n.capacity_types) or None,
                               "spec.nodes.capacityReservationIds launch only with capacity type reserved: add it, "
                               "e.g. [reserved, on-demand] to fall back to on-demand when the reservations are full")
    for i, b in enumerate(n.disruption.budgets):
        where = f"spec.nodes.disruption.budgets[{i}]"
        if not _BUDGET_NODES.match(str(b.get("nodes", ""))):
            raise ProfileError(f"{where}.nodes", b.get("nodes"), "a node count (\"1\") or a percentage up to 100%")
        if "duration" in b and not _BUDGET_DURATION.match(b["duration"]):
            raise ProfileError(f"{where}.duration", b["duration"], "minutes and/or hours, e.g. 30m, 2h or 1h30m")
        if ("schedule" in b) != ("duration" in b):
            raise ProfileError(f"{where}.{'duration' if 'schedule' in b else 'schedule'}", None,
                               "schedule and duration go together (Karpenter's rule): set both or neither")
    pace = n.disruption.drift
    if pace is not None and pace.window is not None and parse_duration_s(pace.window.duration) >= 86400:
        raise ProfileError("spec.nodes.disruption.drift.window.duration", pace.window.duration,
                           "a daily window shorter than 24h, e.g. 4h; for no window at all, remove window")


def check_ami_alias(p: WarmProfile) -> None:
    """Karpenter mode renders an EC2NodeClass: its AMI must be a choice, never a silent al2023@latest (every AMI
    release would replace every warm node, each pulling its weights again)."""
    if p.nodes.mode == "karpenter" and not p.nodes.ami_alias:
        raise ProfileError("spec.nodes.amiAlias", None,
                           "pin the AMI release the nodes run, e.g. al2023@v20241011 or bottlerocket@v1.20.4 "
                           "(Karpenter picks that release's NVIDIA variant for GPU types). al2023@latest is allowed "
                           "when written out: then each AMI release replaces every warm node of the pool "
                           "(AMIDrift), at the pace of spec.nodes.disruption.drift")


def check_prepull_timeout(p: WarmProfile) -> None:
    t, d = p.bootstrap.image_prepull_timeout_s, p.readiness.deadline_s
    if t >= d:
        raise ProfileError("spec.bootstrap.imagePrepullTimeout", p.bootstrap.image_prepull_timeout,
                           f"must be shorter than spec.readiness.deadline ({p.readiness.deadline}): the deadline "
                           f"would act on the node ({p.readiness.on_deadline}) before the pre-pull gives up; use "
                           f"at most {default_prepull_timeout(p.readiness.deadline)} (half the deadline) or "
                           "lengthen the deadline")


# What the engine check's timeout must leave of readiness.deadline for the warm-up before it (registration, the
# agent's start, the weights): at least this, or the deadline would act while the check is still running.
ENGINE_CHECK_MIN_WARMUP_S = 120


def check_engine_check(p: WarmProfile) -> None:
    """readiness.engineCheck, when enabled: a timeout the deadline leaves room for, and an image with nodewarm."""
    e, r = p.readiness.engine_check, p.readiness
    if not e.enabled:
        return
    if e.timeout_s + ENGINE_CHECK_MIN_WARMUP_S > r.deadline_s:
        most = r.deadline_s - ENGINE_CHECK_MIN_WARMUP_S
        at_most = (f"{most // 60}m" if most % 60 == 0 else f"{most}s") if most > 0 else None
        raise ProfileError("spec.readiness.engineCheck.timeout", e.timeout,
                           f"must be shorter than spec.readiness.deadline ({r.deadline}) by at least "
                           f"{ENGINE_CHECK_MIN_WARMUP_S}s: the deadline counts from registration, and the weights, "
                           "caches and image come before the check; "
                           + (f"use at most {at_most} or lengthen the deadline" if at_most else
                              "lengthen the deadline"))
    if engine_check_image(p) is None:
        raise ProfileError("spec.readiness.engineCheck.image", None,
                           "the check pod runs `nodewarm engine-check`, which boots vLLM: set the serving image with "
                           "nodewarm installed here (or configure spec.compileCache.publisher, whose image is used)")


def check_snapshot(p: WarmProfile) -> None:
    """serving.snapshot, when enabled: an AL2023 node, whose user data installs the runtime handler, and the engine
    check, whose engine is the one checkpointed."""
    if not p.serving.snapshot:
        return
    if p.uses_daemonset:
        where = "Auto Mode" if p.nodes.mode == "automode" else "Bottlerocket"
        raise ProfileError("spec.serving.snapshot.enabled", True,
                           f"{where} nodes take no user data that could install the snapshot runtime handler in "
                           "containerd; remove it, or use self-managed AL2023 nodes (spec.nodes.mode: karpenter, "
                           "amiAlias al2023@...)")
    if not p.readiness.engine_check.enabled:
        raise ProfileError("spec.serving.snapshot.enabled", True,
                           "the snapshot is taken of the engine check's vLLM once it has answered: set "
                           "spec.readiness.engineCheck.enabled: true as well")
    e, r = p.readiness.engine_check, p.readiness
    if e.timeout_s + ENGINE_CHECK_MIN_WARMUP_S + CHECKPOINT_TIMEOUT_S > r.deadline_s:
        raise ProfileError("spec.readiness.deadline", r.deadline,
                           f"with spec.serving.snapshot the agent checkpoints the engine before Warm (up to "
                           f"{CHECKPOINT_TIMEOUT_S // 60}m): the deadline must leave the engine check's timeout "
                           f"({e.timeout}), {ENGINE_CHECK_MIN_WARMUP_S}s for the weights and that; lengthen it to "
                           f"at least {-(-(e.timeout_s + ENGINE_CHECK_MIN_WARMUP_S + CHECKPOINT_TIMEOUT_S) // 60)}m "
                           "or shorten engineCheck.timeout")


def check_peers(p: WarmProfile) -> None:
    """Peers need a shared key each node of the profile can read and no other can: the controller binds it to each
    node's own identity (system:node:<name>). The DaemonSet's agents share one ServiceAccount, which cannot tell
    the profile's nodes from the others'."""
    if p.weights.peers.enabled and p.uses_daemonset:
        raise ProfileError("spec.weights.peers.enabled", True,
                           "peers run with the AL2023 agent only (its per-node identity reads the peers' key); "
                           "turn peers off for Auto Mode or Bottlerocket nodes")


# Kubernetes' limit on a Service name (a DNS label): a model's Service is <profile>-<name>-vllm (nodeclasses/vllm.py).
SERVICE_NAME_MAX = 63


def check_models(p: WarmProfile, types: dict[str, instancetypes.InstanceType]) -> None:
    """spec.models: names and folders of their own, Service names Kubernetes accepts, and the required models
    (spec.model plus each required one) together on the NVMe of every allowed type, as the taint waits for all."""
    seen_names: set[str] = set()
    folders = {(p.model.uri, p.model.revision): p.model.where}
    for e in p.models:
        where = e.model.where
        if e.name in seen_names:
            raise ProfileError(f"{where}.name", e.name, "another model of spec.models has this name (its Deployment, "
                               "Service, Node label and folder would be the same): give each model its own name")
        seen_names.add(e.name)
        folder = (e.model.uri, e.model.revision)
        if folder in folders:
            raise ProfileError(f"{where}.uri", e.model.uri,
                               f"claims the same model folder as {folders[folder]} (same uri and revision "
                               f"{e.model.revision!r}): the weights would be pulled and held twice; remove one, or "
                               "set a different revision if they really differ")
        folders[folder] = where
        service = f"{models.view_name(p.name, e.name)}-vllm"
        if len(service) > SERVICE_NAME_MAX:
            raise ProfileError(f"{where}.name", e.name,
                               f"its Service {service} is {len(service)} characters, over Kubernetes' "
                               f"{SERVICE_NAME_MAX}: shorten it to at most "
                               f"{SERVICE_NAME_MAX - len(service) + len(e.name)} characters (or the profile's name)")
        if e.required and e.model.size_gb is None:
            raise ProfileError(f"{where}.sizeGB", None, "a required model must fit the NVMe beside spec.model "
                               "before the node serves: set its size in GB, or make it not required")
    if p.model.size_gb is None:
        return
    smallest = min(p.nodes.instance_types, key=lambda t: types[t].nvme_gb)
    nvme = types[smallest].nvme_gb
    total, parts = p.model.size_gb, [f"{p.model.where} {p.model.size_gb:g} GB"]
    for e in p.models:
        if not e.required:
            continue
        total += e.model.size_gb
        parts.append(f"{e.model.where} {e.model.size_gb:g} GB")
        need = sizing.required_nvme_gb(total)
        if need > nvme:
            raise ProfileError(f"{e.model.where}.required", True,
                               f"the required models ({' + '.join(parts)} = {total:g} GB) plus "
                               f"{sizing.headroom_gb(total):.0f} GB headroom need {need:.0f} GB, but {smallest} has "
                               f"{nvme} GB of NVMe; make this model not required (it then warms after the taint is "
                               "lifted, and may be evicted), or pick larger instance types")


def check(p: WarmProfile, types: dict[str, instancetypes.InstanceType]) -> None:
    """Semantic checks against the allowed instance types. ``types`` comes from instancetypes.lookup."""
    n = p.nodes
    check_taint_key(p.readiness.taint_key)
    check_aws(p)
    check_prepull_timeout(p)
    check_engine_check(p)
    check_snapshot(p)
    check_nodepool(p)
    check_peers(p)
    for i, name in enumerate(n.instance_types):
        if name not in types:
            raise ProfileError(f"spec.nodes.instanceTypes[{i}]", name,
                               "unknown instance type; check the spelling, or pass --instance-source ec2 "
                               "to look it up with DescribeInstanceTypes")
    if n.mode == "karpenter" or n.mode == "automode":
        if not n.role:
            raise ProfileError("spec.nodes.role", None, "the IAM role (name) the nodes run as is required")
        for f, v in (("subnetSelectorTerms", n.subnet_selector_terms),
                     ("securityGroupSelectorTerms", n.security_group_selector_terms)):
            if not v:
                raise ProfileError(f"spec.nodes.{f}", None, "required: at least one term, e.g. "
                                   "[{tags: {karpenter.sh/discovery: my-cluster}}]")
    if n.mode == "automode":
        if n.user_data:
            raise ProfileError("spec.nodes.userData", "<set>", "Auto Mode has no user data; remove it "
                               "(nodewarm runs as a DaemonSet there)")
        if not n.ami_alias.startswith("al2023@") and "amiAlias" in p.raw["spec"]["nodes"]:
            raise ProfileError("spec.nodes.amiAlias", n.ami_alias, "Auto Mode picks the AMI itself; remove amiAlias")

    tp = p.serving.tensor_parallel_size
    for i, name in enumerate(n.instance_types):
        it = types[name]
        if it.gpus == 0:
            raise ProfileError(f"spec.nodes.instanceTypes[{i}]", name, "has no GPU; choose a GPU instance type")
        if tp > it.gpus or it.gpus % tp:
            good = [d for d in range(1, it.gpus + 1) if it.gpus % d == 0]
            raise ProfileError("spec.serving.tensorParallelSize", tp,
                               f"{name} has {it.gpus} GPUs; tensorParallelSize must divide that: one of {good}")
        pp = pipeline_parallel_size(p)
        if tp * pp > it.gpus:
            # One pod holds every rank (nodeclasses/vllm.py requests TP x PP GPUs): more than a node has never binds.
            raise ProfileError("spec.serving.extraArgs", f"--pipeline-parallel-size={pp}",
                               f"TP={tp} x PP={pp} needs {tp * pp} GPUs in one pod, but {name} has {it.gpus}; "
                               f"lower the pipeline-parallel size to at most {it.gpus // tp}")
        if it.nvme_gb == 0:
            raise ProfileError(f"spec.nodes.instanceTypes[{i}]", name,
                               "has no NVMe instance store; nodewarm needs one to hold the weights")

    if p.compile_cache.publisher and not p.compile_cache.verify_key:
        raise ProfileError("spec.compileCache.verifyKey", None, "a publisher signs bundles, so nodes need the matching "
                           "verify key: the line `nodewarm bootstrap compile-cache keygen` printed")
    if p.model.size_gb is not None:
        need = sizing.required_nvme_gb(p.model.size_gb)
        for i, name in enumerate(n.instance_types):
            if need > types[name].nvme_gb:
                raise ProfileError("spec.model.sizeGB", p.model.size_gb,
                                   f"{name} has {types[name].nvme_gb} GB of NVMe, but the model plus "
                                   f"{sizing.headroom_gb(p.model.size_gb):.0f} GB headroom needs {need:.0f} GB; "
                                   "pick larger instance types")
    check_gpu_memory(p, types)
    if n.mode == "automode" and n.ephemeral_storage_size:
        size_b = sizing.parse_quantity_bytes(n.ephemeral_storage_size)
        smallest = min(n.instance_types, key=lambda t: types[t].nvme_gb)
        if size_b >= types[smallest].nvme_bytes:
            raise ProfileError("spec.nodes.ephemeralStorageSize", n.ephemeral_storage_size,
                               f"must be strictly below the NVMe capacity of every allowed type "
                               f"({smallest}: {types[smallest].nvme_gb}G), or Auto Mode silently uses EBS; "
                               f"omit it to get {sizing.automode_ephemeral_size(types[smallest].nvme_gb)}")
        if p.model.size_gb is not None and size_b < sizing.required_nvme_gb(p.model.size_gb) * sizing.GB:
            raise ProfileError("spec.nodes.ephemeralStorageSize", n.ephemeral_storage_size,
                               f"must be at least the model plus headroom "
                               f"({sizing.required_nvme_gb(p.model.size_gb):.0f}G)")
    check_models(p, types)


def load(path: str | Path) -> WarmProfile:
    """Read one WarmProfile YAML document from a file ('-' for stdin) and schema-validate it."""
    import sys
    text = sys.stdin.read() if str(path) == "-" else Path(path).read_text()
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise ProfileError("(file)", str(path), f"not valid YAML: {e}") from None
    if len(docs) != 1:
        raise ProfileError("(file)", str(path), f"expected exactly one WarmProfile document, found {len(docs)}")
    return from_dict(docs[0])
