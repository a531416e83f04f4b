"""Where the vLLM pod finds its weights and keeps its compile caches.

The renderer mounts these paths, the node agent fills their host side before the pod lands, and the
publisher packs them. The model path is also part of the compile-cache key (vLLM hashes its model
string), so all three must take it from here.
"""

from __future__ import annotations

from pathlib import PurePosixPath

MODEL_MOUNT = "/models"          # the warmed weights: /models/<profile>
CACHE_MOUNT = "/compile-cache"   # hostPath <NVMe mount>/compile-cache
POD_USER = "root"                # the vLLM image's user: Inductor names its headers dir after it


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
