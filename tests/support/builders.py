"""The cluster objects tests feed to the renderer, the controller, `nodewarm status` and the agent, built one way:
WarmProfile documents (a valid base per mode, changed field by field), NodeClaims as Karpenter writes them and
Nodes as the kubelet registers them. Times are epoch seconds, written as the API server writes metav1.Time."""

from __future__ import annotations

import copy
from datetime import datetime, timezone
from typing import Iterable

from nodewarm.api import defaults, names

POOL = "gpu-p5"
INSTANCE_TYPE = "p5.48xlarge"
TAINT = {"key": defaults.TAINT_KEY, "effect": "NoSchedule"}
# What every kubelet writes on its Node besides the labels (nodewarm reads none of it; a real Node has it).
KUBELET_ANNOTATIONS = {"node.alpha.kubernetes.io/ttl": "0",
                       "volumes.kubernetes.io/controller-managed-attach-detach": "true"}

# A user's own AL2023 user data (a MIME archive with one shell part) that nodewarm must keep.
USER_MIME = """MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="//"

--//
Content-Type: text/x-shellscript; charset="us-ascii"

#!/bin/bash
echo user-part-one > /etc/user-one

--//--
"""

BASE = {
    "apiVersion": "nodewarm.io/v1alpha1",
    "kind": "WarmProfile",
    "metadata": {"name": "qwen3-35b"},
    "spec": {
        "model": {"uri": "s3://models-bucket/qwen3-35b/", "sizeGB": 67},
        "serving": {"image": "vllm/vllm-openai:v0.21.0", "tensorParallelSize": 2, "maxModelLen": 8192,
                    "chunkSizeGB": 4},
        "nodes": {"mode": "karpenter", "nodePool": POOL, "nodeClass": POOL,
                  "instanceTypes": [INSTANCE_TYPE], "role": "KarpenterNodeRole-my-cluster", "region": "us-west-2",
                  "amiAlias": "al2023@v20241011",
                  "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "my-cluster"}}],
                  "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "my-cluster"}}]},
        "compileCache": {"uri": "s3://cache-bucket/compile-cache/"},
        "readiness": {"taintKey": defaults.TAINT_KEY, "deadline": "20m", "onDeadline": "untaint"},
        "bootstrap": {"artifactUri": "s3://cache-bucket/nodewarm/nodewarm-0.1.0.pyz",
                      "artifactSha256": "a" * 64, "image": "registry.example/nodewarm:0.1.0"},
        # Used where a nodewarm pod needs AWS (Auto Mode / Bottlerocket DaemonSet, the publisher sidecar).
        "aws": {"clusterName": "my-cluster", "agentRoleArn": "arn:aws:iam::111122223333:role/nodewarm-agent",
                "publisherRoleArn": "arn:aws:iam::111122223333:role/nodewarm-publisher"},
    },
}

# A compile cache in a bucket that does not exist: the agent warms without one.
NO_CACHE = "s3://nocache-bucket/cc/"


def v(mode: str = "karpenter", **changes) -> dict:
    """A WarmProfile document: a copy of BASE for ``mode``; each keyword is a path under the document with '__'
    for '.' (``spec__model__sizeGB=1``, ``metadata__name="x"``) and its new value (None deletes the key)."""
    doc = copy.deepcopy(BASE)
    doc["spec"]["nodes"]["mode"] = mode
    if mode == "automode":
        del doc["spec"]["nodes"]["amiAlias"]        # Auto Mode picks the AMI itself
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node_ = doc
        for key in parents:
            node_ = node_.setdefault(key, {})
        if value is None:
            node_.pop(leaf, None)
        else:
            node_[leaf] = copy.deepcopy(value)     # a shared dict given twice must not change in between
    return doc


def stamp(t: float) -> str:
    """``t`` as a metav1.Time: RFC3339 in UTC, whole seconds."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, status: str, reason: str = "", at: float | None = None, message: str = "") -> dict:
    c = {"type": type_, "status": status, "reason": reason, "message": message}
    if at is not None:
        c["lastTransitionTime"] = stamp(at)
    return c


def nodeclaim(name: str = "c1", *, created: float, launched: float | None = None, registered: float | None = None,
              deleting: float | None = None, pool: str = POOL, uid: str | None = None,
              provider_id: str | None = None, instance_type: str = INSTANCE_TYPE, gpus: int | str = 8) -> dict:
    """A NodeClaim of ``pool`` with the startup taint, as Karpenter has it: awaiting launch until ``launched``,
    then with its instance (``provider_id``, by default an instance id from the name), registered at
    ``registered``; ``deleting``: when its deletion started (its termination finalizer holds it)."""
    conds = [condition("Launched", "Unknown", "AwaitingReconciliation", created, "object is awaiting reconciliation")]
    status: dict = {}
    if launched is not None:
        status = {"providerID": provider_id or f"aws:///us-west-2a/i-{name[-6:]}", "imageID": "ami-0123456789abcdef0",
                  "capacity": {"nvidia.com/gpu": str(gpus)}}
        conds = [condition("Launched", "True", "Launched", launched),
                 condition("Registered", "Unknown", "AwaitingReconciliation", launched)]
        if registered is not None:
            conds[1] = condition("Registered", "True", "Registered", registered)
    md = {"name": name, "uid": uid or f"uid-{name}", "creationTimestamp": stamp(created), "resourceVersion": "4711",
          "labels": {names.NODEPOOL_LABEL: pool, names.INSTANCE_TYPE_LABEL: instance_type,
                     "karpenter.sh/capacity-type": "on-demand"},
          "finalizers": ["karpenter.sh/termination"]}
    if deleting is not None:
        md["deletionTimestamp"] = stamp(deleting)
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": md,
            "spec": {"startupTaints": [dict(TAINT)],
                     "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": pool}},
            "status": {**status, "conditions": conds}}


def node(name: str = "n1", *, claim: dict | None = None, created: float | None = None, pool: str | None = None,
         provider_id: str | None = None, uid: str | None = None, taints: Iterable[dict] = (TAINT,),
         warm: dict | str | None = None, warm_at: float | None = None, labels: dict | None = None,
         annotations: dict | None = None, instance_type: str | None = INSTANCE_TYPE, gpus: int | str | None = 8,
         resource_version: str | None = None) -> dict:
    """A Node as its kubelet registered it (Ready, its hostname and instance-type labels, its annotations, the
    GPUs it advertises: None for none yet) in ``pool``: by default ``claim``'s, whose instance it is.
    ``taints``: exactly the list stored, each copied; ``warm``: the agent's Warm condition, whole or its status
    (then reason WeightsVerified, message "ok", at ``warm_at``); ``labels``/``annotations`` are added to the
    kubelet's."""
    if claim is not None:
        pool = pool or claim["metadata"]["labels"][names.NODEPOOL_LABEL]
        provider_id = provider_id or claim["status"]["providerID"]
    ready = condition("Ready", "True", "KubeletReady", None if created is None else created + 5,
                      "kubelet is posting ready status")
    conds = [ready]
    if isinstance(warm, str):
        warm = condition(names.WARM_CONDITION, warm, "WeightsVerified", warm_at, "ok")
    if warm:
        conds.append(warm)
    md = {"name": name, "uid": uid or f"uid-{name}",
          "labels": {names.NODEPOOL_LABEL: pool or POOL,
                     **({names.INSTANCE_TYPE_LABEL: instance_type} if instance_type else {}),
                     "kubernetes.io/hostname": name, **(labels or {})},
          "annotations": {**KUBELET_ANNOTATIONS, **(annotations or {})}}
    if created is not None:
        md["creationTimestamp"] = stamp(created)
    if resource_version is not None:
        md["resourceVersion"] = resource_version
    allocatable = {"cpu": "191", **({"nvidia.com/gpu": str(gpus)} if gpus is not None else {})}
    return {"apiVersion": "v1", "kind": "Node", "metadata": md,
            "spec": {"providerID": provider_id or f"aws:///us-west-2a/i-{name}", "taints": [dict(t) for t in taints]},
            "status": {"conditions": conds, "allocatable": allocatable}}
