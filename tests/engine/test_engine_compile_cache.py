"""The compile cache end to end with the engine: real vLLM (CPU) on simulated nodes, the real agent and publisher.

Node A (first node): its agent pulls the tiny model from the local S3 server and finds no bundle; the rendered pod
runs (podrun: the rendered start script, argv and env, the hostPaths under A's root at the pod's own paths); vLLM
compiles into the rendered /compile-cache dirs; the publisher sidecar (the rendered `nodewarm publish` argv and
env, its rendered ServiceAccount and RBAC against the real API server) reports ``cold`` and publishes a signed
bundle. Node B (a fresh root, the same container paths, its own hardware probe): its agent restores the bundle;
vLLM loads the compiled graphs without compiling (its own log: Inductor's "fx graph cache hit" for the graph A
compiled, no miss, no AOT load failure, nothing new on disk) and the publisher records ``hit`` on B's Node.
Node C: a bundle signed for C's key but built for another setting (A's bf16 caches under a float32 profile's key)
is restored; vLLM compiles again (its log: a miss) and the publisher records ``miss`` and supersedes the bundle.

One vLLM at a time (2.5 GB, minutes of CPU each); every boot is shared by the assertions below.
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import config as kubeconfig

from nodewarm import profile
from nodewarm.api.warmprofile import WarmProfile
from nodewarm.bootstrap.compilecache import cachekey, hardware, hitcheck, publish, runtimedesc, signing
from nodewarm.bootstrap.compilecache.cachestore import CacheStore, envelope_key, parse_uri, stale_key
from nodewarm.controller.kube import NODES
from nodewarm.kubeapply import apply
from nodewarm.api.names import CACHE_ANNOTATION, CACHE_REASON_ANNOTATION
from nodewarm.api.podlayout import cache_dirs
from nodewarm.api.servingspec import serving_spec
from nodewarm.nodeclasses.vllm import AOT_COMPILE_ENV
from nodewarm_dev.testenv import enginenode, vllmclient
from nodewarm_dev.testenv.ports import free_port
from support.builders import v

pytestmark = [pytest.mark.vllm, pytest.mark.kube, pytest.mark.s3, pytest.mark.slow]

IMAGE = "registry.example/vllm-nodewarm@sha256:" + "2" * 64


@dataclass
class World:
    doc: dict
    store: CacheStore
    signing_dir: Path
    env: dict[str, str]            # what the pod's identity gives both containers (S3 endpoint, credentials)
    publisher_kubeconfig: Path     # the publisher's API credentials (its ServiceAccount's token)
    admin: object
    k: object
    tmp: Path


@dataclass
class Served:
    node: enginenode.Node
    p: WarmProfile
    warm: object                   # agent.AgentResult
    vllm_log: str
    evidence: enginenode.EngineEvidence
    outcome: tuple[str, str]
    node_annotations: dict
    before: hitcheck.TreeSnapshot  # the cache dirs right after the agent, and after serving
    after: hitcheck.TreeSnapshot
    completion: str


def _doc(name: str, model_uri: str, cache_uri: str, verify_key: str, port: int, **serving) -> dict:
    return v("karpenter", metadata={"name": name},
             spec__model={"uri": model_uri, "sizeGB": 0.01},
             spec__serving={"image": IMAGE, "tensorParallelSize": 1, "maxModelLen": 512, "dtype": "bfloat16",
                            "port": port, **serving},
             spec__compileCache={"uri": cache_uri, "verifyKey": verify_key,
                                 "publisher": {"image": IMAGE, "signingKeySecret": "cc-signing", "quietSeconds": 3}})


@pytest.fixture(scope="module")
def world(s3_exact, kube, admin, k, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine-cc")
    bucket = enginenode.upload_model(s3_exact, tmp, layers=2)
    signing_dir = tmp / "signing-key"
    signing_dir.mkdir()
    pair = signing.generate(signing_dir / "signing.pem")
    doc = _doc("tiny", f"s3://{bucket}/models/tiny/", f"s3://{bucket}/cc/", pair.public, free_port())
    p = profile.from_dict(doc)
    _, _, docs = enginenode.rendered_pod(p)
    sa = next(d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"].endswith("-publisher"))
    apply(admin, [sa] + [d for d in docs if d["kind"].startswith("ClusterRole") and "publisher" in d["metadata"]["name"]])
    token = kube.service_account_token(sa["metadata"]["namespace"], sa["metadata"]["name"])
    kc = kube.write_kubeconfig(tmp / "publisher-kubeconfig", token, "publisher")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in s3_exact.env().items():       # the agent's own S3 access (its instance role)
            mp.setenv(name, value)
        yield World(doc, CacheStore(parse_uri(p.compile_cache.uri)), signing_dir, s3_exact.env(),
                    kc, admin, k, tmp)


def _serve_on_new_node(world: World, doc: dict, label: str) -> Served:
    p = profile.from_dict(doc)
    name = f"cc-{label}-{uuid.uuid4().hex[:6]}"
    world.k.create(NODES, {"metadata": {"name": name}, "spec": {"providerID": f"aws:///us-west-2a/i-{name}"}})
    node = enginenode.Node(name, world.tmp / f"node-{label}")
    try:
        warm = node.warm(doc)
        assert warm.warm, warm.message
        roots = node.cache_roots(p)
        before = hitcheck.snapshot(roots)
        served = enginenode.serve(node, p, world.tmp / f"work-{label}", extra_env=world.env,
                                  publisher_kubeconfig=world.publisher_kubeconfig, signing_dir=world.signing_dir)
        try:
            completion = vllmclient.complete(served.base_url, p.name)["choices"][0]["text"]
            outcome = served.publisher_outcome(timeout=600)
        finally:
            served.stop()
        log = served.vllm.text()
        annotations = world.k.get(NODES, name)["metadata"].get("annotations") or {}
        return Served(node, p, warm, log, enginenode.evidence(log), outcome, annotations, before,
                      hitcheck.snapshot(roots), completion)
    finally:
        world.k.delete(NODES, name)


@pytest.fixture(scope="module")
def node_a(world) -> Served:
    return _serve_on_new_node(world, world.doc, "a")


@pytest.fixture(scope="module")
def node_b(world, node_a) -> Served:
    return _serve_on_new_node(world, world.doc, "b")


@pytest.fixture(scope="module")
def node_c(world, node_a, node_b) -> Served:
    """A bundle for another setting at C's key: A's bf16 caches, published (the publisher's own code, signed with
    the profile's key) under the key of a float32 profile, which C then serves."""
    doc = copy.deepcopy(world.doc)
    doc["spec"]["serving"]["dtype"] = "float32"
    p = profile.from_dict(doc)
    key = signing.load_private(world.signing_dir / "signing.pem")
    probe, env = runtimedesc.read(world.store, IMAGE, key.public_key())      # what A's publisher wrote
    factors = cachekey.build_factors(probe, hardware.probe(env=env), serving_spec(p), env)
    roots = node_a.node.cache_roots(node_a.p)
    put = publish.publish_once(world.store, roots, factors, key, {"node": "forced-miss"})
    assert put.status == "published", put.message
    return _serve_on_new_node(world, doc, "c")


def test_node_a_compiles_into_the_rendered_host_dirs_and_publishes_a_signed_bundle(world, node_a):
    assert node_a.warm.cache.status == "cold"                     # the first node: nothing to restore yet
    ev = node_a.evidence
    assert ev.fx_misses and not ev.fx_hits, ev                    # vLLM compiled (Inductor's own log)
    inductor = Path(cache_dirs(node_a.node.compile_cache(node_a.p))["inductor"])
    # What vLLM compiled lies in the rendered TORCHINDUCTOR_CACHE_DIR on A's hostPath: its graphs and kernels.
    assert {g for g in node_a.after.graphs} == set(ev.fx_misses), (node_a.after.graphs, ev.fx_misses)
    assert any(p.suffix == ".so" for p in inductor.rglob("*")), sorted(inductor.rglob("*"))[:20]
    assert node_a.outcome[0] == "cold" and node_a.node_annotations.get(CACHE_ANNOTATION) == "cold"
    # The publisher's bundle, signed, for exactly A's key: its graphs are the ones vLLM compiled.
    p = node_a.p
    key = signing.load_private(world.signing_dir / "signing.pem")
    probe, env = runtimedesc.read(world.store, IMAGE, key.public_key())
    factors = cachekey.build_factors(probe, hardware.probe(env=env), serving_spec(p), env)
    env_key = envelope_key(cachekey.prefix(factors, world.store.root), cachekey.key_id(factors))
    manifest = cachekey.BundleManifest.from_dict(signing.open_envelope(world.store.get_small(env_key),
                                                                        key.public_key()))
    assert set(manifest.graphs) == set(ev.fx_misses) and "inductor" in manifest.roots
    assert env.get(AOT_COMPILE_ENV) == "0"                 # the rendered setting, in the key


def test_node_b_restores_through_the_agent_and_vllm_loads_without_compiling(node_a, node_b):
    assert node_b.warm.cache.status == "restored", node_b.warm.cache.message
    ev = node_b.evidence
    # vLLM's own evidence: every graph came from Inductor's cache (the graph A compiled), none compiled, no
    # AOT artifact failed to load; and nothing compiled was written on B while it served.
    assert ev.loaded_without_compiling, ev
    assert set(ev.fx_hits) == set(node_a.evidence.fx_misses)
    assert node_b.after.artifacts == node_b.before.artifacts
    assert node_b.completion == node_a.completion                 # greedy: the same model answers the same
    print(f"engine init: A {node_a.evidence.init_s} s (cold), B {ev.init_s} s (restored): "
          f"B/A {ev.init_s / node_a.evidence.init_s:.2f}")


def test_the_publishers_hit_on_node_b_matches_vllms_evidence(node_b):
    assert node_b.evidence.loaded_without_compiling
    assert node_b.outcome == ("hit", "CompileCacheHit")
    assert node_b.node_annotations.get(CACHE_ANNOTATION) == "hit"
    assert node_b.node_annotations.get(CACHE_REASON_ANNOTATION) == "CompileCacheHit"


def test_a_bundle_for_another_setting_is_a_miss_for_vllm_and_for_the_publisher(world, node_c):
    assert node_c.warm.cache.status == "restored", node_c.warm.cache.message
    ev = node_c.evidence
    assert ev.fx_misses and not ev.loaded_without_compiling, ev   # vLLM compiled again (its own log)
    assert node_c.outcome[0] == "miss", node_c.outcome
    assert node_c.node_annotations.get(CACHE_ANNOTATION) == "miss"
    # The missed generation is marked stale, and C's own caches replaced it.
    env_key = node_c.warm.cache.envelope_key
    assert world.store.exists(stale_key(env_key, node_c.warm.cache.generation))
    manifest = cachekey.BundleManifest.from_dict(signing.open_envelope(
        world.store.get_small(env_key), signing.load_private(world.signing_dir / "signing.pem").public_key()))
    assert manifest.generation == node_c.warm.cache.generation + 1
    assert set(ev.fx_misses) <= set(manifest.graphs)
