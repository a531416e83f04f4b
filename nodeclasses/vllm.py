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


def publisher_container(p: WarmProfile, serving_env: list[dict]) -> dict:
    """`nodewarm publish` beside vLLM: when the first compile on this node goes quiet it packs the caches,
    signs them and uploads once (first writer wins); then it idles, so the pod does not restart it.
    It runs the serving image (with nodewarm installed) because the key must describe the serving
    runtime, and it gets vLLM's environment because VLLM_*/TORCHINDUCTOR_* variables are part of the key.
    """
    from .launch import serving_spec_args

    pub = p.compile_cache.publisher
    d = cache_dirs(CACHE_MOUNT)
    # The pod cannot read instance metadata (hop limit 1): the buckets' region is spelled out.
    region = [{"name": "AWS_REGION", "value": p.nodes.region}, {"name": "AWS_DEFAULT_REGION", "value": p.nodes.region}]
    argv = ["nodewarm", "publish", "--uri", p.compile_cache.uri, "--signing-key", f"{SIGNING_MOUNT}/signing.pem",
            "--quiet-seconds", str(pub.quiet_seconds), "--model", model_path(p.name), *serving_spec_args(p),
            "--vllm-cache-root", str(d["vllm"]), "--inductor-dir", str(d["inductor"]),
            "--triton-dir", str(d["triton"]), "--pch-dir", str(d["pch"])]
    return {
        "name": "nodewarm-publish",
        "image": pub.image,
        "command": ["sh", "-c", 'nodewarm "$@"; exec sleep infinity', "nodewarm-publish"],
        "args": argv[1:],
        "env": serving_env + region,
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


def labels(p: WarmProfile) -> dict:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": p.name, PROFILE_LABEL: p.name}


def pod_spec(p: WarmProfile) -> dict:
    s = p.serving
    gpus = str(s.tensor_parallel_size)
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
