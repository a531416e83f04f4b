"""The compile-cache key: which runtime a cache bundle was built by, and whether this node may use it.

Getting the key wrong is silent: Inductor's own keys omit the CPU vector ISA (a cache built with
AVX-512 and run where AVX2 is picked hits and returns NaN), and its C++ ``.so`` keys embed absolute
install paths. So a bundle records every factor that feeds vLLM's hash-dir name or Inductor's keys,
plus the ones Inductor forgets, and a node refuses any bundle that differs in one of them.

The key has two halves from two places. Hardware (GPU family, count, compute capability, CPU ISA) always
comes from the node that compiles or restores (hardware.probe), never from another node's record. Software
(torch, triton, vLLM builds and paths) comes from the serving image: ``probe_runtime`` run with the serving
image's Python, or the signed per-image descriptor a publisher wrote from it. Pure functions take both as
arguments.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Mapping

from nodewarm.api.servingspec import ServingSpec

if TYPE_CHECKING:
    from .hardware import NodeHardware

FORMAT = "nodewarm.compile-cache/v2"

# Environment variables that feed vLLM's env hash or Inductor's config (and so the cache keys).
_ENV_PREFIXES = ("VLLM_", "TORCHINDUCTOR_", "TORCH_COMPILE_", "TRITON_")
_ENV_NAMES = frozenset({"ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS"})
# Locations, endpoints and logging do not change what gets compiled (vLLM ignores the same kinds,
# and the measurements in docs/compile-cache.md show the cache path is not in any key).
_ENV_IGNORED = frozenset({
    "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "VLLM_RPC_BASE_PATH", "VLLM_CONFIGURE_LOGGING",
    "VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH", "VLLM_LOGGING_PREFIX", "VLLM_LOG_STATS_INTERVAL",
    "VLLM_TRACE_FUNCTION", "VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK", "VLLM_USAGE_SOURCE",
    "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR",
    "TORCHINDUCTOR_COMPILE_THREADS", "TORCHINDUCTOR_WORKER_START",
})
_ENV_IGNORED_SUFFIXES = ("_PORT", "_HOST", "_IP", "_ADDR", "_URL", "_URI")
# Values of these never leave the node: the manifest holds a digest so a difference still shows.
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{16}$")


@dataclass(frozen=True)
class RuntimeProbe:
    """What the serving image's software is (no hardware: that is the node's, see hardware.py)."""

    torch_version: str
    torch_build: str          # torch_key(): hash of the torch version and every torch source file
    cuda: str                 # torch.version.cuda (or HIP); "" on CPU builds
    triton: str               # "" when triton is not installed
    triton_build: str         # triton_key(): feeds Inductor's get_system() on GPU
    vllm: str                 # "" when vllm is not installed
    vllm_path: str            # vLLM's non-AOT code hash includes traced source file paths
    python_prefix: str        # C++ .so keys embed the python and torch include paths


@dataclass(frozen=True)
class Factors:
    """Everything two nodes must agree on to share a compile cache. Compared field by field."""

    gpu_model: str            # hardware.gpu_family of this node's GPU; "" without one
    gpu_count: int
    gpu_capability: str
    cpu_isa: str              # Inductor's picked vector ISA: not in its own key (the NaN hazard)
    cpu_threads: int          # in Inductor's key for CPU C++ kernels built without dynamic threads
    cuda: str
    torch_version: str
    torch_build: str
    triton: str
    triton_build: str
    vllm: str
    vllm_path: str
    python_prefix: str
    model: str
    revision: str
    tp: int
    pp: int
    image: str
    engine: Mapping[str, str]
    env: Mapping[str, str]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["engine"], d["env"] = dict(sorted(self.engine.items())), dict(sorted(self.env.items()))
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Factors":
        return _from_fields(cls, d, "factors")


@dataclass(frozen=True)
class Mismatch:
    field: str
    node: Any
    bundle: Any

    def __str__(self) -> str:
        return f"{self.field}: node={self.node!r} bundle={self.bundle!r}"


def relevant_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment variables that change compiled code, secrets replaced by a digest.

    Idempotent (a digest stays as it is), so an env captured in the serving image with
    ``key --runtime-only`` gives the same factors as probing there directly.
    """
    out = {}
    for name, value in env.items():
        if not (name.startswith(_ENV_PREFIXES) or name in _ENV_NAMES):
            continue
        if name in _ENV_IGNORED or name.endswith(_ENV_IGNORED_SUFFIXES):
            continue
        if _SECRET.search(name) and not _DIGEST.match(value):
            value = "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16]
        out[name] = value
    return dict(sorted(out.items()))


def vllm_hashed_env() -> frozenset[str] | None:
    """The variables vLLM's own compile hash reads (``vllm.envs.compile_factors``: every variable vLLM knows,
    less its ignore list), or None where vLLM is not importable. Only the serving image can answer."""
    try:
        from vllm import envs
    except ImportError:
        return None
    return frozenset(envs.compile_factors())


def serving_env(env: Mapping[str, str]) -> dict[str, str]:
    """``relevant_env`` as the serving image sees it: less the ``VLLM_*`` variables vLLM's hash leaves out
    (VLLM_FORCE_AOT_LOAD, VLLM_CPU_KVCACHE_SPACE, a name vLLM does not know, ...). Keying on them would only
    keep nodes from sharing caches vLLM itself shares (tests/engine/test_engine_cachekey.py). Where vLLM is not
    importable, every ``VLLM_*`` variable counts: a spurious difference is safe, a missed one is not."""
    out = relevant_env(env)
    hashed = vllm_hashed_env()
    if hashed is None:
        return out
    return {k: v for k, v in out.items() if not k.startswith("VLLM_") or k in hashed}


def build_factors(probe: RuntimeProbe, hw: "NodeHardware", spec: ServingSpec, env: Mapping[str, str]) -> Factors:
    """Software from the serving image, hardware from this node (hardware.probe), the serving spec."""
    return Factors(
        gpu_model=hw.gpu_model, gpu_count=hw.gpu_count, gpu_capability=hw.gpu_capability,
        # Thread count only keys CPU C++ kernels; on a GPU node it would refuse bundles for nothing.
        cpu_isa=hw.cpu_isa, cpu_threads=hw.cpu_threads if not hw.gpu_model else 0, cuda=probe.cuda,
        torch_version=probe.torch_version, torch_build=probe.torch_build,
        triton=probe.triton, triton_build=probe.triton_build, vllm=probe.vllm, vllm_path=probe.vllm_path,
        python_prefix=probe.python_prefix,
        model=spec.model, revision=spec.revision, tp=spec.tp, pp=spec.pp, image=spec.image,
        engine={str(k): str(v) for k, v in sorted(spec.engine.items())}, env=relevant_env(env),
    )


def canonical_json(obj: Any) -> bytes:
    """The one byte form used for hashing and signing."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def key_id(factors: Factors) -> str:
    """Short digest of all factors: the bundle's name under its prefix."""
    return hashlib.sha256(canonical_json(factors.to_dict())).hexdigest()[:16]


def _slug(text: str, limit: int = 64) -> str:
    s = re.sub(r"[^a-z0-9._+@-]+", "-", text.lower()).strip("-.") or "none"
    if len(s) > limit:
        # Keep the start readable, and a digest so two long names do not collide after cutting.
        s = s[: limit - 9].rstrip("-.") + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return s


def prefix(factors: Factors, root: str = "") -> str:
    """Human-readable S3 prefix: an operator can see which runtime and model a bundle is for.

    <root>/v2/cuda-<v>/torch-<v>+<build12>/vllm-<v>/<model>@<rev>/tp<N>-pp<M>/image-<image12>/<gpu>x<count>/
    The hardware comes last, so a node finds the bundles of the same software and model built on other
    hardware beside its own and can name how they differ. Factors not shown here (ISA, paths, env, engine
    flags) are in the manifest and in ``key_id``.
    """
    image = factors.image.split(":")[-1] if factors.image else ""
    parts = [
        "v2",
        "cuda-" + _slug(factors.cuda or "none"),
        "torch-" + _slug(factors.torch_version) + "+" + factors.torch_build[:12],
        "vllm-" + _slug(factors.vllm or "none"),
        _slug(factors.model, 96) + "@" + _slug(factors.revision or "none", 40),
        f"tp{factors.tp}-pp{factors.pp}",
        "image-" + (_slug(image)[:12] if image else "none"),
        _slug(factors.gpu_model or "cpu") + f"x{factors.gpu_count}",
    ]
    root = root.strip("/")
    return (root + "/" if root else "") + "/".join(parts) + "/"


def compare(node: Factors, bundle: Mapping[str, Any]) -> list[Mismatch]:
    """Every factor where the bundle differs from this node (env and engine flags one by one)."""
    mine = node.to_dict()
    out: list[Mismatch] = []
    for name, value in mine.items():
        theirs = bundle.get(name)
        if isinstance(value, dict):
            theirs = theirs if isinstance(theirs, Mapping) else {}
            for k in sorted(set(value) | set(theirs)):
                if value.get(k) != theirs.get(k):
                    out.append(Mismatch(f"{name}.{k}", value.get(k), theirs.get(k)))
        elif theirs != value:
            out.append(Mismatch(name, value, theirs))
    return out


def probe_runtime() -> RuntimeProbe:
    """Read the live runtime's software. Imports torch, so run it in the serving image."""
    import torch
    from torch._inductor.codecache import torch_key

    cuda = torch.version.cuda or getattr(torch.version, "hip", None) or ""
    triton = triton_build = ""
    try:
        import triton as _triton
        from torch.utils._triton import triton_key

        triton, triton_build = _triton.__version__, triton_key()
    except ImportError:
        pass
    vllm = vllm_path = ""
    try:
        import vllm as _vllm

        vllm, vllm_path = _vllm.__version__, os.path.dirname(_vllm.__file__)
    except ImportError:
        pass
    return RuntimeProbe(
        torch_version=torch.__version__, torch_build=torch_key().hex(), cuda=cuda,
        triton=triton, triton_build=triton_build, vllm=vllm, vllm_path=vllm_path,
        python_prefix=sys.prefix,
    )


def _from_fields(cls, d: Mapping[str, Any], what: str):
    """A frozen dataclass from its dict form, refusing one that lacks a field (a silently defaulted
    factor would make two different runtimes share a key)."""
    names = {f.name for f in fields(cls)}
    missing = names - set(d)
    if missing:
        raise ValueError(f"{what} lack {sorted(missing)}")
    return cls(**{k: d[k] for k in names})


def probe_from_dict(d: Mapping[str, Any]) -> RuntimeProbe:
    """A probe written by ``nodewarm bootstrap compile-cache key --runtime-only`` in the serving image."""
    return _from_fields(RuntimeProbe, d, "runtime probe")


@dataclass(frozen=True)
class BundleManifest:
    """What a published bundle claims: the factors it was built under, its archive and contents.

    Signed as a whole (signing.seal); the archive's sha256 and size pin its bytes.
    """

    factors: Mapping[str, Any]
    key_id: str
    blob_key: str
    sha256: str
    size: int
    files: int
    unpacked_bytes: int
    roots: tuple[str, ...]
    hash_dirs: tuple[str, ...]     # vLLM hash dir names inside (the ground truth for a vLLM hit)
    graphs: tuple[str, ...]        # Inductor FX graph keys inside
    producer: Mapping[str, str]    # node, instance type, time: for operators, never compared
    generation: int = 1            # 1 for the first bundle of a key; +1 each time a stale one is replaced

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(roots=list(self.roots), hash_dirs=list(self.hash_dirs), graphs=list(self.graphs),
                 factors=dict(self.factors), producer=dict(self.producer))
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BundleManifest":
        names = {f.name for f in fields(cls)}
        missing = names - set(d)
        if missing:
            raise ValueError(f"manifest lacks {sorted(missing)}")
        if not isinstance(d["generation"], int) or d["generation"] < 1:
            raise ValueError(f"manifest generation {d['generation']!r} is not a positive integer")
        kw = {k: d[k] for k in names}
        for k in ("roots", "hash_dirs", "graphs"):
            kw[k] = tuple(kw[k])
        return cls(**kw)
