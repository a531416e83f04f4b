"""Prove the hit for real: torch.compile on node A -> publish to a real S3 server -> restore on node B
(another directory) -> a fresh process hits Inductor's cache and rebuilds nothing; and a miss is seen.

The model is compiled once per session (about 15-20 s on 2 shared cores); every run is a fresh
process via nodewarm_dev.testenv.compile_probe. The first tests below are pure checks of the hit/miss judge.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from support.bootstrap_fixtures import cache_store
from nodewarm.api.servingspec import ServingSpec
from nodewarm.bootstrap.compilecache import cachekey, hardware, hitcheck, publish, restore, signing
from nodewarm.bootstrap.compilecache.bundle import CacheDirs
from nodewarm.bootstrap.compilecache.cachestore import CacheStore, parse_uri
from support import paths

MODEL = paths.REPO / "dev" / "src" / "nodewarm_dev" / "testenv" / "compile_probe.py"
HASH = "ab" * 32


# --- the judge, on snapshots and real vLLM log lines ------------------------------------------------

def _snap(hash_dirs=(), graphs=(), artifacts=()) -> hitcheck.TreeSnapshot:
    return hitcheck.TreeSnapshot(frozenset(hash_dirs), frozenset(graphs), frozenset(artifacts))


BASE = _snap([f"torch_aot_compile/{HASH}"], ["fkey"], ["vllm/x/c.so"])
LOAD_LINE = ("INFO [decorators.py:311] Directly load AOT compilation from path "
             f"/c/torch_compile_cache/torch_aot_compile/{HASH}/rank_0_0/model")
COMPILE_LINE = "INFO [backends.py:393] Compiling a graph for compile range (1, 8192) takes 5.60 s"
AOT_FAIL_LINE = ("WARNING Compiling model again due to a load failure from /c/rank_0_0/model, "
                 "reason: 'function' object has no attribute 'finalize_loading'")


@pytest.mark.parametrize("current, log, counters, restored, expect", [
    (BASE, LOAD_LINE, None, True, ("hit", "CompileCacheHit")),
    (BASE, "", {"inductor.fxgraph_cache_hit": 1}, True, ("hit", "CompileCacheHit")),
    (_snap(BASE.hash_dirs | {"torch_aot_compile/" + "cd" * 32}, BASE.graphs, BASE.artifacts), "", None, True,
     ("miss", "NewHashDir")),
    (_snap(BASE.hash_dirs, BASE.graphs | {"fnew"}, BASE.artifacts | {"vllm/y/d.so"}), LOAD_LINE, None, True,
     ("miss", "InductorRecompiled")),
    (BASE, "", {"inductor.fxgraph_cache_miss": 1}, True, ("miss", "InductorRecompiled")),
    (BASE, AOT_FAIL_LINE, None, True, ("miss", "AotLoadFailed")),
    (BASE, COMPILE_LINE, None, True, ("miss", "VllmCompiled")),
    (BASE, "", None, True, ("unknown", "NoCompileActivity")),
    (_snap(BASE.hash_dirs, BASE.graphs, BASE.artifacts | {"pch/h.h.gch"}), "", {"inductor.fxgraph_cache_hit": 1}, True,
     ("miss", "HeaderRebuilt")),
    (_snap(BASE.hash_dirs, BASE.graphs | {"fnew"}, BASE.artifacts), "", None, False, ("miss", "ColdCompile")),
])
def test_judge(current, log, counters, restored, expect):
    r = hitcheck.judge(BASE, current, restored=restored, log=hitcheck.scan_log(log), counters=counters)
    assert (r.status, r.reason) == expect, r.message


def test_new_hash_dir_message_names_both_keys():
    r = hitcheck.judge(BASE, _snap(BASE.hash_dirs | {"0123456789"}), restored=True)
    assert "0123456789" in r.message and HASH in r.message and r.new_hash_dirs == ("0123456789",)


def test_scan_log_reads_hash_dirs_from_both_layouts():
    ev = hitcheck.scan_log(LOAD_LINE + "\nUsing cache directory: /c/torch_compile_cache/d8d288a9e4/rank_0_0/backbone\n"
                           + COMPILE_LINE)
    assert (ev.loaded, ev.compiled) == (1, 1) and ev.hash_dirs == {HASH, "d8d288a9e4"}


def test_snapshot_reads_vllm_and_inductor_layouts(tmp_path):
    files = [f"vllm/torch_aot_compile/{HASH}/rank_0_0/model",
             f"vllm/torch_aot_compile/{HASH}/inductor_cache/fxgraph/ab/fk1/e",
             "vllm/d8d288a9e4/rank_0_0/backbone/vllm_compile_cache.py", "inductor/fxgraph/cd/fk2/e",
             "inductor/cx/ck.so", "inductor/cx/ck.cpp", "inductor/locks/l.lock"]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_bytes(b"x")
    snap = hitcheck.snapshot({"vllm": tmp_path / "vllm", "inductor": tmp_path / "inductor"})
    assert snap.hash_dirs == {f"torch_aot_compile/{HASH}", "d8d288a9e4"}
    assert snap.graphs == {"fk1", "fk2"}
    assert snap.artifacts == {f"vllm/torch_aot_compile/{HASH}/rank_0_0/model",
                              f"vllm/torch_aot_compile/{HASH}/inductor_cache/fxgraph/ab/fk1/e",
                              "vllm/d8d288a9e4/rank_0_0/backbone/vllm_compile_cache.py",
                              "inductor/fxgraph/cd/fk2/e", "inductor/cx/ck.so"}


def test_a_restored_artifact_written_again_under_its_name_is_a_miss(tmp_path):
    """vLLM 0.32 on CPU fails to load its restored AOT ``model`` file, compiles, and saves the file anew under the
    same name: no new name appears, so only the write itself shows the miss."""
    model = tmp_path / "vllm" / "torch_aot_compile" / HASH / "rank_0_0" / "model"
    kernel = tmp_path / "inductor" / "cx" / "ck.so"
    for f in (model, kernel):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"restored")
        os.utime(f, ns=(1, 1))          # as restored; serving writes "now"
    roots = {"vllm": tmp_path / "vllm", "inductor": tmp_path / "inductor"}
    baseline = hitcheck.TreeSnapshot.from_dict(hitcheck.snapshot(roots).to_dict())   # through the baseline file
    assert hitcheck.judge(baseline, hitcheck.snapshot(roots), restored=True, served=True).status == "hit"
    model.write_bytes(b"compiled again")
    r = hitcheck.judge(baseline, hitcheck.snapshot(roots), restored=True, served=True)
    assert (r.status, r.reason) == ("miss", "VllmRecompiled") and "rank_0_0/model" in r.message
    os.utime(model, ns=(1, 1))
    kernel.write_bytes(b"rebuilt")
    r = hitcheck.judge(baseline, hitcheck.snapshot(roots), restored=True, served=True)
    assert (r.status, r.reason) == ("miss", "InductorRecompiled")
    # A baseline from an agent that records no write times still sees new files, never a rewrite.
    old = hitcheck.TreeSnapshot.from_dict({k: v for k, v in baseline.to_dict().items() if k != "written"})
    assert hitcheck.judge(old, hitcheck.snapshot(roots), restored=True, served=True).status == "hit"


# --- real torch.compile ------------------------------------------------------------------------------

def node_roots(node: Path) -> dict[str, Path]:
    """A 'node': its Inductor cache dir and its private TMPDIR's precompiled headers.

    TMPDIR is private because Inductor keeps precompiled headers in $TMPDIR/torchinductor_$USER
    whatever TORCHINDUCTOR_CACHE_DIR says; a shared one would let nodes see each other's state.
    """
    pch = node / "tmp" / f"torchinductor_{getpass.getuser()}" / "precompiled_headers"
    return CacheDirs(inductor=node / "inductor", pch=pch).roots()


def run_model(node: Path, *extra: str) -> dict:
    """One fresh process on ``node`` whose only compile state is what the node dir holds."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "ATEN_CPU_CAPABILITY"))}
    (node / "tmp").mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, str(MODEL), "--cache-dir", str(node / "inductor"), *extra],
                          env={**clean, "TMPDIR": str(node / "tmp")}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT:"))
    return json.loads(line[len("RESULT:"):])


@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    """Node A: one cold compile of the small model into a real Inductor cache dir."""
    node = tmp_path_factory.mktemp("nodeA")
    result = run_model(node)
    assert result["counters"].get("inductor.fxgraph_cache_miss") == 1, result
    return node, result


@pytest.fixture(scope="session")
def real_factors():
    spec = ServingSpec("tests/compile_model.py", "1", image="sha256:" + "00" * 32)
    return cachekey.build_factors(cachekey.probe_runtime(), hardware.probe(env=os.environ), spec, os.environ)


@pytest.fixture
def published(compiled, real_factors, s3, monkeypatch, tmp_path):
    """Node A publishes its real cache to the rclone server; returns (store, verify key)."""
    bucket = "hit-" + uuid.uuid4().hex[:10]
    s3.create_bucket(bucket)
    store = cache_store(s3, monkeypatch, f"s3://{bucket}/cc")
    pair = signing.generate(tmp_path / "k.pem")
    res = publish.publish_once(store, node_roots(compiled[0]), real_factors, signing.load_private(pair.private_path),
                               {"node": "A"}, publish.PublishSettings(settle_s=1.5))
    assert res.status == "published", res.message
    return store, signing.load_public(pair.public)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.s3
def test_restored_cache_hits_in_a_fresh_process(published, real_factors, tmp_path):
    store, verify_key = published
    node = tmp_path / "nodeB" / "somewhere" / "else"
    roots = node_roots(node)
    out = restore.restore(store, real_factors, roots, verify_key)
    assert out.status == "restored", out.message

    result = run_model(node)
    assert result["counters"].get("inductor.fxgraph_cache_hit") == 1, result
    assert "inductor.fxgraph_cache_miss" not in result["counters"]
    assert result["maxdiff"] is not None and result["maxdiff"] < 1e-4
    verdict = hitcheck.verify_hit(roots, out.baseline, restored=True, counters=result["counters"])
    assert (verdict.status, verdict.reason) == ("hit", "CompileCacheHit"), verdict.message
    assert verdict.new_artifacts == 0  # no .so rebuilt, no new graph, no header rebuilt


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.s3
def test_a_restore_without_the_headers_is_caught_rebuilding_them(published, real_factors, tmp_path):
    """Graphs and kernels hit, yet the first call pays a precompiled-header build: reported, not hidden."""
    store, verify_key = published
    node = tmp_path / "nodeE"
    roots = node_roots(node)
    out = restore.restore(store, real_factors, {"inductor": roots["inductor"]}, verify_key)
    assert out.status == "restored", out.message
    baseline = hitcheck.snapshot(roots)
    result = run_model(node)
    assert result["counters"].get("inductor.fxgraph_cache_hit") == 1, result
    verdict = hitcheck.verify_hit(roots, baseline, restored=True, counters=result["counters"])
    assert (verdict.status, verdict.reason) == ("miss", "HeaderRebuilt"), verdict.message


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.s3
def test_a_real_recompile_is_reported_as_a_miss(published, real_factors, tmp_path):
    store, verify_key = published
    node = tmp_path / "nodeC"
    roots = node_roots(node)
    out = restore.restore(store, real_factors, roots, verify_key)
    assert out.status == "restored", out.message
    result = run_model(node, "--seq", "16")  # a shape the bundle never saw
    verdict = hitcheck.verify_hit(roots, out.baseline, restored=True)  # from the disk alone
    assert (verdict.status, verdict.reason) == ("miss", "InductorRecompiled"), verdict.message
    assert verdict.new_graphs and result["counters"].get("inductor.fxgraph_cache_miss") == 1


def _probe(env: dict) -> dict:
    code = ("import json, dataclasses; from nodewarm.bootstrap.compilecache import cachekey; "
            "print(json.dumps(dataclasses.asdict(cachekey.probe_runtime())))")
    return json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                     check=True).stdout)


@pytest.mark.torch
@pytest.mark.s3
def test_a_node_picking_a_narrower_isa_refuses_the_bundle(published, tmp_path):
    """The ISA hazard: Inductor would hit and (AVX-512 -> AVX2, measured) return NaN; our key refuses."""
    store, verify_key = published
    native = hardware.probe(env={}).cpu_isa
    # A smaller node: AVX2 where the bundle was built with more, else no vector ISA at all.
    narrower = "avx2" if native != "avx2" else "default"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": narrower}
    probe = cachekey.probe_from_dict(_probe(env))
    hw = hardware.probe(env=env)
    assert hw.cpu_isa != native
    factors = cachekey.build_factors(probe, hw, ServingSpec("tests/compile_model.py", "1",
                                                                 image="sha256:" + "00" * 32), env)
    roots = node_roots(tmp_path / "nodeD")
    out = restore.restore(store, factors, roots, verify_key)
    assert (out.status, out.reason) == ("cold", "CacheKeyMismatch"), out.message
    assert {m.field for m in out.mismatches} == {"cpu_isa", "env.ATEN_CPU_CAPABILITY"}
    assert not any(p.exists() for p in roots.values())


@pytest.mark.torch
@pytest.mark.slow
def test_copy_of_cache_without_restore_is_judged_cold(compiled, tmp_path):
    """No bundle restored (cold node): the compile is reported as ColdCompile, not a silent pass."""
    roots = node_roots(tmp_path / "cold")
    baseline = hitcheck.snapshot(roots)
    shutil.copytree(compiled[0] / "inductor", roots["inductor"])  # what a compile would leave
    verdict = hitcheck.verify_hit(roots, baseline, restored=False)
    assert (verdict.status, verdict.reason) == ("miss", "ColdCompile")


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.s3
def test_node_b_hits_after_restore_and_the_hit_lands_on_its_node_through_the_publishers_identity(
        published, real_factors, tmp_path, kube, admin, k, fresh_node):
    """Real torch.compile on "node B" after a restore; the publisher sidecar's check (its rendered
    ServiceAccount, patch nodes/status only) records ``hit`` on the Node."""
    from kubernetes import config
    from kubernetes.client.exceptions import ApiException

    from nodewarm import instancetypes, profile
    from nodewarm.bootstrap import nodestatus
    from nodewarm.bootstrap.compilecache import servedcheck
    from nodewarm.controller.kube import NODES
    from nodewarm.kubeapply import apply
    from nodewarm.api.names import CACHE_ANNOTATION, CACHE_REASON_ANNOTATION
    from nodewarm.nodeclasses.render import render
    from support.builders import v

    store, verify_key = published
    name = "hit-" + uuid.uuid4().hex[:6]
    p = profile.from_dict(v(metadata__name=name, spec__compileCache__verifyKey=signing.public_text(verify_key),
                            spec__compileCache__publisher={"image": "i", "signingKeySecret": "k"}))
    docs = render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
    sa = next(d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"].endswith("-publisher"))
    apply(admin, [sa] + [d for d in docs if d["kind"].startswith("ClusterRole")
                         and "publisher" in d["metadata"]["name"]])
    token = kube.service_account_token(sa["metadata"]["namespace"], sa["metadata"]["name"])
    pub_api = config.new_client_from_config(config_file=str(kube.write_kubeconfig(tmp_path / "pub-kubeconfig",
                                                                                   token, "publisher")))
    fresh_node(name, [])

    node = tmp_path / "nodeB"
    roots = node_roots(node)
    out = restore.restore(store, real_factors, roots, verify_key)
    assert out.status == "restored", out.message
    result = run_model(node)      # serving: a fresh process whose compile state is what node B holds
    assert result["counters"].get("inductor.fxgraph_cache_hit") == 1, result

    def report(outcome: str, reason: str, _message: str) -> None:
        nodestatus.report_compile_cache(pub_api, name, outcome, reason)

    served = servedcheck.prove_and_publish(store, roots, real_factors, signing.load_private(tmp_path / "k.pem"),
                                           {"node": name}, out.as_baseline(), lambda: True,
                                           publish.PublishSettings(quiet_s=0.5, poll_s=0.1, timeout_s=60), report)
    assert (served.outcome, served.reason, served.published) == ("hit", "CompileCacheHit", None), served.message
    got = k.get(NODES, name)["metadata"]["annotations"]
    assert (got[CACHE_ANNOTATION], got[CACHE_REASON_ANNOTATION]) == ("hit", "CompileCacheHit")
    # The same identity cannot touch the Node's spec (taints): only the status subresource.
    with pytest.raises(ApiException) as denied:
        nodestatus._call(pub_api, "PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": True}},
                         nodestatus.STRATEGIC)
    assert denied.value.status == 403
