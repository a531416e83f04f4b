"""Compile caches keyed by this node's hardware and the whole serving config, replaced when stale.

Real local S3 servers: rclone (no conditional writes: the claim protocol) and SeaweedFS (If-None-Match and
If-Match honoured). Hardware comes from fixture host trees (tests/fixtures/hosts) and Node labels.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from nodewarm import profile
from nodewarm.bootstrap import agent
from nodewarm.bootstrap.compilecache import cachekey, hardware, hitcheck, publish, restore, servedcheck, signing
from nodewarm.bootstrap.compilecache.bundle import CacheDirs
from nodewarm.bootstrap.compilecache.cachestore import CacheStore, envelope_key, parse_uri, stale_key
from nodewarm.api.errors import ProfileError
from nodewarm.api.names import CACHE_ANNOTATION
from nodewarm.api.servingspec import ServingSpec, serving_spec
from support.builders import v
from support import paths
from support.cachetree import node_roots, write_tree

HOSTS = paths.FIXTURES / "hosts"
HOST_A, HOST_B = HOSTS / "p5-h100-avx512", HOSTS / "g6e-l40s-avx2"
LABELS_B = {"node.kubernetes.io/instance-type": "g6e.xlarge", "karpenter.k8s.aws/instance-gpu-name": "l40s",
            "karpenter.k8s.aws/instance-gpu-count": "1"}
PROBE = cachekey.RuntimeProbe(
    torch_version="2.13.0+cu130", torch_build="d34d1007" * 8, cuda="13.0", triton="3.9.0", triton_build="t" * 64,
    vllm="0.32.0", vllm_path="/usr/lib/python3/site-packages/vllm", python_prefix="/usr")
SPEC = ServingSpec("/models/tiny", "r1", tp=1, pp=1, image="registry.example/vllm@sha256:" + "cd" * 32,
                            engine={"dtype": "bfloat16"})
ENV = {"VLLM_USE_AOT_COMPILE": "1"}
FACTORS_A = cachekey.build_factors(PROBE, hardware.probe(HOST_A, {}, ENV), SPEC, ENV)
FAST = publish.PublishSettings(quiet_s=0.3, poll_s=0.1, timeout_s=30, settle_s=2.0)
HASH = "8f" * 32


def _node(tmp_path: Path, name: str, compiled: bool = True, salt: str = "") -> dict[str, Path]:
    if not compiled:
        return node_roots(tmp_path, name)
    return node_roots(tmp_path, name, vllm={f"torch_aot_compile/{HASH}/rank_0_0/model": b"aot" + salt.encode()},
                      inductor={"fxgraph/cd/fcdkey/entry": b"g" + salt.encode()})


# --- hardware from this node ---------------------------------------------------------------------------------

B_MISMATCHES = {"gpu_model": ("l40s", "h100"), "gpu_count": (1, 2), "gpu_capability": ("8.9", "9.0"),
                "cpu_isa": ("avx2", "avx512 avx512_vnni amx_tile")}


def test_a_bundle_from_hardware_a_is_cold_on_hardware_b_with_every_mismatch_named(aws_env, keys, tmp_path):
    """Publisher on A (AVX-512, 2 x H100) writes the bundle and the image's descriptor; node B (AVX2, L40S from
    its labels) reads the same descriptor for the software but its own hardware, and refuses the bundle."""
    aws_env.create_bucket("hw-cc")
    store = CacheStore(parse_uri("s3://hw-cc/cc"))
    res = publish.publish_once(store, _node(tmp_path, "a"), FACTORS_A, keys[0], {"node": "a"}, FAST, runtime=PROBE)
    assert res.status == "published"
    verify = signing.public_text(keys[1])
    dirs = CacheDirs(vllm_root=tmp_path / "b" / "vllm-root", inductor=tmp_path / "b" / "inductor")
    same = restore.restore_for_node("s3://hw-cc/cc", verify, SPEC, CacheDirs(inductor=tmp_path / "a2" / "inductor"),
                                    host_root=HOST_A)
    assert same.status == "restored", same.message          # the descriptor alone is enough on A's hardware
    out = restore.restore_for_node("s3://hw-cc/cc", verify, SPEC, dirs, host_root=HOST_B, node_labels=LABELS_B)
    assert (out.status, out.reason) == ("cold", "CacheKeyMismatch"), out.message
    assert {m.field: (m.node, m.bundle) for m in out.mismatches} == B_MISMATCHES
    assert out.hardware.sources == ("cpuinfo", "node-labels")
    assert not any(p.exists() for p in dirs.roots().values())


TORCHLESS = """
import sys
sys.modules["torch"] = None      # importing torch now raises ImportError, as on the AL2023 host
from nodewarm import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def _torchless(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", TORCHLESS, *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))


def test_a_torchless_node_b_is_cold_without_a_traceback(aws_env, keys, tmp_path):
    aws_env.create_bucket("tl-cc")
    verify = signing.public_text(keys[1])
    spec = ["--model", SPEC.model, "--revision", SPEC.revision, "--image", SPEC.image, "--engine-arg", "dtype=bfloat16"]
    labels = [a for k, val in LABELS_B.items() for a in ("--node-label", f"{k}={val}")]
    cmd = ["bootstrap", "compile-cache", "restore", "--uri", "s3://tl-cc/cc", "--verify-key", verify, "--json",
           "--inductor-dir", str(tmp_path / "b" / "inductor"), "--host-root", str(HOST_B), *labels, *spec]
    # No descriptor yet: cold, RuntimeUnknown, exit 0, no traceback.
    first = _torchless(*cmd)
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr[-2000:]
    assert (json.loads(first.stdout)["status"], json.loads(first.stdout)["reason"]) == ("cold", "RuntimeUnknown")

    store = CacheStore(parse_uri("s3://tl-cc/cc"))
    assert publish.publish_once(store, _node(tmp_path, "a"), FACTORS_A, keys[0], {}, FAST,
                                runtime=PROBE).status == "published"
    second = _torchless(*cmd)
    assert second.returncode == 0 and "Traceback" not in second.stderr, second.stderr[-2000:]
    doc = json.loads(second.stdout)
    assert (doc["status"], doc["reason"]) == ("cold", "CacheKeyMismatch")
    assert {m["field"]: (m["node"], m["bundle"]) for m in doc["mismatches"]} == B_MISMATCHES


# --- the whole serving config --------------------------------------------------------------------------------

def _key(**serving) -> str:
    doc = v(**{f"spec__serving__{k}": val for k, val in serving.items()})
    spec = serving_spec(profile.from_dict(doc))
    return cachekey.key_id(cachekey.build_factors(PROBE, hardware.probe(HOST_A, {}, {}), spec, {}))


def test_every_compile_relevant_engine_setting_changes_the_key():
    base = _key()
    changed = {
        "extraArgs batched tokens": _key(extraArgs=["--max-num-batched-tokens=8192"]),
        "extraArgs quantization": _key(extraArgs=["--quantization", "fp8"]),
        "extraArgs compilation config": _key(extraArgs=['--compilation-config={"level": 3}']),
        "extraArgs pp": _key(extraArgs=["--pipeline-parallel-size=2"]),
        "dtype": _key(dtype="float16"),
        "max model len": _key(maxModelLen=4096),
    }
    assert len(set(changed.values()) | {base}) == len(changed) + 1, changed
    # vLLM's spellings of one setting are one key; JSON spacing and order do not matter.
    assert _key(extraArgs=["--max_num_batched_tokens=8192"]) == _key(extraArgs=["--max-num-batched-tokens", "8192"]) \
        == changed["extraArgs batched tokens"]
    assert _key(extraArgs=['--compilation_config={"level":3}']) == changed["extraArgs compilation config"]
    # -O3 is vLLM's --optimization-level=3 (its parser's rewrite), not a compilation-config level.
    assert _key(extraArgs=["-O3"]) == _key(extraArgs=["-O", "3"]) == _key(extraArgs=["--optimization-level=3"]) \
        != changed["extraArgs compilation config"]
    # How the HTTP server listens compiles nothing.
    assert _key(extraArgs=["--disable-log-requests", "--disable-log-stats"]) == base


def test_extra_args_may_not_repeat_a_field():
    with pytest.raises(ProfileError, match=r"spec\.serving\.extraArgs.*spec\.serving\.tensorParallelSize"):
        _key(extraArgs=["--tensor_parallel_size=4"])


# --- stale bundles are replaced -------------------------------------------------------------------------------

def test_a_bundle_proven_to_miss_in_serving_is_superseded_by_the_next_publish(store, server, keys, tmp_path):
    priv, pub = keys
    first = publish.publish_once(store, _node(tmp_path, "a"), FACTORS_A, priv, {"node": "a"}, FAST)
    assert (first.status, first.generation) == ("published", 1)

    b = _node(tmp_path, "b", compiled=False)
    got = restore.restore(store, FACTORS_A, b, pub)
    assert (got.status, got.generation) == ("restored", 1)
    write_tree(b["inductor"], {"fxgraph/zz/fzznew/entry": b"compiled while serving"})   # serving recompiled
    reported: list = []
    res = servedcheck.prove_and_publish(store, b, FACTORS_A, priv, {"node": "b"}, got.as_baseline(), lambda: True,
                                        FAST, report=lambda *a: reported.append(a))
    assert (res.outcome, res.reason) == ("miss", "InductorRecompiled") and reported[0][:2] == ("miss", "InductorRecompiled")
    assert store.exists(stale_key(first.envelope_key, 1))
    assert (res.published.status, res.published.generation) == ("replaced", 2), res.published.message
    assert res.published.protocol == ("conditional" if server.engine == "seaweedfs" else "claim")

    c = _node(tmp_path, "c", compiled=False)
    again = restore.restore(store, FACTORS_A, c, pub)
    assert (again.status, again.generation) == ("restored", 2)
    assert (c["inductor"] / "fxgraph/zz/fzznew/entry").read_bytes() == b"compiled while serving"
    # Generation 2 is good: a publisher with the same caches finds nothing to replace.
    assert publish.publish_once(store, c, FACTORS_A, priv, {}, FAST).status == "exists"


def test_a_new_vllm_hash_dir_marks_the_bundle_stale(store, keys, tmp_path):
    priv, _ = keys
    assert publish.publish_once(store, _node(tmp_path, "a"), FACTORS_A, priv, {}, FAST).status == "published"
    d = _node(tmp_path, "d")
    write_tree(d["vllm"], {"d8d288a9e4/rank_0_0/backbone/vllm_compile_cache.py": b"new hash"})
    res = publish.publish_once(store, d, FACTORS_A, priv, {}, FAST)
    assert (res.status, res.generation) == ("replaced", 2) and "d8d288a9e4" in res.message


def test_a_served_hit_republishes_nothing_and_never_says_restored(store, keys, tmp_path):
    priv, pub = keys
    assert publish.publish_once(store, _node(tmp_path, "a"), FACTORS_A, priv, {}, FAST).status == "published"
    b = _node(tmp_path, "b", compiled=False)
    got = restore.restore(store, FACTORS_A, b, pub)
    res = servedcheck.prove_and_publish(store, b, FACTORS_A, priv, {}, got.as_baseline(), lambda: True, FAST)
    assert (res.outcome, res.reason, res.published) == ("hit", "CompileCacheHit", None)
    # The agent's own report at warm time: a restore is pending proof, a cold start is "cold".
    warm = agent.AgentResult(True, "WeightsVerified", "", cache=got)
    assert CACHE_ANNOTATION not in warm.annotations()
    cold = agent.AgentResult(True, "WeightsVerified", "", cache=dataclasses.replace(got, status="cold"))
    assert cold.annotations()[CACHE_ANNOTATION] == "cold"


def test_racing_replacements_leave_exactly_one_current_bundle(store, server, keys, tmp_path):
    priv, pub = keys
    first = publish.publish_once(store, _node(tmp_path, "a"), FACTORS_A, priv, {}, FAST)
    publish.mark_stale(store, first.envelope_key, 1, "InductorRecompiled")
    nodes = [_node(tmp_path, f"n{i}", salt=str(i)) for i in range(3)]
    results: list = [None] * 3
    barrier = threading.Barrier(3)

    def run(i: int) -> None:
        barrier.wait()
        # The claim protocol's listing-lag allowance at its production default: the suite runs on two loaded
        # cores, where a 2 s allowance is not always longer than a stalled thread's listing lag.
        results[i] = publish.publish_once(CacheStore(store.uri), nodes[i], FACTORS_A, priv,
                                          {"node": f"n{i}"}, dataclasses.replace(FAST, settle_s=5.0))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status for r in results) == ["exists", "exists", "replaced"], [r.message for r in results]
    winner = next(r for r in results if r.status == "replaced")
    manifest = signing.open_envelope(store.get_small(first.envelope_key), pub)
    assert (manifest["generation"], manifest["sha256"]) == (2, winner.sha256)
    out = restore.restore(store, FACTORS_A, _node(tmp_path, "reader", compiled=False), pub)
    assert (out.status, out.generation, out.sha256) == ("restored", 2, winner.sha256)


def test_a_cold_start_is_reported_cold_and_proves_and_publishes_nothing(store, keys, tmp_path):
    """vLLM streamed the model from S3 (its start script's record says s3): it compiled under another model string
    in a private dir, so the node's untouched cache dirs must not read as a hit, nor anything as a miss."""
    priv, pub = keys
    assert publish.publish_once(store, _node(tmp_path, "a"), FACTORS_A, priv, {}, FAST).status == "published"
    b = _node(tmp_path, "b", compiled=False)
    got = restore.restore(store, FACTORS_A, b, pub)
    reports = []
    res = servedcheck.prove_and_publish(store, b, FACTORS_A, priv, {}, got.as_baseline(), lambda: True, FAST,
                                        lambda *r: reports.append(r), started_from=lambda: "s3")
    assert (res.outcome, res.reason, res.published, res.verdict) == ("cold", "ColdStart", None, None)
    assert [r[:2] for r in reports] == [("cold", "ColdStart")]
    env_key = envelope_key(cachekey.prefix(FACTORS_A, store.root), cachekey.key_id(FACTORS_A))
    assert store.list(env_key + ".stale/", delimiter=None) == []      # the good bundle is not marked stale
    # The same node started from its NVMe copy: the restore is proven a hit.
    res = servedcheck.prove_and_publish(store, b, FACTORS_A, priv, {}, got.as_baseline(), lambda: True, FAST,
                                        started_from=lambda: "local")
    assert (res.outcome, res.reason) == ("hit", "CompileCacheHit")
