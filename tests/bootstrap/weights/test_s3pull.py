"""Pulling weights from the real local S3 servers: ranged parallel GETs, plan on rerun, resume, checksums, ENOSPC."""

from __future__ import annotations

import io
import json
import time

import pytest

from support.bootstrap_fixtures import (
    KiB, loop_volume, model_files, new_bucket, proxied, put_model, visible_files, warm,
)
from support.s3faults import Reply
from nodewarm.bootstrap import s3client
from nodewarm.bootstrap.weights import listing, s3pull
from nodewarm.bootstrap.weights.partial import partial_paths
from nodewarm.bootstrap.weights.capacity import InsufficientNVMe
from nodewarm.bootstrap.weights.manifest import parse_s3_uri
from nodewarm.bootstrap.weights.progress import Progress, render_bar
from nodewarm.api.errors import NodewarmError

pytestmark = pytest.mark.s3


def ranges_for(proxy, name: str) -> list[int]:
    return sorted(int(r.headers["range"].split("=")[1].split("-")[0]) for r in proxy.gets() if r.path.endswith(name))


def test_pull_splits_files_into_parallel_ranged_gets_and_verifies_each(s3, proxy, tmp_path, monkeypatch):
    import botocore.signers

    files = {**model_files(shards=3, mib_per_shard=2), "sub/empty.txt": b""}
    uri = put_model(s3, files)
    dest = tmp_path / "model"
    signed, sign = [], botocore.signers.generate_presigned_url

    def counting(self, ClientMethod, Params=None, **kw):
        signed.append((ClientMethod, Params["Key"]))
        return sign(self, ClientMethod, Params=Params, **kw)

    # botocore attaches this function to each client class it creates, so the pull's own client counts.
    monkeypatch.setattr(botocore.signers, "generate_presigned_url", counting)
    summary = warm(uri, dest)
    # One presigned URL serves all of a file's parts (signing costs CPU; it covers the host, not the Range).
    gets = [key for method, key in signed if method == "get_object"]
    assert len(gets) == len(set(gets)) == len(files) - 1  # each key signed once; the empty file needs no GET
    # The HEADs are presigned too (sent on the pull's own connections, not botocore's): one per object here
    # (rclone's single-part ETags need no HEAD of part 1).
    assert sorted(key for method, key in signed if method == "head_object") == sorted(
        uri.split("/", 3)[3] + name for name in files)
    assert visible_files(dest) == files
    assert summary.ok and summary.files == len(files) and summary.bytes == sum(map(len, files.values()))
    assert summary.downloaded_bytes == summary.bytes and summary.downloaded_files == len(files)
    assert summary.verified == {"etag-md5": len(files)}  # rclone: ETag = MD5 of the bytes
    shard = next(n for n in files if n.endswith(".safetensors"))
    assert len(ranges_for(proxy, shard)) == -(-len(files[shard]) // (512 * KiB))
    assert not list((dest / ".nodewarm/partial").rglob("*.part"))
    on_disk = json.loads((dest / ".nodewarm/summary.json").read_text())
    assert on_disk["ok"] and set(on_disk["phases"]) >= {"storage", "list", "plan", "capacity", "download"}
    assert on_disk["storage"]["instance_store"] is False  # /tmp here: reported, allowed by the test


def test_rerun_transfers_nothing_and_a_changed_object_is_fetched_again(s3, proxy, tmp_path):
    files = model_files(shards=2, mib_per_shard=1, seed=1)
    uri = put_model(s3, files)
    dest = tmp_path / "model"
    warm(uri, dest)

    proxy.reset_counters()
    again = warm(uri, dest)
    assert proxy.gets() == [] and proxy.body_bytes == 0
    assert again.downloaded_bytes == 0 and again.skipped == len(files) and again.changed == 0

    # Replace one shard at the same key; wait until S3 reports its new ETag.
    bucket, prefix = parse_s3_uri(uri).bucket, parse_s3_uri(uri).prefix
    name = "model-00002-of-00002.safetensors"
    old_etag = s3.client().head_object(Bucket=bucket, Key=prefix + name)["ETag"]
    files[name] = model_files(shards=2, mib_per_shard=1, seed=2)[name]
    (s3.data_dir / bucket / prefix / name).write_bytes(files[name])
    deadline = time.monotonic() + 10
    while s3.client().head_object(Bucket=bucket, Key=prefix + name)["ETag"] == old_etag:
        assert time.monotonic() < deadline, "rclone never noticed the new file"
        time.sleep(0.2)

    proxy.reset_counters()
    third = warm(uri, dest)
    assert third.changed == 1 and third.skipped == len(files) - 1
    assert {r.key().rsplit("/", 1)[1] for r in proxy.gets()} == {name}
    assert visible_files(dest) == files


def test_object_gone_from_s3_is_removed_locally(s3, proxy, tmp_path):
    files = model_files(shards=2, mib_per_shard=0.5, seed=3)
    uri = put_model(s3, files)
    dest = tmp_path / "model"
    warm(uri, dest)
    u = parse_s3_uri(uri)
    s3.client().delete_object(Bucket=u.bucket, Key=u.prefix + "tokenizer_config.json")
    time.sleep(1.2)  # rclone's directory cache
    summary = warm(uri, dest)
    assert summary.removed == 1 and not (dest / "tokenizer_config.json").exists()


def test_interrupted_pull_resumes_at_part_granularity(s3, proxy, tmp_path):
    files = model_files(shards=2, mib_per_shard=2, seed=4)
    uri = put_model(s3, files)
    dest = tmp_path / "model"
    victim = "model-00001-of-00002.safetensors"
    # One connection, parts in order: the victim's first two 512 KiB parts land, the third is refused.
    proxy.rule = lambda r: Reply(403, "AccessDenied") if r.is_get and r.path.endswith(victim) and \
        r.headers["range"].startswith("bytes=1048576-") else None
    with pytest.raises(NodewarmError) as e:
        warm(uri, dest, concurrency=1)
    assert e.value.reason == "S3AccessDenied"
    assert not (dest / victim).exists() and (dest / ".nodewarm/partial" / (victim + ".part")).exists()

    proxy.rule = lambda r: None
    proxy.reset_counters()
    summary = warm(uri, dest, concurrency=1)
    assert visible_files(dest) == files
    assert ranges_for(proxy, victim)[0] == 1048576  # parts 0 and 1 were not fetched again
    assert summary.downloaded_bytes == sum(len(d) for n, d in files.items() if n != "config.json") - 1048576


def test_s3_checksums_and_multipart_etags_are_verified_and_versions_pinned(s3_exact, tmp_path, monkeypatch):
    for k, v in s3_exact.env().items():
        monkeypatch.setenv(k, v)
    bucket = new_bucket()
    s3_exact.create_bucket(bucket)
    plain = s3_exact.client(request_checksum_calculation="when_required")
    plain.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    files = model_files(shards=4, mib_per_shard=6, seed=5)
    names = sorted(n for n in files if n.endswith(".safetensors"))
    plain.put_object(Bucket=bucket, Key=f"m/{names[0]}", Body=files[names[0]], ChecksumAlgorithm="CRC32C")
    plain.put_object(Bucket=bucket, Key=f"m/{names[1]}", Body=files[names[1]], ChecksumAlgorithm="SHA256")
    for name, algo in ((names[2], "CRC32"), (names[3], None)):  # multipart: composite checksum / "-N" ETag
        extra = {"ChecksumAlgorithm": algo} if algo else {}
        up = plain.create_multipart_upload(Bucket=bucket, Key=f"m/{name}", **extra)
        data, size, parts = files[name], 5 * 1024 * 1024, []
        for i, off in enumerate(range(0, len(data), size), 1):
            r = plain.upload_part(Bucket=bucket, Key=f"m/{name}", UploadId=up["UploadId"], PartNumber=i,
                                  Body=data[off:off + size], **extra)
            parts.append({"PartNumber": i, "ETag": r["ETag"], **({f"Checksum{algo}": r[f"Checksum{algo}"]} if algo else {})})
        plain.complete_multipart_upload(Bucket=bucket, Key=f"m/{name}", UploadId=up["UploadId"],
                                        MultipartUpload={"Parts": parts})
    for name in files:
        if not name.endswith(".safetensors"):
            plain.put_object(Bucket=bucket, Key=f"m/{name}", Body=files[name])
    uri, dest = f"s3://{bucket}/m/", tmp_path / "model"

    summary = warm(uri, dest, part_size=1024 * 1024)
    assert visible_files(dest) == files
    assert summary.verified["checksum-crc32c"] >= 1 and summary.verified["checksum-sha256"] == 1
    assert summary.verified["checksum-crc32-composite"] == 1 and summary.verified["etag-md5-multipart"] == 1

    # Same bytes uploaded again: same ETag, new VersionId -> fetched again.
    plain.put_object(Bucket=bucket, Key=f"m/{names[0]}", Body=files[names[0]], ChecksumAlgorithm="CRC32C")
    again = warm(uri, dest)
    assert again.changed == 1 and again.downloaded_files == 1


def test_disk_full_fails_before_any_get_and_leaves_nothing_behind(s3, proxy, tmp_path):
    files = model_files(shards=3, mib_per_shard=3, seed=6)
    uri = put_model(s3, files)
    u = parse_s3_uri(uri)
    with loop_volume(tmp_path, 8) as vol:  # smaller than the model; the capacity check is bypassed here
        dest = vol / "model"
        client = s3client.make_client(4, 2, 2)
        objects, _ = listing.list_model(client, u, s3client.RetryPolicy(attempts=2))
        config = s3pull.PullConfig(concurrency=4, part_size=512 * KiB)
        with pytest.raises(InsufficientNVMe) as e, Progress("download", sum(map(len, files.values()))) as progress:
            s3pull.pull(client, u.bucket, objects, dest, config, progress, on_file=lambda f: None)
        assert "disk full" in str(e.value)
        assert visible_files(dest) == {}
        assert not [p for p in (dest / ".nodewarm/partial").rglob("*") if p.is_file()]
        assert proxy.gets() == []



def test_progress_reports_bytes_rate_and_eta():
    now = [0.0]
    stream = io.StringIO()
    p = Progress("download", 1000, interval_s=100, stream=stream, clock=lambda: now[0])
    p.add(250)
    now[0] = 1.0
    s = p.snapshot()
    assert (s.done, s.rate_bps, s.eta_s) == (250, 250.0, 3.0)
    assert "25.0%" in render_bar(s) and "ETA 3s" in render_bar(s)


MiB = 1024 * KiB


@pytest.fixture
def exact_proxy(s3_exact, monkeypatch):
    """A fault proxy in front of SeaweedFS (AWS-exact multipart ETags and composite checksums)."""
    yield from proxied(s3_exact, monkeypatch)


def _multipart(client, bucket: str, key: str, data: bytes, part: int, algo: str | None) -> None:
    extra = {"ChecksumAlgorithm": algo} if algo else {}
    up = client.create_multipart_upload(Bucket=bucket, Key=key, **extra)
    parts = []
    for i, off in enumerate(range(0, len(data), part), 1):
        r = client.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=i,
                               Body=data[off:off + part], **extra)
        parts.append({"PartNumber": i, "ETag": r["ETag"], **({f"Checksum{algo}": r[f"Checksum{algo}"]} if algo else {})})
    client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up["UploadId"], MultipartUpload={"Parts": parts})


def test_gets_follow_upload_parts_and_verification_never_rereads_the_file(s3_exact, exact_proxy, tmp_path,
                                                                           monkeypatch):
    from nodewarm_dev.testenv.faultproxy import Corrupt, first_n
    from nodewarm.bootstrap.weights import verify

    def reread(*a, **kw):
        raise AssertionError("verification read the file again")

    monkeypatch.setattr(verify, "_digest_file", reread)
    bucket = new_bucket()
    s3_exact.create_bucket(bucket)
    plain = s3_exact.client(request_checksum_calculation="when_required")
    files = model_files(shards=3, mib_per_shard=12, seed=31)
    names = sorted(n for n in files if n.endswith(".safetensors"))
    _multipart(plain, bucket, f"m/{names[0]}", files[names[0]], 5 * MiB, "CRC32")   # composite checksum
    _multipart(plain, bucket, f"m/{names[1]}", files[names[1]], 5 * MiB, None)      # "-N" MD5 ETag only
    plain.put_object(Bucket=bucket, Key=f"m/{names[2]}", Body=files[names[2]], ChecksumAlgorithm="CRC64NVME")
    for name in files:
        if not name.endswith(".safetensors"):
            plain.put_object(Bucket=bucket, Key=f"m/{name}", Body=files[name])
    # The composite file's second part arrives damaged once: its part CRC gives it away.
    exact_proxy.rule = first_n(1, Corrupt(at=10), match=lambda r: r.is_get and r.path.endswith(names[0])
                               and r.headers["range"].startswith(f"bytes={5 * MiB}-"))

    summary = warm(f"s3://{bucket}/m/", tmp_path / "model")  # 512 KiB parts asked for: upload parts win
    assert visible_files(tmp_path / "model") == files
    assert summary.verified["checksum-crc32-composite"] == 1 and summary.verified["etag-md5-multipart"] == 1
    assert summary.verified["checksum-crc64nvme"] == 1
    starts = lambda name: sorted(int(r.headers["range"].split("=")[1].split("-")[0])  # noqa: E731
                                 for r in exact_proxy.gets() if r.path.endswith(name))
    assert starts(names[0]) == [0, 0, 5 * MiB, 5 * MiB, 10 * MiB, 10 * MiB]  # damaged: the whole file again
    assert starts(names[1]) == [0, 5 * MiB, 10 * MiB]
    assert starts(names[2]) == list(range(0, len(files[names[2]]), 512 * KiB))  # a full CRC combines any split


def test_resume_trusts_a_journaled_part_only_by_its_own_digest(s3_exact, exact_proxy, tmp_path):
    bucket = new_bucket()
    s3_exact.create_bucket(bucket)
    plain = s3_exact.client(request_checksum_calculation="when_required")
    data = model_files(shards=1, mib_per_shard=15, seed=32)
    name = next(n for n in data if n.endswith(".safetensors"))
    _multipart(plain, bucket, f"m/{name}", data[name], 5 * MiB, None)
    uri, dest = f"s3://{bucket}/m/", tmp_path / "model"
    exact_proxy.rule = lambda r: Reply(403, "AccessDenied") if r.is_get and r.path.endswith(name) and \
        r.headers["range"].startswith(f"bytes={10 * MiB}-") else None
    with pytest.raises(NodewarmError):
        warm(uri, dest, concurrency=1)
    temp, journal = partial_paths(dest, name)
    header, *lines = journal.read_text().splitlines()
    assert json.loads(header)["part_digest"] == "MD5" and json.loads(header)["part_size"] == 5 * MiB
    assert sorted(line.split()[0] for line in lines) == ["0", "1"] and all(len(line.split()[1]) == 32 for line in lines)
    with open(temp, "r+b") as f:  # part 1's bytes lost in a host crash; its journal line survived
        f.seek(5 * MiB + 100)
        f.write(b"\0" * 10)

    exact_proxy.rule = lambda r: None
    exact_proxy.reset_counters()
    summary = warm(uri, dest, concurrency=1)
    assert visible_files(dest)[name] == data[name] and summary.verified["etag-md5-multipart"] == 1
    assert sorted(int(r.headers["range"].split("=")[1].split("-")[0]) for r in exact_proxy.gets()
                  if r.path.endswith(name)) == [5 * MiB, 10 * MiB, 15 * MiB]  # part 0 resumed


def test_pull_goes_through_the_https_proxy_the_environment_names(s3, tmp_path, monkeypatch):
    """Nodes without a route to S3 reach it by a proxy: HTTP(S)_PROXY as botocore reads it, by CONNECT."""
    import select
    import socket
    import socketserver
    import threading
    import urllib.parse

    tunnels: list[str] = []

    class Tunnel(socketserver.BaseRequestHandler):
        def handle(self):
            head = b""
            while b"\r\n\r\n" not in head:
                head += self.request.recv(4096)
            method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ")
            if method == "CONNECT":  # the pull's ranged GETs
                tunnels.append(target)
                host, port = target.rsplit(":", 1)
                upstream = socket.create_connection((host, int(port)))
                self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:  # botocore's listing and HEADs: a plain forward proxy (the server takes absolute URIs)
                upstream = socket.create_connection(urllib.parse.urlsplit(target)[1].rsplit(":", 1))
                upstream.sendall(head)
            socks = [self.request, upstream]
            while True:
                ready, _, _ = select.select(socks, [], [], 5)
                if not ready:
                    break
                for s in ready:
                    data = s.recv(1 << 16)
                    if not data:
                        upstream.close()
                        return
                    (upstream if s is self.request else self.request).sendall(data)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Tunnel)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.server_address[1]}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        files = model_files(shards=2, mib_per_shard=1, seed=33)
        uri = put_model(s3, files)
        summary = warm(uri, tmp_path / "model")
        assert visible_files(tmp_path / "model") == files and summary.downloaded_files == len(files)
        endpoint = s3.endpoint.split("://", 1)[1]
        assert tunnels and set(tunnels) == {endpoint}
    finally:
        server.shutdown()
        server.server_close()


def test_manifest_is_rewritten_per_interval_not_per_file(s3, proxy, tmp_path, monkeypatch):
    """Each save rewrites every entry and fsyncs: once per file it was quadratic in the file count."""
    from nodewarm.bootstrap.weights import manifest, pipeline

    files = {f"shard-{i:02d}.safetensors": bytes([i]) * 1000 for i in range(24)}
    uri = put_model(s3, files)
    saves, save = [], manifest.save_local
    monkeypatch.setattr(manifest, "save_local", lambda path, m: (saves.append(len(m.entries)), save(path, m)))
    monkeypatch.setattr(pipeline, "MANIFEST_SAVE_S", 3600.0)
    summary = warm(uri, tmp_path / "model")
    assert summary.downloaded_files == len(files)
    assert saves == [0, len(files)]  # the plan's (nothing yet), then once when the pull ends
    again = warm(uri, tmp_path / "model")
    assert again.downloaded_files == 0 and again.skipped == len(files)


def test_gets_start_while_the_heads_are_still_under_way(s3, proxy, tmp_path):
    """The pull does not wait for the last HEAD: each file's GETs start once its own HEAD is back (a model
    of many files spent its whole HEAD phase before the first byte)."""
    import threading

    from nodewarm_dev.testenv.faultproxy import Hook

    files = model_files(shards=3, mib_per_shard=1, seed=77)
    uri = put_model(s3, files)
    last = sorted(files)[-1]
    got_a_get, waited = threading.Event(), []

    def rule(r):
        if r.is_get:
            got_a_get.set()
        elif r.method == "HEAD" and r.path.endswith(last):
            # Held until some GET has arrived: a pull that waited for every HEAD would never send one.
            return Hook(lambda req: waited.append(got_a_get.wait(20)))
        return None

    proxy.rule = rule
    summary = warm(uri, tmp_path / "model", stall_timeout_s=30.0, request_timeout_s=60.0)
    assert waited == [True]
    assert visible_files(tmp_path / "model") == files and summary.downloaded_files == len(files)
    assert summary.started_at <= summary.first_request_at <= summary.first_byte_at
