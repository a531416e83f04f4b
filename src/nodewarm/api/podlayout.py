"""Where the weights and the compile caches are, on the node and in the vLLM pod.

The renderer mounts these paths, the node agent fills their host side before the pod lands, and the
publisher packs them. The model path is also part of the compile-cache key (vLLM hashes its model
string), so all three must take it from here.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from .generation import model_key
from .warmprofile import WarmProfile

MODEL_MOUNT = "/models"          # the warmed weights: /models/<profile>
CACHE_MOUNT = "/compile-cache"   # hostPath <NVMe mount>/compile-cache
CACHE_DIR = "compile-cache"      # the host side's folder on the NVMe mount
POD_USER = "root"                # the vLLM image's user: Inductor names its headers dir after it
# Where the node agent saves the post-restore snapshot (hitcheck.Baseline) and the publisher reads it: beside the
# cache roots, not in one.
BASELINE_FILE = "nodewarm-baseline.json"


def model_path(profile: str) -> str:
    return f"{MODEL_MOUNT}/{profile}"


def cache_dirs(base) -> dict[str, PurePosixPath]:
    """The cache directories under ``base`` (the pod's CACHE_MOUNT, or its host side on the node):
    XDG_CACHE_HOME (vLLM's root is its vllm/), TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, TMPDIR, and
    Inductor's precompiled headers, which it keeps under $TMPDIR whatever TORCHINDUCTOR_CACHE_DIR says."""
    base = PurePosixPath(base)
    return {
        "xdg": base,
        "vllm": base / "vllm",
        "inductor": base / "inductor",
        "triton": base / "triton",
        "tmp": base / "tmp",
        "pch": base / "tmp" / f"torchinductor_{POD_USER}" / "precompiled_headers",
    }


# Under the NVMe mount: one folder per profile (and per further model's view, api.models), each with one subfolder
# per model identity (generation.model_key).
MODELS_ROOT = "nodewarm/models"


def models_dir(p: WarmProfile) -> str:
    """The profile's folder of weights on the node: one subfolder per model identity (generation.model_key)."""
    return f"{p.nodes.cache_mount}/{MODELS_ROOT}/{p.name}"


def model_dir(p: WarmProfile) -> str:
    """Where this model's weights land on the node, and where vLLM reads them from."""
    return f"{models_dir(p)}/{model_key(p)}"


def compile_cache_dir(p: WarmProfile) -> str:
    """The hostPath vLLM's XDG_CACHE_HOME / Inductor / Triton caches live in (the AWS guide's layout)."""
    return f"{p.nodes.cache_mount}/{CACHE_DIR}"
