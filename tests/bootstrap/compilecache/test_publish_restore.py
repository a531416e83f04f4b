"""Publish and restore against real local S3 servers (rclone: no conditional writes; SeaweedFS: AWS-exact).

Cache trees here are small stand-ins with the real layouts; test_compile_hit.py (beside this file) does the same
with a real torch.compile cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import unquote

import pytest
import zstandard

from support.bootstrap_fixtures import cache_store, proxied
from nodewarm_dev.testenv.faultproxy import first_n
from support.s3faults import Reply
from nodewarm import cli
from nodewarm.api.servingspec import ServingSpec
from nodewarm.bootstrap.compilecache import cachekey, hardware, hitcheck, publish, restore, signing
from nodewarm.bootstrap.compilecache.bundle import CacheDirs
from nodewarm.bootstrap.compilecache.cachestore import CacheStore, blob_key, envelope_key, parse_uri
from support import paths
from support.cachetree import node_roots, write_tree

pytestmark = pytest.mark.s3

PROBE = cachekey.RuntimeProbe(
    torch_version="2.13.0+cpu", torch_build="d34d1007" * 8, cuda="", triton="", triton_build="", vllm="0.32.0",
    vllm_path="/opt/venv/lib/python3.11/site-packages/vllm", python_prefix="/opt/venv",
)
HOST_A = paths.FIXTURES / "hosts" / "p5-h100-avx512"
HW_A = hardware.probe(HOST_A, {}, {})
SPEC = ServingSpec("s3://models/tiny-llama/", "r1", tp=1, pp=1, image="sha256:" + "cd" * 32,
                            engine={"dtype": "bfloat16", "max_model_len": "2048"})
FACTORS = cachekey.build_factors(PROBE, HW_A, SPEC, {"VLLM_USE_AOT_COMPILE": "1"})
HASH = "8f" * 32
FAST = publish.PublishSettings(quiet_s=1.0, poll_s=0.2, timeout_s=30, settle_s=2.0)


def _node(tmp_path: Path, name: str, compiled: bool = True, salt: str = "") -> dict[str, Path]:
    """A node's cache roots; ``compiled`` fills them as vLLM + Inductor would after a compile."""
    if not compiled:
        return node_roots(tmp_path, name)
    return node_roots(tmp_path, name, vllm={
        f"torch_aot_compile/{HASH}/rank_0_0/model": b"aot artifact" + salt.encode(),
        f"torch_aot_compile/{HASH}/inductor_cache/fxgraph/ab/fabkey/entry": b"graph",
        f"torch_aot_compile/{HASH}/inductor_cache/cx/ckernel.so": b"\x7fELF" + salt.encode(),
    }, inductor={"fxgraph/cd/fcdkey/entry": b"g", "aotautograd/ef/aefkey/entry": b"a"})


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _other_store(store: CacheStore) -> CacheStore:
    """A second node's view of the same bucket: its own client, nothing cached."""
    return CacheStore(store.uri)


def test_conditional_write_support_is_detected(store, server):
    assert store.conditional_writes() is (server.engine == "seaweedfs")
    # A second node probes where the first left its probe object (no DeleteObject needed): same answer.
    assert _other_store(store).conditional_writes() is (server.engine == "seaweedfs")
    assert store.put_if_absent(store.root + "x", b"1") is True
    assert store.put_if_absent(store.root + "x", b"2") is (server.engine == "rclone")  # rclone ignores it


def test_publish_then_restore_on_another_node(store, server, keys, tmp_path):
    priv, pub = keys
    a = _node(tmp_path, "a")
    res = publish.publish_once(store, a, FACTORS, priv, {"node": "a"}, FAST)
    assert res.status == "published"
    assert res.protocol == ("conditional" if server.engine == "seaweedfs" else "claim")
    assert res.envelope_key == envelope_key(cachekey.prefix(FACTORS, "compile-cache/"), cachekey.key_id(FACTORS))
    assert store.list(res.envelope_key + ".claims/", delimiter=None) == []  # claims cleaned up

    b = _node(tmp_path, "b", compiled=False)  # another absolute path: relocation is free
    out = restore.restore(_other_store(store), FACTORS, b, pub)
    assert (out.status, out.reason) == ("restored", "Restored"), out.message
    assert out.hash_dirs == (f"torch_aot_compile/{HASH}",)
    for name in a:
        assert _files(b[name]) == _files(a[name])
    assert out.baseline == hitcheck.snapshot(b)
    assert "restored" in out.condition_message()
    assert not list((tmp_path / "b/vllm").glob(".nodewarm-restore-*"))  # staging removed

    again = publish.publish_once(_other_store(store), a, FACTORS, priv, {"node": "a2"}, FAST)
    assert again.status == "exists"


def test_concurrent_first_nodes_do_not_clobber(store, server, keys, tmp_path):
    priv, pub = keys
    nodes = [_node(tmp_path, f"n{i}", salt=str(i)) for i in range(3)]  # three different caches
    results: list[publish.PublishResult] = [None] * 3  # type: ignore[list-item]
    barrier = threading.Barrier(3)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = publish.publish_once(_other_store(store), nodes[i], FACTORS, priv, {"node": f"n{i}"}, FAST)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(r.status for r in results)
    assert statuses == ["exists", "exists", "published"], [r.message for r in results]
    winner = next(r for r in results if r.status == "published")
    manifest = signing.open_envelope(store.get_small(winner.envelope_key), pub)
    assert manifest["sha256"] == winner.sha256
    # The losers' blobs are gone; the winner's is what the envelope names.
    blobs = store.list(cachekey.prefix(FACTORS, store.root) + "blobs/")
    assert blobs == [winner.blob_key]
    out = restore.restore(store, FACTORS, _node(tmp_path, "reader", compiled=False), pub)
    assert out.status == "restored" and out.sha256 == winner.sha256


def _publish(store, keys, tmp_path) -> publish.PublishResult:
    res = publish.publish_once(store, _node(tmp_path, "src"), FACTORS, keys[0], {"node": "src"}, FAST)
    assert res.status == "published"
    return res


@pytest.fixture
def rclone_store(s3, monkeypatch):
    bucket = "cc-" + uuid.uuid4().hex[:12]
    s3.create_bucket(bucket)
    return cache_store(s3, monkeypatch, f"s3://{bucket}/cc")


def test_a_server_error_carrying_a_checksum_header_is_retried_not_fatal(rclone_store, s3, keys, tmp_path,
                                                                          monkeypatch):
    """botocore >= 1.36 (boto/boto3#4754) fails with AttributeError, which we must treat as fatal, when a
    5xx GET carries an x-amz-checksum header and the client validates response checksums; rclone sends
    one when a GET races a PUT of the same key. The store's own client must see a plain 5xx and retry."""
    res = _publish(rclone_store, keys, tmp_path)
    proxy = next(proxy_gen := proxied(s3, monkeypatch))
    try:
        proxy.rule = first_n(1, Reply(500, "InternalError", headers={"x-amz-checksum-crc32": "AAAAAA=="}),
                             lambda r: r.method == "GET" and r.path.endswith(".json"))
        b = _node(tmp_path, "b", compiled=False)
        out = restore.restore(CacheStore(rclone_store.uri), FACTORS, b, keys[1])
        assert (out.status, out.reason) == ("restored", "Restored"), out.message
        envelope = f"/{rclone_store.uri.bucket}/{res.envelope_key}"
        assert [unquote(r.path) for r in proxy.requests if r.method == "GET" and r.path.endswith(".json")] == \
            [envelope, envelope]  # refused once, then read
    finally:
        next(proxy_gen, None)


def test_claim_protocol_yields_to_an_older_live_claim_but_not_to_a_stale_one(rclone_store, keys, tmp_path):
    """rclone ignores If-None-Match, so the claim protocol decides; a crashed writer cannot block forever."""
    env_key = envelope_key(cachekey.prefix(FACTORS, rclone_store.root), cachekey.key_id(FACTORS))
    other = f"{env_key}.claims/g1/{int(time.time() * 1000) - 1000:015d}-{uuid.uuid4().hex}"
    rclone_store.put(other, b"")  # another node claimed a second ago and is still uploading
    lost = publish.publish_once(rclone_store, _node(tmp_path, "a"), FACTORS, keys[0], {}, FAST)
    assert (lost.status, lost.protocol) == ("exists", "claim")
    assert not rclone_store.exists(env_key)
    # Its blob stays: the claimant may publish identical bytes and name this very blob.
    assert len(rclone_store.list(cachekey.prefix(FACTORS, rclone_store.root) + "blobs/")) == 1

    assert rclone_store.tidy(other)
    rclone_store.put(f"{env_key}.claims/g1/{0:015d}-{uuid.uuid4().hex}", b"")  # claimed in 1970, never finished
    won = publish.publish_once(rclone_store, _node(tmp_path, "b"), FACTORS, keys[0], {}, FAST)
    assert won.status == "published"


def test_isa_mismatch_is_refused_and_named(rclone_store, keys, tmp_path):
    _publish(rclone_store, keys, tmp_path)
    avx2 = cachekey.build_factors(PROBE, dataclasses.replace(HW_A, cpu_isa="avx2"), SPEC, {"VLLM_USE_AOT_COMPILE": "1"})
    dest = _node(tmp_path, "avx2", compiled=False)
    out = restore.restore(rclone_store, avx2, dest, keys[1])
    assert (out.status, out.reason) == ("cold", "CacheKeyMismatch")
    assert [m.field for m in out.mismatches] == ["cpu_isa"]
    assert "cpu_isa: node='avx2' bundle='avx512 avx512_vnni amx_tile'" in out.message
    assert "compile will be cold: CacheKeyMismatch" in out.condition_message()
    assert not any(p.exists() for p in dest.values())


def test_signed_manifest_with_other_factors_at_this_key_is_refused(rclone_store, keys, tmp_path):
    """Every factor is compared, not just the key: torch version and GPU name named."""
    res = _publish(rclone_store, keys, tmp_path)
    manifest = signing.open_envelope(rclone_store.get_small(res.envelope_key), keys[1])
    manifest["factors"].update(torch_version="2.12.0+cpu", gpu_model="a10g")
    rclone_store.put(res.envelope_key, signing.seal(manifest, keys[0]))
    out = restore.restore(rclone_store, FACTORS, _node(tmp_path, "b", compiled=False), keys[1])
    assert (out.status, out.reason) == ("cold", "CacheKeyMismatch")
    assert {m.field for m in out.mismatches} == {"torch_version", "gpu_model"}


def test_other_torch_version_finds_nothing_under_its_prefix(rclone_store, keys, tmp_path):
    _publish(rclone_store, keys, tmp_path)
    newer = cachekey.build_factors(dataclasses.replace(PROBE, torch_version="2.14.0+cpu"), HW_A, SPEC, {})
    out = restore.restore(rclone_store, newer, _node(tmp_path, "b", compiled=False), keys[1])
    assert (out.status, out.reason) == ("cold", "CacheNotFound")
    assert "torch-2.14.0" in out.message


def test_tampered_archive_bytes_are_refused(rclone_store, keys, tmp_path):
    res = _publish(rclone_store, keys, tmp_path)
    data = bytearray(rclone_store.client.get_object(Bucket=rclone_store.uri.bucket, Key=res.blob_key)["Body"].read())
    data[len(data) // 2] ^= 0xFF
    rclone_store.put(res.blob_key, bytes(data))
    dest = _node(tmp_path, "b", compiled=False)
    out = restore.restore(rclone_store, FACTORS, dest, keys[1])
    assert (out.status, out.reason) == ("cold", "BundleTampered")
    assert "sha256" in out.message
    assert not any(p.exists() for p in dest.values())


def test_tampered_unsigned_and_foreign_manifests_are_refused(rclone_store, keys, tmp_path):
    res = _publish(rclone_store, keys, tmp_path)
    original = rclone_store.get_small(res.envelope_key)
    env = json.loads(original)
    env["manifest"]["size"] += 1
    unsigned = json.loads(original)
    del unsigned["signature"]
    other = signing.generate(tmp_path / "other.pem")
    cases = [
        ("BundleTampered", json.dumps(env).encode()),
        ("BundleUnsigned", json.dumps(unsigned).encode()),
        ("BundleTampered", signing.seal(json.loads(original)["manifest"], signing.load_private(other.private_path))),
    ]
    for i, (reason, body) in enumerate(cases):
        rclone_store.put(res.envelope_key, body)
        out = restore.restore(rclone_store, FACTORS, _node(tmp_path, f"b{i}", compiled=False), keys[1])
        assert (out.status, out.reason) == ("cold", reason), out.message


def test_path_traversal_archive_is_refused_even_when_signed(rclone_store, keys, tmp_path):
    """A leaked signing key must not turn into writes outside the cache dirs."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in ("vllm/ok", "vllm/../../../escaped"):
            ti = tarfile.TarInfo(name)
            ti.size = 2
            tar.addfile(ti, io.BytesIO(b"hi"))
    blob = zstandard.ZstdCompressor().compress(raw.getvalue())
    sha = hashlib.sha256(blob).hexdigest()
    prefix = cachekey.prefix(FACTORS, rclone_store.root)
    manifest = cachekey.BundleManifest(FACTORS.to_dict(), cachekey.key_id(FACTORS), blob_key(prefix, sha), sha,
                                       len(blob), 2, 4, ("vllm",), (), (), {"node": "evil"})
    rclone_store.put(blob_key(prefix, sha), blob)
    rclone_store.put(envelope_key(prefix, cachekey.key_id(FACTORS)), signing.seal(manifest.to_dict(), keys[0]))
    dest = _node(tmp_path / "deep/er", "b", compiled=False)
    out = restore.restore(rclone_store, FACTORS, dest, keys[1])
    assert (out.status, out.reason) == ("cold", "UnsafeArchive")
    assert "'..'" in out.message
    assert not list(tmp_path.rglob("escaped")) and not dest["vllm"].exists()


def test_empty_bucket_is_a_cold_start(rclone_store, keys, tmp_path):
    out = restore.restore(rclone_store, FACTORS, _node(tmp_path, "b", compiled=False), keys[1])
    assert (out.status, out.reason) == ("cold", "CacheNotFound")
    assert "first node" in out.message


@pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")  # see nodewarm/bootstrap/compilecache/publish.py
def test_watcher_publishes_after_a_compile_goes_quiet(rclone_store, keys, tmp_path):
    roots = _node(tmp_path, "w", compiled=False)
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("r", publish.watch_and_publish(
        rclone_store, roots, FACTORS, keys[0], {"node": "w"}, FAST)))
    t.start()
    time.sleep(0.5)
    write_tree(roots["inductor"], {"locks/x.lock": b""})  # activity, but nothing compiled yet
    time.sleep(1.5)
    assert t.is_alive() and not rclone_store.list(cachekey.prefix(FACTORS, rclone_store.root))
    _node(tmp_path, "w")  # the compile writes its output
    t.join(timeout=30)
    assert box["r"].status == "published", box["r"].message
    out = restore.restore(rclone_store, FACTORS, _node(tmp_path, "r", compiled=False), keys[1])
    assert out.status == "restored" and out.hash_dirs == (f"torch_aot_compile/{HASH}",)


def test_nothing_compiled_publishes_nothing(rclone_store, keys, tmp_path):
    res = publish.publish_once(rclone_store, _node(tmp_path, "e", compiled=False), FACTORS, keys[0], {}, FAST)
    assert res.status == "empty"
    assert rclone_store.list(cachekey.prefix(FACTORS, rclone_store.root), delimiter=None) == []


@pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")  # see nodewarm/bootstrap/compilecache/publish.py
def test_watcher_times_out_without_a_compile(rclone_store, keys, tmp_path):
    settings = dataclasses.replace(FAST, timeout_s=2.0)
    res = publish.watch_and_publish(rclone_store, _node(tmp_path, "idle", compiled=False), FACTORS, keys[0],
                                    {"node": "idle"}, settings)
    assert res.status == "timeout"


def test_cli_keygen_publish_restore_verify_hit(aws_env, tmp_path, capsys):
    """The commands an operator and the node agent run, end to end against the rclone server."""
    aws_env.create_bucket("cli-cc")
    assert cli.main(["bootstrap", "compile-cache", "keygen", "--out", str(tmp_path / "k.pem")]) == 0
    verify_key = json.loads(capsys.readouterr().out)["verifyKey"]
    runtime = tmp_path / "runtime.json"
    runtime.write_text(json.dumps({"runtime": dataclasses.asdict(PROBE), "env": {"VLLM_USE_AOT_COMPILE": "1"}}))
    spec = ["--model", SPEC.model, "--revision", "r1", "--image", SPEC.image, "--runtime", str(runtime),
            "--host-root", str(HOST_A),
            "--engine-arg", "dtype=bfloat16", "--engine-arg", "max_model_len=2048"]
    a = _node(tmp_path, "a")
    assert cli.main(["publish", "--uri", "s3://cli-cc/cc", "--signing-key", str(tmp_path / "k.pem"), "--now",
                     "--claim-settle-seconds", "1.5", "--json", "--vllm-cache-root", str(a["vllm"].parent),
                     "--inductor-dir", str(a["inductor"]), *spec]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "published"

    b = _node(tmp_path, "b", compiled=False)
    dirs = ["--vllm-cache-root", str(b["vllm"].parent), "--inductor-dir", str(b["inductor"])]
    assert cli.main(["bootstrap", "compile-cache", "restore", "--uri", "s3://cli-cc/cc", "--verify-key", verify_key,
                     "--baseline-out", str(tmp_path / "baseline.json"), "--json", *dirs, *spec]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "restored"

    log = tmp_path / "vllm.log"
    log.write_text(f"INFO [decorators.py:311] Directly load AOT compilation from path {b['vllm']}/torch_aot_compile/"
                   f"{HASH}/rank_0_0/model\n")
    verify = ["bootstrap", "compile-cache", "verify-hit", "--baseline", str(tmp_path / "baseline.json"), "--json",
              *dirs, "--log", str(log)]
    assert cli.main(verify) == 0
    assert json.loads(capsys.readouterr().out)["reason"] == "CompileCacheHit"
    write_tree(b["inductor"], {"fxgraph/zz/fzznew/entry": b"recompiled"})
    assert cli.main(verify) == 3
    assert json.loads(capsys.readouterr().out)["reason"] == "InductorRecompiled"

    # --require turns a cold restore into a failure with the reason.
    assert cli.main(["bootstrap", "compile-cache", "restore", "--uri", "s3://cli-cc/other", "--verify-key", verify_key,
                     "--require", *dirs, *spec]) == 1
    assert "CacheNotFound" in capsys.readouterr().err


def test_node_entry_point_restores_and_reports_bad_profile_values_as_cold(aws_env, keys, tmp_path):
    """restore_for_node: what `nodewarm bootstrap run` calls after the weights (client from the AWS env)."""
    aws_env.create_bucket("agent-cc")
    store = CacheStore(parse_uri("s3://agent-cc/cc"))
    assert publish.publish_once(store, _node(tmp_path, "a"), FACTORS, keys[0], {}, FAST).status == "published"
    verify = signing.public_text(keys[1])
    dest = _node(tmp_path, "b", compiled=False)
    dirs = CacheDirs(vllm_root=dest["vllm"].parent, inductor=dest["inductor"])
    env = {"VLLM_USE_AOT_COMPILE": "1"}
    ok = restore.restore_for_node("s3://agent-cc/cc", verify, SPEC, dirs, (PROBE, env), host_root=HOST_A)
    assert (ok.status, ok.hash_dirs) == ("restored", (f"torch_aot_compile/{HASH}",)), ok.message
    for uri, key, reason in (("s3://agent-cc/cc", "not-a-key", "InvalidSigningKey"),
                             ("gs://agent-cc/cc", verify, "InvalidCompileCacheUri")):
        bad = restore.restore_for_node(uri, key, SPEC, dirs, (PROBE, env), host_root=HOST_A)
        assert (bad.status, bad.reason) == ("cold", reason)


def test_host_without_torch_uses_the_signed_runtime_descriptor_of_the_serving_image(aws_env, keys, tmp_path):
    """The AL2023 host agent (and the DaemonSet agent, whose own image is not the serving image) keys the
    restore with the software the publisher recorded from inside the serving image, verified with the
    profile's key and signed for exactly that image; the hardware is its own."""
    aws_env.create_bucket("host-cc")
    uri = "s3://host-cc/cc"
    verify = signing.public_text(keys[1])
    dest = _node(tmp_path, "host", compiled=False)
    dirs = CacheDirs(vllm_root=dest["vllm"].parent, inductor=dest["inductor"])

    before = restore.restore_for_node(uri, verify, SPEC, dirs, host_root=HOST_A)
    assert (before.status, before.reason) == ("cold", "RuntimeUnknown") and SPEC.image in before.message

    env = {"VLLM_USE_AOT_COMPILE": "1"}
    factors = cachekey.build_factors(PROBE, HW_A, SPEC, env)
    store = CacheStore(parse_uri(uri))
    res = publish.publish_once(store, _node(tmp_path, "a"), factors, keys[0], {}, FAST, runtime=PROBE)
    assert res.status == "published"
    after = restore.restore_for_node(uri, verify, SPEC, dirs, host_root=HOST_A)
    assert (after.status, after.hash_dirs) == ("restored", (f"torch_aot_compile/{HASH}",)), after.message
    assert after.hardware == HW_A

    from nodewarm.bootstrap.compilecache import runtimedesc
    from nodewarm.bootstrap.compilecache.cachestore import runtime_key

    # A descriptor signed by another key, or signed for another image, is refused: the node stays cold.
    other = signing.load_private(signing.generate(tmp_path / "other.pem").private_path)
    store.put(runtime_key(store.root, SPEC.image), signing.seal(runtimedesc.payload(SPEC.image, PROBE, env), other))
    forged = restore.restore_for_node(uri, verify, SPEC, CacheDirs(inductor=tmp_path / "fresh"), host_root=HOST_A)
    assert (forged.status, forged.reason) == ("cold", "BundleTampered")
    store.put(runtime_key(store.root, SPEC.image),
              signing.seal(runtimedesc.payload("sha256:" + "ee" * 32, PROBE, env), keys[0]))
    swapped = restore.restore_for_node(uri, verify, SPEC, CacheDirs(inductor=tmp_path / "fresh"), host_root=HOST_A)
    assert (swapped.status, swapped.reason) == ("cold", "BundleTampered") and "not " + repr(SPEC.image) in swapped.message


def test_agent_restore_path_imports_no_torch(aws_env, keys, tmp_path):
    """The agent's compile-cache phase, run as the agent runs it in a fresh process
    (nodewarm_dev.testenv.restore_probe), restores a published bundle keyed through the image's signed descriptor
    without importing, or even trying to import, torch, triton or vLLM: the AL2023 host agent has none of them, and
    importing torch costs seconds the phase must not pay."""
    aws_env.create_bucket("lean-cc")
    uri = "s3://lean-cc/cc"
    env = {"VLLM_USE_AOT_COMPILE": "1"}
    store = CacheStore(parse_uri(uri))
    res = publish.publish_once(store, _node(tmp_path, "a"), cachekey.build_factors(PROBE, HW_A, SPEC, env), keys[0],
                               {}, FAST, runtime=PROBE)
    assert res.status == "published"
    config = tmp_path / "probe.json"
    config.write_text(json.dumps({"uri": uri, "verify_key": signing.public_text(keys[1]), "mount": str(tmp_path / "m"),
                                  "spec": dataclasses.asdict(SPEC), "host_root": str(HOST_A)}))
    proc = subprocess.run([sys.executable, "-m", "nodewarm_dev.testenv.restore_probe", str(config)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT:"))[len("RESULT:"):])
    assert (out["status"], out["files"]) == ("restored", res.files), out["message"]
    assert out["imported"] == [] and out["attempted"] == [], out
