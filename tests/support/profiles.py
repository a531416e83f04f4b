"""Profile documents for tests: a valid base per mode, and `variant()` to change one field."""

from __future__ import annotations

import copy

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
        "nodes": {"mode": "karpenter", "nodePool": "gpu-p5", "nodeClass": "gpu-p5",
                  "instanceTypes": ["p5.48xlarge"], "role": "KarpenterNodeRole-my-cluster", "region": "us-west-2",
                  "amiAlias": "al2023@v20241011",
                  "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "my-cluster"}}],
                  "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "my-cluster"}}]},
        "compileCache": {"uri": "s3://cache-bucket/compile-cache/"},
        "readiness": {"taintKey": "nodewarm.io/warming", "deadline": "20m", "onDeadline": "untaint"},
        "bootstrap": {"artifactUri": "s3://cache-bucket/nodewarm/nodewarm-0.1.0.pyz",
                      "artifactSha256": "a" * 64, "image": "registry.example/nodewarm:0.1.0"},
        # Used where a nodewarm pod needs AWS (Auto Mode / Bottlerocket DaemonSet, the publisher sidecar).
        "aws": {"clusterName": "my-cluster", "agentRoleArn": "arn:aws:iam::111122223333:role/nodewarm-agent",
                "publisherRoleArn": "arn:aws:iam::111122223333:role/nodewarm-publisher"},
    },
}


def variant(mode: str = "karpenter", **changes) -> dict:
    """A copy of BASE; ``changes`` maps dotted paths under the document ('spec.model.sizeGB') to values
    (None deletes the key)."""
    doc = copy.deepcopy(BASE)
    doc["spec"]["nodes"]["mode"] = mode
    if mode == "automode":
        del doc["spec"]["nodes"]["amiAlias"]        # Auto Mode picks the AMI itself
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return doc


def v(mode="karpenter", **changes):
    """variant() with '__' in keyword names standing for '.' (Python identifiers can't hold dots)."""
    return variant(mode, **{k.replace("__", "."): val for k, val in changes.items()})
