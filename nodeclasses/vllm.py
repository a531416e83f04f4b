"""The vLLM Deployment and Service, tuned as in the AWS "fast model loading" guide, reading the weights
nodewarm put on the node's NVMe instead of streaming them from S3 again.

Deliberate choices:
* ``--load-format=runai_streamer`` with ``concurrency = ceil(sizeGB / chunkSizeGB)``; ``distributed`` only
  when TP > 1 (with TP = 1 it buys nothing, and it needs the V1 engine).
* never ``--enforce-eager``: it turns torch.compile off, so the restored compile cache would be unused.
* XDG_CACHE_HOME / TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR on a hostPath on the NVMe mount, where
  the bootstrap restored the caches.
* NO toleration of the readiness taint: the pod must not land before the node is warm. Only the GPU
  taint is tolerated.
* a nodeSelector on ``nodewarm.io/generation``: the node agent labels its Node with the generation it holds
  (nodewarm.generation), so a rolling update of the serving image or model puts new pods only on nodes
  already warm for them, and no node is replaced or re-tainted for it.
"""

from __future__ import annotations

import json

from nodewarm.generation import GENERATION_LABEL, generation
from nodewarm.profile import WarmProfile

from . import identity
from .labels import GPU_TAINT, MANAGED_BY, NODEPOOL_LABEL, PROFILE_LABEL
from .podlayout import CACHE_MOUNT, MODEL_MOUNT, cache_dirs, model_path
from .servingspec import serving_spec, spec_args

GIB = 2**30


def streamer_chunk_bytes(p: WarmProfile) -> int:
    """RUNAI_STREAMER_CHUNK_BYTESIZE of the pod; the node's load check is tuned with the same value."""
    return int(p.serving.chunk_size_gb * GIB)


def model_loader_extra_config(p: WarmProfile) -> dict:
    cfg: dict = {"concurrency": p.concurrency}
    if p.serving.tensor_parallel_size > 1:
        cfg["distributed"] = True
    return cfg


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
    out += [a for a in s.extra_args if a != "--enforce-eager"]
    return out


def env(p: WarmProfile) -> list[dict]:
    s = p.serving
    d = cache_dirs(CACHE_MOUNT)
    return [
        {"name": "RUNAI_STREAMER_CHUNK_BYTESIZE", "value": str(streamer_chunk_bytes(p))},
        {"name": "RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS", "value": str(s.s3_request_timeout_ms)},
        {"name": "RUNAI_STREAMER_S3_LOW_SPEED_LIMIT", "value": str(s.s3_low_speed_limit)},
        {"name": "XDG_CACHE_HOME", "value": str(d["xdg"])},
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": str(d["inductor"])},
        {"name": "TRITON_CACHE_DIR", "value": str(d["triton"])},
        # Inductor keeps its precompiled C++ headers under $TMPDIR whatever TORCHINDUCTOR_CACHE_DIR says;
        # on the NVMe volume they are restored with the rest of the bundle instead of rebuilt per pod.
        {"name": "TMPDIR", "value": str(d["tmp"])},
    ]


SIGNING_MOUNT = "/var/run/nodewarm/signing"
# Where the node agent saves the post-restore snapshot (hitcheck.Baseline): beside the cache roots, not in one.
BASELINE_FILE = "nodewarm-baseline.json"


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
            "--baseline", f"{CACHE_MOUNT}/{BASELINE_FILE}",
            "--vllm-cache-root", str(d["vllm"]), "--inductor-dir", str(d["inductor"]),
            "--triton-dir", str(d["triton"]), "--pch-dir", str(d["pch"])]
    node = [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    return {
        "name": "nodewarm-publish",
        "image": pub.image,
        "command": ["sh", "-c", 'nodewarm "$@"; exec sleep infinity', "nodewarm-publish"],
        "args": argv[1:],
        "env": serving_env + region + node,
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "volumeMounts": [{"name": "compile-cache", "mountPath": CACHE_MOUNT},
                         {"name": "signing-key", "mountPath": SIGNING_MOUNT, "readOnly": True}],
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
    from nodewarm.nodeclasses.labels import CACHE_ANNOTATION, CACHE_REASON_ANNOTATION
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


def pod_spec(p: WarmProfile) -> dict:
    s = p.serving
    serve = serving_spec(p)
    gpus = str(serve.tp * serve.pp)
    spec = {
        "nodeSelector": {NODEPOOL_LABEL: p.nodes.node_pool, GENERATION_LABEL: generation(p)},
        "tolerations": [{"key": GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{
            "name": "vllm",
            "image": s.image,
            "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
            "args": args(p),
            "ports": [{"containerPort": s.port, "name": "http", "protocol": "TCP"}],
            "env": env(p),
            "resources": {"requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}},
            "volumeMounts": [
                {"name": "weights", "mountPath": f"{MODEL_MOUNT}/{p.name}", "readOnly": True},
                {"name": "compile-cache", "mountPath": CACHE_MOUNT},
            ],
            "startupProbe": {"httpGet": {"path": "/health", "port": s.port},
                             "periodSeconds": 10, "failureThreshold": 60, "initialDelaySeconds": 30},
            "readinessProbe": {"httpGet": {"path": "/health", "port": s.port},
                               "periodSeconds": 5, "timeoutSeconds": 3},
        }],
        "volumes": [
            # type Directory, not DirectoryOrCreate: a node without the warmed weights must fail the pod
            # loudly instead of serving from an empty directory created on the root EBS volume.
            {"name": "weights", "hostPath": {"path": p.model_dir, "type": "Directory"}},
            {"name": "compile-cache", "hostPath": {"path": p.compile_cache_dir, "type": "DirectoryOrCreate"}},
        ],
    }
    if p.compile_cache.publisher:
        # The writer's identity (Pod Identity association or IRSA annotation), never the namespace's default.
        # A ServiceAccount is per pod: the vLLM container shares it (README, "AWS identity").
        spec["serviceAccountName"] = identity.publisher_service_account(p)
        spec["containers"].append(publisher_container(p, env(p)))
        spec["volumes"].append({"name": "signing-key", "secret": {
            "secretName": p.compile_cache.publisher.signing_key_secret, "defaultMode": 0o400}})
    return spec


def deployment(p: WarmProfile) -> dict:
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
            "template": {"metadata": {"labels": {**lab, GENERATION_LABEL: generation(p)}}, "spec": pod_spec(p)},
        },
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
