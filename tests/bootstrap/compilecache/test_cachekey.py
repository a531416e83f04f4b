"""The compile-cache key: which factors it holds, the readable prefix, and naming every mismatch."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from nodewarm.api.servingspec import ServingSpec
from nodewarm.bootstrap.compilecache import cachekey
from nodewarm.bootstrap.compilecache.cachekey import RuntimeProbe
from nodewarm.bootstrap.compilecache.hardware import NodeHardware

PROBE = RuntimeProbe(
    torch_version="2.13.0+cu130", torch_build="d34d1007" * 8, cuda="13.0", triton="3.9.0", triton_build="t" * 64,
    vllm="0.32.0", vllm_path="/usr/lib/python3/site-packages/vllm", python_prefix="/usr",
)
HW = NodeHardware(gpu_model="h100", gpu_count=8, gpu_capability="9.0", cpu_isa="avx512", cpu_threads=96)
SPEC = ServingSpec("s3://models/llama-3.1-8b/", "v1", tp=8, pp=1, image="sha256:" + "ab" * 32,
                   engine={"max_model_len": "8192", "dtype": "bfloat16"})
ENV = {"VLLM_USE_AOT_COMPILE": "1", "VLLM_CACHE_ROOT": "/cache", "VLLM_PORT": "8000", "VLLM_API_KEY": "hunter2",
       "TORCHINDUCTOR_MAX_AUTOTUNE": "1", "TORCHINDUCTOR_CACHE_DIR": "/x", "PATH": "/bin", "HOME": "/root",
       "ATEN_CPU_CAPABILITY": "avx2"}


def test_env_keeps_what_changes_compiled_code_and_hides_secrets():
    env = cachekey.relevant_env(ENV)
    assert set(env) == {"VLLM_USE_AOT_COMPILE", "VLLM_API_KEY", "TORCHINDUCTOR_MAX_AUTOTUNE", "ATEN_CPU_CAPABILITY"}
    assert "hunter2" not in json.dumps(env) and env["VLLM_API_KEY"].startswith("sha256:")
    assert cachekey.relevant_env(env) == env  # a captured env (key --runtime-only) keys the same


def test_thread_count_only_keys_cpu_runtimes():
    assert cachekey.build_factors(PROBE, HW, SPEC, {}).cpu_threads == 0
    cpu = dataclasses.replace(HW, gpu_model="", gpu_count=0)
    assert cachekey.build_factors(PROBE, cpu, SPEC, {}).cpu_threads == 96


def test_prefix_is_readable_and_names_the_runtime():
    p = cachekey.prefix(cachekey.build_factors(PROBE, HW, SPEC, ENV), "compile-cache")
    assert p == ("compile-cache/v2/cuda-13.0/torch-2.13.0+cu130+d34d1007d34d/vllm-0.32.0/"
                 "s3-models-llama-3.1-8b@v1/tp8-pp1/image-abababababab/h100x8/")


def test_long_model_names_stay_distinct():
    a = dataclasses.replace(SPEC, model="s3://bucket/" + "x" * 200 + "/a")
    b = dataclasses.replace(SPEC, model="s3://bucket/" + "x" * 200 + "/b")
    pa, pb = (cachekey.prefix(cachekey.build_factors(PROBE, HW, s, {})) for s in (a, b))
    assert pa != pb and max(len(pa), len(pb)) < 400


def test_key_id_covers_factors_outside_the_prefix():
    base = cachekey.build_factors(PROBE, HW, SPEC, ENV)
    isa = cachekey.build_factors(PROBE, dataclasses.replace(HW, cpu_isa="avx2"), SPEC, ENV)
    flag_spec = dataclasses.replace(SPEC, engine={"max_model_len": "4096", "dtype": "bfloat16"})
    flag = cachekey.build_factors(PROBE, HW, flag_spec, ENV)
    assert cachekey.prefix(base) == cachekey.prefix(isa) == cachekey.prefix(flag)
    assert len({cachekey.key_id(base), cachekey.key_id(isa), cachekey.key_id(flag)}) == 3
    # The same factors in another order are the same key.
    reordered = dataclasses.replace(SPEC, engine={"dtype": "bfloat16", "max_model_len": "8192"})
    shuffled = cachekey.build_factors(PROBE, HW, reordered, dict(reversed(list(ENV.items()))))
    assert cachekey.key_id(shuffled) == cachekey.key_id(base)


def test_compare_names_every_mismatch():
    node = cachekey.build_factors(PROBE, HW, SPEC, ENV)
    other_probe = dataclasses.replace(PROBE, torch_version="2.12.0+cu130")
    other_hw = dataclasses.replace(HW, cpu_isa="avx2", gpu_model="h200")
    bundle = cachekey.build_factors(other_probe, other_hw, dataclasses.replace(SPEC, engine={"dtype": "bfloat16"}),
                                    {**ENV, "VLLM_USE_AOT_COMPILE": "0"}).to_dict()
    found = {m.field: (m.node, m.bundle) for m in cachekey.compare(node, bundle)}
    assert found == {
        "torch_version": ("2.13.0+cu130", "2.12.0+cu130"),
        "cpu_isa": ("avx512", "avx2"),
        "gpu_model": ("h100", "h200"),
        "engine.max_model_len": ("8192", None),
        "env.VLLM_USE_AOT_COMPILE": ("1", "0"),
    }
    assert cachekey.compare(node, node.to_dict()) == []
    no_image = {k: v for k, v in node.to_dict().items() if k != "image"}
    assert [m.field for m in cachekey.compare(node, no_image)] == ["image"]


def test_factors_and_manifest_roundtrip_through_json():
    f = cachekey.build_factors(PROBE, HW, SPEC, ENV)
    assert cachekey.Factors.from_dict(json.loads(json.dumps(f.to_dict()))) == f
    m = cachekey.BundleManifest(f.to_dict(), "k", "p/blobs/x.tar.zst", "00", 1, 2, 3, ("vllm",), ("h",), ("g",),
                                {"node": "n"}, generation=3)
    assert cachekey.BundleManifest.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    with pytest.raises(ValueError, match="generation"):
        cachekey.BundleManifest.from_dict({**m.to_dict(), "generation": 0})
    with pytest.raises(ValueError, match="lacks"):
        cachekey.BundleManifest.from_dict({"key_id": "k"})


@pytest.mark.torch
def test_probe_reads_the_real_software_and_the_node_isa_matches_inductors_pick():
    """Software from the live torch; the ISA read from /proc/cpuinfo names what Inductor picks here, and an
    ATEN_CPU_CAPABILITY in the serving env caps it as Inductor does."""
    from nodewarm.bootstrap.compilecache import hardware

    code = ("import json, dataclasses; from torch._inductor.cpu_vec_isa import pick_vec_isa; "
            "from nodewarm.bootstrap.compilecache import cachekey; "
            "print(json.dumps({**dataclasses.asdict(cachekey.probe_runtime()), 'isa': str(pick_vec_isa())}))")
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    native = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                       check=True).stdout)
    import torch

    assert native["torch_version"] == torch.__version__ and len(native["torch_build"]) == 64
    assert native["python_prefix"] == sys.prefix
    assert hardware.probe(use_nvml=False, env=env).cpu_isa == native.pop("isa")
    assert set(native) == {f.name for f in dataclasses.fields(RuntimeProbe)}
    for cap in ("avx2", "default"):
        forced = json.loads(subprocess.run([sys.executable, "-c", code], env={**env, "ATEN_CPU_CAPABILITY": cap},
                                           capture_output=True, text=True, check=True).stdout)["isa"]
        mine = hardware.probe(use_nvml=False, env={"ATEN_CPU_CAPABILITY": cap}).cpu_isa
        assert (mine, forced) in (("avx2", "avx2"), ("none", "INVALID_VEC_ISA")), (cap, mine, forced)
