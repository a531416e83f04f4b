"""This node's hardware, as the compile-cache key needs it: read from the node itself, never from a descriptor.

Compiled kernels are machine code for one CPU vector ISA and one GPU architecture. A runtime descriptor
written by a publisher on *another* node says nothing about this one, so the key's hardware half always
comes from here, on the node agent and in the publisher alike (same function, same vocabulary):

* GPU: NVML when the library loads, else ``/proc/driver/nvidia`` (the kernel module's own view), else the
  Node's labels (``nvidia.com/gpu.product`` from GPU feature discovery, Karpenter's
  ``karpenter.k8s.aws/instance-gpu-name`` / ``-gpu-count``). Models are reduced to their family
  (``NVIDIA H100 80GB HBM3`` -> ``h100``), the one spelling every source can give.
* compute capability: NVML, GFD's ``nvidia.com/gpu.compute.major/minor`` labels, else the family's.
* CPU ISA from ``/proc/cpuinfo`` flags, named as Inductor's ``pick_vec_isa`` names it, capped by the
  serving env's ``ATEN_CPU_CAPABILITY`` as Inductor caps it.

``parse_*`` and ``from_sources`` are pure; ``probe`` reads ``host_root`` (a fixture tree in tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from nodewarm.api.names import INSTANCE_TYPE_LABEL

GPU_NAME_LABEL = "karpenter.k8s.aws/instance-gpu-name"
GPU_COUNT_LABEL = "karpenter.k8s.aws/instance-gpu-count"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_GFD_LABEL = "nvidia.com/gpu.count"
CC_MAJOR_LABEL, CC_MINOR_LABEL = "nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor"

# NVIDIA's published compute capabilities of the GPU families EC2 offers.
_CAPABILITY = {
    "k80": "3.7", "m60": "5.2", "v100": "7.0", "t4": "7.5", "t4g": "7.5", "a10": "8.6", "a10g": "8.6",
    "a100": "8.0", "l4": "8.9", "l40": "8.9", "l40s": "8.9", "h100": "9.0", "h200": "9.0", "gh200": "9.0",
    "b200": "10.0", "gb200": "10.0",
}
_FAMILY = re.compile(r"\b(g?[a-z]\d{1,3}[a-z]?)\b")


@dataclass(frozen=True)
class NodeHardware:
    gpu_model: str = ""          # family, lower case ("h100", "l40s"); "" without a GPU
    gpu_count: int = 0
    gpu_capability: str = ""     # "9.0"; "" when unknown
    driver: str = ""             # kernel module version: reported, not keyed (cubins target the capability)
    cpu_isa: str = "none"        # as Inductor names it: "avx512 avx512_vnni amx_tile", "avx512", "avx2", "asimd"
    cpu_threads: int = 0         # physical cores: torch's default thread count, in CPU kernels' keys
    instance_type: str = ""
    sources: tuple[str, ...] = ()


def gpu_family(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` / ``NVIDIA-H100-80GB-HBM3`` / ``h100`` -> ``h100``; ``Tesla T4`` -> ``t4``."""
    text = re.sub(r"[^a-z0-9]+", " ", name.lower()).replace("nvidia", " ").replace("tesla", " ")
    m = _FAMILY.search(text)
    return m.group(1) if m else text.strip().replace(" ", "-")


def parse_cpuinfo(text: str) -> tuple[str, int]:
    """(vector ISA, physical cores) from /proc/cpuinfo."""
    flags: set[str] = set()
    cores: set[tuple[str, str]] = set()
    processors = 0
    phys = core = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features") and not flags:
            flags = set(value.split())
        elif key == "processor":
            processors += 1
        elif key == "physical id":
            phys = value.strip()
        elif key == "core id":
            core = value.strip()
            cores.add((phys, core))
    if {"avx512f", "avx512dq", "avx512vl", "avx512bw"} <= flags:
        isa = "avx512"
        if "avx512_vnni" in flags:
            isa += " avx512_vnni"
            if {"amx_tile", "amx_bf16", "amx_int8"} <= flags:
                isa += " amx_tile"
    elif {"avx2", "fma"} <= flags:
        isa = "avx2"
    elif "asimd" in flags:
        isa = "asimd"
    else:
        isa = "none"
    return isa, len(cores) or processors


def capped_isa(isa: str, env: Mapping[str, str]) -> str:
    """What Inductor picks when the serving env sets ATEN_CPU_CAPABILITY (an unusable value is ignored)."""
    cap = env.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if cap == "default":
        return "none"
    if cap == "avx2" and isa.startswith(("avx512", "avx2")):
        return "avx2"
    return isa


def parse_driver(version_text: str) -> str:
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", version_text)
    return m.group(1) if m else ""


def parse_gpu_information(text: str) -> str:
    m = re.search(r"^Model:\s*(.+)$", text, re.MULTILINE)
    return m.group(1).strip() if m else ""


def from_sources(*, cpuinfo: str, env: Mapping[str, str], labels: Mapping[str, str] | None = None,
                 proc_models: tuple[str, ...] = (), driver_version: str = "",
                 nvml: tuple[tuple[str, str], ...] = (), nvml_driver: str = "") -> NodeHardware:
    """Combine what the node says, most direct source first. ``nvml`` holds (name, "major.minor") per GPU."""
    labels = labels or {}
    isa, cores = parse_cpuinfo(cpuinfo)
    sources = ["cpuinfo"]
    model, count, capability = "", 0, ""
    if nvml:
        model, count, capability = gpu_family(nvml[0][0]), len(nvml), nvml[0][1]
        sources.append("nvml")
    elif proc_models:
        model, count = gpu_family(proc_models[0]), len(proc_models)
        sources.append("proc-driver-nvidia")
    elif labels.get(GPU_PRODUCT_LABEL) or labels.get(GPU_NAME_LABEL):
        model = gpu_family(labels.get(GPU_PRODUCT_LABEL) or labels[GPU_NAME_LABEL])
        raw = labels.get(GPU_COUNT_GFD_LABEL) or labels.get(GPU_COUNT_LABEL) or "0"
        count = int(raw) if raw.isdigit() else 0
        sources.append("node-labels")
    if model and not capability:
        major, minor = labels.get(CC_MAJOR_LABEL, ""), labels.get(CC_MINOR_LABEL, "")
        capability = f"{major}.{minor}" if major.isdigit() and minor.isdigit() else _CAPABILITY.get(model, "")
    return NodeHardware(gpu_model=model, gpu_count=count, gpu_capability=capability,
                        driver=nvml_driver or parse_driver(driver_version), cpu_isa=capped_isa(isa, env),
                        cpu_threads=0 if model else cores, instance_type=labels.get(INSTANCE_TYPE_LABEL, ""),
                        sources=tuple(sources))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _nvml() -> tuple[tuple[tuple[str, str], ...], str]:
    """GPUs through NVML when its Python binding and library load; nothing otherwise."""
    try:
        import pynvml
    except ImportError:
        return (), ""
    try:
        pynvml.nvmlInit()
    except Exception:       # the binding is there but no driver library / no GPU: other sources decide
        return (), ""
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            gpus.append((name.decode() if isinstance(name, bytes) else name, f"{major}.{minor}"))
        driver = pynvml.nvmlSystemGetDriverVersion()
        return tuple(gpus), driver.decode() if isinstance(driver, bytes) else driver
    finally:
        pynvml.nvmlShutdown()


def probe(host_root: Path = Path("/"), labels: Mapping[str, str] | None = None,
          env: Mapping[str, str] | None = None, use_nvml: bool = True) -> NodeHardware:
    """This node's hardware. ``env`` is the *serving* env (its ATEN_CPU_CAPABILITY caps the ISA)."""
    nvidia = Path(host_root) / "proc/driver/nvidia"
    infos = sorted((nvidia / "gpus").glob("*/information")) if (nvidia / "gpus").is_dir() else []
    models = tuple(m for m in (parse_gpu_information(_read(p)) for p in infos) if m)
    nvml, nvml_driver = _nvml() if use_nvml and Path(host_root) == Path("/") else ((), "")
    return from_sources(cpuinfo=_read(Path(host_root) / "proc/cpuinfo"), env=env or {}, labels=labels,
                        proc_models=models, driver_version=_read(nvidia / "version"), nvml=nvml,
                        nvml_driver=nvml_driver)
