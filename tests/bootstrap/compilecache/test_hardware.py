"""This node's hardware for the compile-cache key: from /proc (fixture host trees) and the Node's labels."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodewarm.bootstrap.compilecache import hardware
from support import paths

HOSTS = paths.FIXTURES / "hosts"
L40S_LABELS = {"node.kubernetes.io/instance-type": "g6e.xlarge", "karpenter.k8s.aws/instance-gpu-name": "l40s",
               "karpenter.k8s.aws/instance-gpu-count": "1"}


def test_h100_node_from_proc():
    hw = hardware.probe(HOSTS / "p5-h100-avx512", {"node.kubernetes.io/instance-type": "p5.48xlarge"}, {})
    assert (hw.gpu_model, hw.gpu_count, hw.gpu_capability, hw.driver) == ("h100", 2, "9.0", "570.133.20")
    assert hw.cpu_isa == "avx512 avx512_vnni amx_tile" and hw.cpu_threads == 0
    assert hw.instance_type == "p5.48xlarge" and hw.sources == ("cpuinfo", "proc-driver-nvidia")


def test_l40s_node_from_labels_when_proc_shows_no_driver():
    hw = hardware.probe(HOSTS / "g6e-l40s-avx2", L40S_LABELS, {})
    assert (hw.gpu_model, hw.gpu_count, hw.gpu_capability, hw.cpu_isa) == ("l40s", 1, "8.9", "avx2")
    assert hw.sources == ("cpuinfo", "node-labels")


def test_every_source_names_a_gpu_the_same_way():
    names = ["NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", "h100", "NVIDIA H100 NVL"]
    assert {hardware.gpu_family(n) for n in names} == {"h100"}
    assert hardware.gpu_family("Tesla T4") == "t4" and hardware.gpu_family("NVIDIA A10G") == "a10g"
    assert hardware.gpu_family("NVIDIA L40S") == "l40s" and hardware.gpu_family("NVIDIA GH200 480GB") == "gh200"


def test_gpu_feature_discovery_labels_win_over_the_family_table():
    labels = {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "4",
              "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "9"}
    hw = hardware.from_sources(cpuinfo="flags : avx2 fma\n", env={}, labels=labels)
    assert (hw.gpu_model, hw.gpu_count, hw.gpu_capability) == ("l40s", 4, "8.9")


def test_nvml_is_the_first_source():
    hw = hardware.from_sources(cpuinfo="flags : avx2 fma\n", env={}, labels=L40S_LABELS,
                               proc_models=("NVIDIA L40S",), nvml=(("NVIDIA H200", "9.0"),) * 8, nvml_driver="580.1")
    assert (hw.gpu_model, hw.gpu_count, hw.gpu_capability, hw.driver) == ("h200", 8, "9.0", "580.1")


@pytest.mark.parametrize("cap, expect", [("", "avx512 avx512_vnni amx_tile"), ("avx2", "avx2"), ("default", "none"),
                                         ("bogus", "avx512 avx512_vnni amx_tile")])
def test_the_serving_envs_cpu_capability_caps_the_isa(cap, expect):
    env = {"ATEN_CPU_CAPABILITY": cap} if cap else {}
    assert hardware.probe(HOSTS / "m7i-cpu-avx512", None, env).cpu_isa == expect


def test_cpu_only_node_keys_its_core_count():
    hw = hardware.probe(HOSTS / "m7i-cpu-avx512", None, {})
    assert (hw.gpu_model, hw.gpu_count, hw.cpu_threads) == ("", 0, 2)


def test_a_host_without_proc_is_an_unknown_cpu_not_a_crash(tmp_path):
    hw = hardware.probe(tmp_path, None, {})
    assert (hw.cpu_isa, hw.gpu_model) == ("none", "")
