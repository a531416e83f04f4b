"""nodewarm's compile-cache key changes exactly when vLLM's own compile-cache hash changes.

For each serving setting, nodewarm's key (``key_id`` of the factors its publisher and agent build: the serving
image's software, this node's hardware, the profile's serving spec, the serving env) is compared with the hash
vLLM 0.32 itself names its cache directory by, computed by vLLM's own code in the serving environment from the
rendered pod's argv and env (nodewarm_dev/testenv/vllmhash.py: no engine is booted). A difference either way is a bug:
nodewarm changing alone keeps nodes from sharing caches vLLM would use; vLLM changing alone restores caches
vLLM will not use (and, for Inductor's CPU ISA hazard, ones it would use wrongly).

Settings that only nodewarm keys on, on purpose, are not here: the node's hardware (GPU model and count, CPU ISA,
threads), the torch/triton builds and the install paths; tests/bootstrap/compilecache/test_cachekey.py and
test_compile_freshness.py cover those.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from nodewarm import profile
from nodewarm.bootstrap.compilecache import cachekey, hardware
from nodewarm.api.podlayout import CACHE_MOUNT
from nodewarm.api.servingspec import serving_spec
from nodewarm_dev.testenv import enginenode, podrun, vllmhash
from support.builders import v

pytestmark = [pytest.mark.vllm]

BASE_SERVING = {"image": "registry.example/serving@sha256:" + "1" * 64, "tensorParallelSize": 1,
                "maxModelLen": 512, "dtype": "bfloat16", "port": 18123}


def _doc(name: str = "tiny", model: dict | None = None, **serving) -> dict:
    return v("karpenter", metadata={"name": name}, spec__model=model or {"uri": "s3://models/tiny/", "sizeGB": 0.01},
             spec__serving={**BASE_SERVING, **serving}, spec__compileCache={"uri": "s3://cache-bucket/cc/"})


# (what changes, profile document, extra env of the serving image/runtime, vLLM version); the first is the base.
CASES = [
    ("base", _doc(), {}, None),
    # Settings nodewarm keys on: vLLM's hash must change too.
    ("maxModelLen", _doc(maxModelLen=256), {}, None),
    ("dtype", _doc(dtype="float32"), {}, None),
    ("tensorParallelSize", _doc(tensorParallelSize=2), {}, None),
    ("--max-num-seqs", _doc(extraArgs=["--max-num-seqs=8"]), {}, None),
    ("--max-num-batched-tokens", _doc(extraArgs=["--max-num-batched-tokens", "1024"]), {}, None),
    ("--block-size", _doc(extraArgs=["--block-size=32"]), {}, None),
    ("--enforce-eager", _doc(extraArgs=["--enforce-eager"], allowEager=True), {}, None),
    ("model path (profile name)", _doc(name="tiny2"), {}, None),
    ("vLLM version", _doc(), {}, "0.32.1"),
    ("VLLM_USE_MEGA_AOT_ARTIFACT", _doc(), {"VLLM_USE_MEGA_AOT_ARTIFACT": "1"}, None),
    # Settings nodewarm deliberately does not key on: vLLM's hash must not change either.
    ("--enable-prefix-caching", _doc(extraArgs=["--enable-prefix-caching"]), {}, None),
    ("--no-enable-prefix-caching", _doc(extraArgs=["--no-enable-prefix-caching"]), {}, None),
    ("--seed", _doc(extraArgs=["--seed=3"]), {}, None),
    ("--gpu-memory-utilization", _doc(extraArgs=["--gpu-memory-utilization", "0.5"]), {}, None),
    ("--disable-log-stats", _doc(extraArgs=["--disable-log-stats"]), {}, None),
    ("port", _doc(port=18124), {}, None),
    ("chunkSizeGB / streamer", _doc(chunkSizeGB=1), {}, None),
    ("model URI and size", _doc(model={"uri": "s3://other-bucket/elsewhere/", "sizeGB": 3}), {}, None),
    ("VLLM_FORCE_AOT_LOAD", _doc(), {"VLLM_FORCE_AOT_LOAD": "1"}, None),
    ("VLLM_CPU_KVCACHE_SPACE", _doc(), {"VLLM_CPU_KVCACHE_SPACE": "2"}, None),
    ("a VLLM_ name vLLM does not know", _doc(), {"VLLM_NOT_A_SETTING": "1"}, None),
]


def _container(p) -> dict:
    spec, _, _ = enginenode.rendered_pod(p)
    return next(c for c in spec["containers"] if c["name"] == "vllm")


def _pod_env(p, extra: dict) -> dict[str, str]:
    """The vLLM container's env as rendered, plus what this CPU node's runtime adds, plus the case's."""
    env = {e["name"]: e["value"] for e in _container(p)["env"] if "value" in e}
    return {**env, **enginenode.CPU_RUNTIME_ENV, **extra}


@pytest.fixture(scope="module")
def serving_runtime() -> dict:
    """The serving image's software as its publisher probes it (`key --runtime-only` run in .venv-serving)."""
    venv = podrun.require_serving_venv()
    out = subprocess.run([str(venv / "bin" / "nodewarm"), "bootstrap", "compile-cache", "key", "--runtime-only"],
                         capture_output=True, text=True, check=True, env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin"})
    return json.loads(out.stdout)["runtime"]


@pytest.fixture(scope="module")
def vllm_hashes(tmp_path_factory) -> list[dict]:
    model = enginenode.make_model(tmp_path_factory.mktemp("model") / "tiny")
    cases, models = [], {}
    for _, doc, extra, version in CASES:
        p = profile.from_dict(doc)
        c = _container(p)
        models[c["args"][0].partition("=")[2]] = str(model)     # --model=/models/<profile>
        cases.append({"argv": c["args"], "env": _pod_env(p, extra), "vllm_version": version})
    models[CACHE_MOUNT] = str(tmp_path_factory.mktemp("compile-cache"))      # what vLLM writes without a boot
    base_env = {"PATH": f"{podrun.serving_venv() / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path_factory.mktemp("h"))}
    return vllmhash.compute(cases, models, base_env)


def _serving_envs(envs: list[dict]) -> list[dict]:
    """``cachekey.serving_env`` of each env as the serving image computes it (vLLM importable there)."""
    out = subprocess.run(
        [podrun.which_python(), "-c", "import json,sys; from nodewarm.bootstrap.compilecache import cachekey; "
         "print(json.dumps([cachekey.serving_env(e) for e in json.load(sys.stdin)]))"],
        input=json.dumps(envs), capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


def _nodewarm_keys(runtime: dict) -> list[str]:
    """What the publisher keys each case's bundle by (and the agent restores by): the serving image's software,
    this node's hardware, the serving spec, the env as the serving image filters it."""
    envs = _serving_envs([_pod_env(profile.from_dict(doc), extra) for _, doc, extra, _ in CASES])
    hw = hardware.probe()
    keys = []
    for (_, doc, _, version), env in zip(CASES, envs):
        probe = cachekey.probe_from_dict(runtime)
        if version:
            probe = dataclasses.replace(probe, vllm=version)
        keys.append(cachekey.key_id(cachekey.build_factors(probe, hw, serving_spec(profile.from_dict(doc)), env)))
    return keys


def test_nodewarm_key_changes_exactly_when_vllms_own_hash_changes(vllm_hashes, serving_runtime):
    keys = _nodewarm_keys(serving_runtime)
    base_key, base_vllm = keys[0], vllm_hashes[0]
    rows, wrong = [], []
    for (what, *_), key, got in zip(CASES[1:], keys[1:], vllm_hashes[1:]):
        ours, theirs = key != base_key, got["dir"] != base_vllm["dir"]
        rows.append(f"{what:34} nodewarm {'changes' if ours else 'same   '}  vLLM {'changes' if theirs else 'same'}")
        if ours != theirs:
            wrong.append(rows[-1])
    assert not wrong, "nodewarm's key and vLLM's own hash disagree:\n" + "\n".join(wrong) + "\n\nall:\n" + \
        "\n".join(rows)
    # The model string vLLM hashes is the rendered path, the one nodewarm keys on.
    assert base_vllm["model"] == serving_spec(profile.from_dict(CASES[0][1])).model
