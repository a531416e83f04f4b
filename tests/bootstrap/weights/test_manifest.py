"""nodewarm.bootstrap.weights.manifest (listing -> plan, pure) and nodewarm.bootstrap.weights.verify's choice of
evidence."""

from __future__ import annotations

import base64
import hashlib
import json
import zlib

import pytest

from nodewarm.bootstrap.weights import manifest, verify
from nodewarm.bootstrap.weights.manifest import LocalEntry, LocalManifest, RemoteObject


def obj(rel: str, size: int = 10, etag: str = "e1", version: str | None = None, checksum: str | None = None):
    return RemoteObject(key=f"m/{rel}", rel_path=rel, size=size, etag=etag, version_id=version, checksum=checksum)


def entry(o: RemoteObject, mtime_ns: int = 111) -> LocalEntry:
    return LocalEntry(rel_path=o.rel_path, key=o.key, size=o.size, etag=o.etag, version_id=o.version_id,
                      checksum=o.checksum, verified_by="etag-md5", mtime_ns=mtime_ns)


def test_parse_s3_uri():
    assert manifest.parse_s3_uri("s3://b/models/llama") == manifest.S3Uri("b", "models/llama/")
    assert manifest.parse_s3_uri("s3://b/models/llama/") == manifest.S3Uri("b", "models/llama/")
    assert manifest.parse_s3_uri("s3://b") == manifest.S3Uri("b", "")
    for bad in ("http://b/x", "s3:///x", "b/x"):
        with pytest.raises(manifest.InvalidModelSource):
            manifest.parse_s3_uri(bad)


@pytest.mark.parametrize("key", ["m/../etc/passwd", "m//x", "m/a/./b", "m/.nodewarm/manifest.json", "m/"])
def test_keys_that_would_escape_dest_are_refused(key):
    with pytest.raises(manifest.InvalidModelSource):
        manifest.rel_path_for(key, "m/")


def test_rel_path_keeps_subfolders():
    assert manifest.rel_path_for("m/original/params.json", "m/") == "original/params.json"


def test_select_skips_folder_markers_and_redundant_weights_only_when_safetensors_exist():
    keys = ["m/", "m/config.json", "m/model.safetensors", "m/pytorch_model.bin", "m/tokenizer.model"]
    wanted, skipped = manifest.select(keys, "m/")
    assert wanted == ["m/config.json", "m/model.safetensors", "m/tokenizer.model"]
    assert skipped == ["m/pytorch_model.bin"]
    wanted, _ = manifest.select(["m/config.json", "m/pytorch_model.bin"], "m/")
    assert wanted == ["m/config.json", "m/pytorch_model.bin"]
    wanted, skipped = manifest.select(keys, "m/", exclude=("tokenizer.*",))
    assert "m/tokenizer.model" in skipped


def test_plan_first_run_fetches_everything():
    remote = [obj("a"), obj("b")]
    p = manifest.plan(remote, LocalManifest("s3://b/m/"), {})
    assert [(f.obj.rel_path, f.why) for f in p.fetch] == [("a", "new"), ("b", "new")]
    assert p.fetch_bytes == 20 and not p.keep and not p.remove


def test_plan_restart_with_nothing_changed_fetches_nothing():
    remote = [obj("a"), obj("b", version="v1", checksum="abc=")]
    local = LocalManifest("u", {o.rel_path: entry(o) for o in remote})
    p = manifest.plan(remote, local, {"a": (10, 111), "b": (10, 111)})
    assert not p.fetch and [o.rel_path for o in p.keep] == ["a", "b"]


@pytest.mark.parametrize("changed", [
    dict(etag="e2"), dict(version="v2"), dict(size=11), dict(checksum="new="),
])
def test_plan_refetches_an_object_changed_at_the_same_key(changed):
    before = obj("a", version="v1", checksum="old=")
    after = obj("a", **{"version": "v1", "checksum": "old=", **changed})
    p = manifest.plan([after], LocalManifest("u", {"a": entry(before)}), {"a": (10, 111)})
    assert [(f.obj.rel_path, f.why) for f in p.fetch] == [("a", "changed")] and p.changed == 1


def test_plan_refetches_files_deleted_or_modified_locally_and_removes_stale_ones():
    a, b = obj("a"), obj("b")
    local = LocalManifest("u", {"a": entry(a), "b": entry(b), "gone.safetensors": entry(obj("gone.safetensors"))})
    p = manifest.plan([a, b], local, {"b": (10, 999)})
    assert [(f.obj.rel_path, f.why) for f in p.fetch] == [("a", "missing-locally"), ("b", "modified-locally")]
    assert p.remove == ("gone.safetensors",)


def test_local_manifest_round_trip_and_rejects_other_uris_or_garbage(tmp_path):
    path = tmp_path / "manifest.json"
    m = LocalManifest("s3://b/m/", {"a": entry(obj("a"))})
    manifest.save_local(path, m)
    assert manifest.load_local(path, "s3://b/m/").entries == m.entries
    assert manifest.load_local(path, "s3://other/m/").entries == {}
    path.write_text("{not json")
    assert manifest.load_local(path, "s3://b/m/").entries == {}
    assert manifest.load_local(tmp_path / "absent.json", "s3://b/m/").entries == {}


def test_another_uris_files_are_planned_for_removal_and_unsafe_paths_never_are(tmp_path):
    path = tmp_path / "manifest.json"
    paths = ["a", "sub/b", "/etc/passwd", "../../x", "sub/../../y", "./c", ".nodewarm/manifest.json", ""]
    manifest.save_local(path, LocalManifest("s3://b/old/", {p: entry(obj("a")) for p in paths}))
    raw = json.loads(path.read_text())
    for e, p in zip(raw["files"], sorted(paths)):
        e["rel_path"] = p  # entry() names every file "a": give each its own path, as a hand-edited file would
    path.write_text(json.dumps(raw))
    new = manifest.load_local(path, "s3://b/new/")
    assert new.entries == {} and new.previous == ("a", "sub/b")
    plan = manifest.plan([obj("a")], new, {})
    assert plan.remove == ("sub/b",) and [f.why for f in plan.fetch] == ["new"]  # "a" is overwritten, not removed
    assert set(manifest.load_local(path, "s3://b/old/").entries) == {"a", "sub/b"}


def test_a_launch_failure_record_is_read_as_written_and_damage_is_contained():
    from nodewarm.bootstrap import launchrecord

    rec = launchrecord.parse("reason=ArtifactFetchFailed\nstatus=1\ntime=2026-11-30T19:00:00Z\n\nfatal error:\n  403\n")
    assert rec == launchrecord.LaunchFailure("ArtifactFetchFailed", 1, "2026-11-30T19:00:00Z", "fatal error: 403")
    odd = launchrecord.parse("reason=<script>\nstatus=x\n")
    assert (odd.reason, odd.status, odd.message) == ("LaunchFailed", -1, "(no message)")


# --- verify: which evidence, and that it catches a flipped byte ---------------------------------------


def b64(d: bytes) -> str:
    return base64.b64encode(d).decode()


def test_method_prefers_checksum_then_md5_etag_and_never_calls_size_verified():
    data = b"x" * 100
    crc = b64(zlib.crc32(data).to_bytes(4, "big"))
    md5 = hashlib.md5(data).hexdigest()
    with_crc = RemoteObject("k", "k", 100, md5, checksum_algorithm="CRC32", checksum=crc)
    assert verify.method_for(with_crc).name == "checksum-crc32"
    assert verify.method_for(RemoteObject("k", "k", 100, md5)).name == "etag-md5"
    kms = RemoteObject("k", "k", 100, "0123abcd", encrypted_etag=True)
    assert verify.method_for(kms).name == verify.UNVERIFIED and verify.method_for(kms).expected is None
    # a multipart ETag without part 1's size cannot be recomputed
    assert verify.method_for(RemoteObject("k", "k", 100, md5 + "-3")).name == verify.UNVERIFIED


def test_multipart_etag_and_composite_checksum_are_recomputed_per_part(tmp_path):
    data = bytes(range(256)) * 40  # 10240 bytes in parts of 4096, 4096, 2048
    parts = [data[:4096], data[4096:8192], data[8192:]]
    etag = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + "-3"
    composite = b64(hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts)).digest()) + "-3"
    path = tmp_path / "f"
    path.write_bytes(data)
    o = RemoteObject("k", "f", len(data), etag, checksum_algorithm="SHA256", checksum=composite, first_part_size=4096)
    assert verify.verify_file(path, o) == "checksum-sha256-composite"
    assert verify.verify_file(path, RemoteObject("k", "f", len(data), etag, first_part_size=4096)) == \
        "etag-md5-multipart"


def test_a_flipped_byte_or_a_short_file_fails_verification(tmp_path):
    data = b"weights" * 1000
    path = tmp_path / "model.safetensors"
    path.write_bytes(data[:-1] + b"X")
    o = RemoteObject("k", "model.safetensors", len(data), hashlib.md5(data).hexdigest())
    with pytest.raises(verify.VerifyFailed) as e:
        verify.verify_file(path, o)
    assert e.value.reason == "VerifyFailed" and "model.safetensors" in str(e.value)
    path.write_bytes(data[:-1])
    with pytest.raises(verify.VerifyFailed, match="bytes on disk"):
        verify.verify_file(path, o)


@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "CRC64NVME"])
def test_full_object_crc_is_hashed_in_segments_and_combined(tmp_path, monkeypatch, algorithm):
    from awscrt import checksums

    monkeypatch.setattr(verify, "CRC_SEGMENT", 4096)
    data = bytes(range(256)) * 100 + b"tail"  # 25604 bytes: 6 full segments and a short one
    path = tmp_path / "f"
    path.write_bytes(data)
    crc = getattr(checksums, algorithm.lower())(data)
    expected = b64(crc.to_bytes(8 if algorithm == "CRC64NVME" else 4, "big"))
    o = RemoteObject("k", "f", len(data), "etag", checksum_algorithm=algorithm, checksum=expected)
    assert verify.verify_file(path, o) == f"checksum-{algorithm.lower()}"
    path.write_bytes(data[:5000] + b"?" + data[5001:])
    with pytest.raises(verify.VerifyFailed):
        verify.verify_file(path, o)
