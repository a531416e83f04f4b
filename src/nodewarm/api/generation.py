"""What a node must hold for a WarmProfile, and the short names the renderer and the node agent derive from it.

The renderer puts these names into the vLLM Deployment (a nodeSelector on ``names.GENERATION_LABEL``, the
hostPath of the weights); the node agent computes the same names from the same WarmProfile object at boot and labels
its Node when it holds that generation. Both sides call these functions, so they cannot disagree.

Nothing here may reach a node object (EC2NodeClass, NodeClass, NodePool): Karpenter hashes those, and a
serving change would then replace every node (see nodewarm/karpenter/drift.py).
"""

from __future__ import annotations

import hashlib
import json

from .warmprofile import WarmProfile


def _digest(doc: dict, length: int) -> str:
    canon = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:length]


def model_identity(p: WarmProfile) -> dict:
    return {"uri": p.model.uri, "revision": p.model.revision}


def model_key(p: WarmProfile) -> str:
    """Names the weights' directory. Only the model's identity is in it: a new serving image or TP re-uses
    the weights already on NVMe instead of pulling 60-600 GB again."""
    return _digest(model_identity(p), 12)


def content(p: WarmProfile) -> dict:
    """Everything that changes what the node must hold before a pod of this profile may start there:
    the weights, and the compile caches, whose key depends on the serving runtime and engine settings."""
    s = p.serving
    return {
        "model": model_identity(p),
        "serving": {"image": s.image, "tensorParallelSize": s.tensor_parallel_size, "dtype": s.dtype,
                    "maxModelLen": s.max_model_len, "extraArgs": list(s.extra_args)},
        "compileCache": {"uri": p.compile_cache.uri, "verifyKey": p.compile_cache.verify_key},
    }


def generation(p: WarmProfile) -> str:
    """The label value a node carries when it is warm for this content (16 hex digits: a valid label value)."""
    return _digest(content(p), 16)
