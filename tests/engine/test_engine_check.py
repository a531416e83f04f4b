"""The engine check end to end with the engine itself: real vLLM (CPU) boots in the check pod before a node is Warm.

The whole path a node takes, each part with the identity it really has: the node agent (``agent.run`` as the node,
kubelet token, NodeRestriction on) warms from the local S3 server and asks on its Node; the controller (running as
its ServiceAccount with its shipped RBAC plus the Role `nodewarm render` adds, a minted token) creates the check pod
from the applied PodTemplate; ``checkpods`` plays the scheduler's binding and the kubelet: it runs the pod's container
as the API server returns it (``nodewarm engine-check`` in the serving environment, the rendered start script, argv
and env after ``--``, the node's hostPaths at the pod's paths) and writes its terminated status with the
termination message; the agent reads it and reports Warm.

  A  cold node (no bundle): vLLM compiles in the check and serves -> Warm (EngineServed), compile cache "cold";
     A's caches are then published as its publisher would publish them
  B  restores A's bundle: vLLM loads every graph from it (its own log: FX cache hits, no miss) -> Warm, "hit"
  D  a node with no memory left for the KV cache (this CPU runtime's KV space 0: what vLLM sees on a GPU whose
     memory the weights fill) -> Warm=False, ModelDoesNotFit, vLLM's words in the condition and the Event
  C  the profile moves to float32 and the bundle at its key was built for bf16 (the publisher's own code, signed):
     vLLM compiles after the restore -> Warm=False, CompileCacheNotLoaded, that bundle marked stale in S3
  E  a profile without engineCheck: the agent never asks, no check pod is created or run

One vLLM at a time (2.5 GB, minutes of CPU each).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodewarm.api import enginecheck as contract
from nodewarm.api.decisions import EventReason
from nodewarm.bootstrap.compilecache.cachestore import CacheStore, parse_uri, stale_key
from nodewarm_dev.testenv import enginenode
from nodewarm_dev.testenv.checkcluster import CheckCluster, Checked
from nodewarm_dev.testenv.ports import free_port
from support.builders import v
from support.controller_fixtures import uniq

pytestmark = [pytest.mark.vllm, pytest.mark.kube, pytest.mark.s3, pytest.mark.slow]

IMAGE = "registry.example/vllm-nodewarm@sha256:" + "4" * 64


@dataclass
class World:
    cluster: CheckCluster
    doc: dict
    pem: Path


def _doc(name: str, model_uri: str, cache_uri: str, verify_key: str) -> dict:
    return v("karpenter", metadata={"name": name}, spec__nodes__nodePool=f"{name}-pool",
             spec__nodes__nodeClass=f"{name}-class", spec__model={"uri": model_uri, "sizeGB": 0.01},
             spec__serving={"image": IMAGE, "tensorParallelSize": 1, "maxModelLen": 512, "dtype": "bfloat16",
                            "port": free_port(), "namespace": f"{name}-serving"},
             spec__compileCache={"uri": cache_uri, "verifyKey": verify_key,
                                 "publisher": {"image": IMAGE, "signingKeySecret": "cc-signing", "quietSeconds": 3}},
             spec__readiness__engineCheck={"enabled": True, "timeout": "10m"})


@pytest.fixture(scope="module")
def world(kube, k, s3_exact, tmp_path_factory):
    from nodewarm.bootstrap.compilecache import signing

    tmp = tmp_path_factory.mktemp("engine-check")
    bucket = enginenode.upload_model(s3_exact, tmp, layers=2)
    pair = signing.generate(tmp / "signing.pem")
    doc = _doc(uniq("ec"), f"s3://{bucket}/models/tiny/", f"s3://{bucket}/cc/", pair.public)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in s3_exact.env().items():       # the agent's own S3 access (its instance role)
            mp.setenv(name, value)
        with CheckCluster.start(kube, k, doc, s3_exact.env(), tmp) as cluster:
            yield World(cluster, doc, tmp / "signing.pem")


@pytest.fixture(scope="module")
def node_a(world) -> Checked:
    c = world.cluster.check_node(world.doc, "node-1", "a")
    put = enginenode.publish(c.node, c.p, world.pem)         # what A's publisher would then publish
    assert put.status == "published", put.message
    return c


@pytest.fixture(scope="module")
def node_b(world, node_a) -> Checked:
    return world.cluster.check_node(world.doc, "node-2", "b")


@pytest.fixture(scope="module")
def node_d(world, node_b) -> Checked:
    return world.cluster.check_node(world.doc, "node-3", "d", {**enginenode.CPU_RUNTIME_ENV, **enginenode.EVIDENCE_ENV,
                                                               "VLLM_CPU_KVCACHE_SPACE": "0"})


@pytest.fixture(scope="module")
def node_c(world, node_a, node_d) -> Checked:
    doc = copy.deepcopy(world.doc)
    doc["spec"]["serving"]["dtype"] = "float32"
    p32 = world.cluster.apply_profile(doc)
    put = enginenode.publish(node_a.node, node_a.p, world.pem, spec_of=p32)   # bf16 caches at float32's key
    assert put.status == "published", put.message
    try:
        return world.cluster.check_node(doc, "node-4", "c")
    finally:
        world.cluster.apply_profile(world.doc)


def _engine_log(c: Checked) -> str:
    assert len(c.ran) == 1, [r.name for r in c.ran]
    return c.engine_log()


def test_a_cold_node_passes_after_vllm_compiled_and_served_in_the_check(node_a):
    assert node_a.result.warm, node_a.result.message
    assert (node_a.warm["status"], node_a.warm["reason"]) == ("True", contract.Reason.ENGINE_SERVED)
    ev = enginenode.evidence(_engine_log(node_a))
    assert ev.fx_misses and ev.init_s is not None          # vLLM's own log: it compiled, and initialised
    o = node_a.outcome
    assert (o.state, o.compile_cache) == ("passed", "cold") and o.boot_s > 0 and o.first_token_s > 0
    tl = node_a.result.timeline
    assert tl["engine_check_requested"] < tl["engine_ready"] < tl["engine_first_token"] <= tl["engine_check_passed"]
    assert any(e.startswith(EventReason.ENGINE_CHECK_PASSED) for e in node_a.events)
    assert node_a.pods_left == []                           # released: the serving pod may take its GPUs


def test_a_node_that_restored_a_good_bundle_passes_and_vllm_loaded_it(node_b):
    assert node_b.result.warm, node_b.result.message
    assert node_b.result.cache.status == "restored"
    assert node_b.outcome.compile_cache == "hit"
    ev = enginenode.evidence(_engine_log(node_b))
    assert ev.loaded_without_compiling, ev                 # every graph from Inductor's cache, none compiled
    assert node_b.warm["reason"] == contract.Reason.ENGINE_SERVED


def test_a_model_that_cannot_fit_fails_clearly(node_d):
    assert not node_d.result.warm
    assert (node_d.warm["status"], node_d.warm["reason"]) == ("False", contract.Reason.MODEL_DOES_NOT_FIT)
    assert "No available memory for the cache blocks" in node_d.warm["message"]
    assert "No available memory for the cache blocks" in _engine_log(node_d)     # vLLM's own words
    failed = [e for e in node_d.events if e.startswith(EventReason.ENGINE_CHECK_FAILED)]
    assert failed and "ModelDoesNotFit" in failed[0]
    assert node_d.outcome.log_tail                          # the engine's last lines travel with the outcome


def test_a_bundle_for_other_settings_fails_with_compile_cache_not_loaded_and_is_marked_stale(world, node_c):
    assert not node_c.result.warm
    assert (node_c.warm["status"], node_c.warm["reason"]) == ("False", contract.Reason.COMPILE_CACHE_NOT_LOADED)
    assert node_c.result.cache.status == "restored"
    ev = enginenode.evidence(_engine_log(node_c))
    assert ev.fx_misses                                     # vLLM's own log: Inductor compiled again
    baseline = node_c.result.cache.as_baseline()              # what the agent restored: the bundle and its generation
    store = CacheStore(parse_uri(node_c.p.compile_cache.uri))
    assert store.exists(stale_key(baseline.envelope_key, baseline.generation))
    assert node_c.outcome.compile_cache == "miss" and "marked stale" in node_c.warm["message"]


def test_without_engine_check_nothing_is_asked_and_no_check_pod_runs(world, node_c):
    doc = copy.deepcopy(world.doc)
    doc["spec"]["readiness"]["engineCheck"] = {"enabled": False}
    world.cluster.apply_profile(doc)
    try:
        c = world.cluster.check_node(doc, "node-7", "e")
    finally:
        world.cluster.apply_profile(world.doc)
    assert c.result.warm and c.result.engine is None
    assert c.outcome is None and c.ran == []
    assert not [e for e in c.events if e.startswith("EngineCheck")]
