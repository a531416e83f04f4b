"""Verification means verification: no size-only "verified", resume trusts only parts whose bytes
survived, torn journal lines are ignored, and a file corrupted in transit is fetched again (bounded).
On a real loop-mounted ext4 volume, against the real local S3 server behind the fault proxy."""

from __future__ import annotations

import hashlib
import json

import pytest

from support.bootstrap_fixtures import KiB, loop_volume, model_files, put_model, visible_files, warm
from nodewarm_dev.testenv.faultproxy import Corrupt, Headers, first_n
from support.s3faults import Reply
from nodewarm.bootstrap.weights.partial import partial_paths
from nodewarm.api.errors import NodewarmError

pytestmark = pytest.mark.s3

# What S3 says about an SSE-KMS object: its ETag is not an MD5 of the bytes, and it carries no checksum.
KMS = {"x-amz-server-side-encryption": "aws:kms"}
PART = 512 * KiB


def kms_heads(req):
    return Headers(set=KMS) if req.method == "HEAD" else None


def starts(proxy, name: str) -> list[int]:
    return sorted(int(r.headers["range"].split("=")[1].split("-")[0]) for r in proxy.gets() if r.path.endswith(name))


def test_an_object_without_a_usable_checksum_is_recorded_never_called_verified(s3, proxy, tmp_path):
    files = model_files(shards=2, mib_per_shard=1, seed=21)
    uri = put_model(s3, files)
    proxy.rule = kms_heads
    with loop_volume(tmp_path, 64) as vol:
        dest = vol / "m"
        summary = warm(uri, dest)
        assert visible_files(dest) == files
        assert summary.verified == {"unverified-sha256": len(files)} and summary.unverified == len(files)
        assert "NOT verified" in summary.message
        entries = json.loads((dest / ".nodewarm/manifest.json").read_text())["files"]
        assert {e["rel_path"]: (e["verified_by"], e["sha256"]) for e in entries} == \
            {name: ("unverified-sha256", hashlib.sha256(data).hexdigest()) for name, data in files.items()}


def test_resume_after_a_host_crash_refetches_parts_whose_bytes_did_not_survive(s3, proxy, tmp_path):
    files = model_files(shards=1, mib_per_shard=3, seed=22)  # one 3 MiB shard: six 512 KiB parts
    uri = put_model(s3, files)
    victim = next(n for n in files if n.endswith(".safetensors"))

    def refuse_part_4(req):
        if req.is_get and req.path.endswith(victim) and req.headers["range"].startswith(f"bytes={4 * PART}-"):
            return Reply(403, "AccessDenied")
        return kms_heads(req)

    with loop_volume(tmp_path, 64) as vol:
        dest = vol / "m"
        proxy.rule = refuse_part_4  # one connection, parts in order: 0-3 land and are journaled
        with pytest.raises(NodewarmError):
            warm(uri, dest, concurrency=1)
        temp, journal = partial_paths(dest, victim)
        # What a host crash can leave: the journal durable but part 1's bytes not (zeros of the
        # preallocated file), and a line torn mid-write that names a part never written.
        with open(temp, "r+b") as f:
            f.seek(PART)
            f.write(b"\0" * PART)
        with open(journal, "a") as f:
            f.write("5")
        proxy.rule = kms_heads
        proxy.reset_counters()
        summary = warm(uri, dest, concurrency=1)
        assert visible_files(dest) == files  # no zero-filled range kept, though nothing here has a checksum
        n_parts = -(-len(files[victim]) // PART)
        # Parts 0, 2 and 3 resumed (their bytes held); 1 (zeros), 4, 5 (named only by the torn line)... fetched.
        assert starts(proxy, victim) == [PART] + [i * PART for i in range(4, n_parts)]
        assert summary.downloaded_bytes == sum(len(d) for n, d in files.items() if n != "config.json") - 3 * PART


def test_a_file_corrupted_in_transit_is_fetched_again(s3, proxy, tmp_path):
    files = model_files(shards=2, mib_per_shard=1.5, seed=23)
    uri = put_model(s3, files)
    victim = sorted(n for n in files if n.endswith(".safetensors"))[0]
    first_part = lambda r: r.is_get and r.path.endswith(victim) and r.headers["range"].startswith("bytes=0-")  # noqa: E731
    proxy.rule = first_n(2, Corrupt(at=10), match=first_part)  # two downloads in a row arrive damaged
    with loop_volume(tmp_path, 64) as vol:
        summary = warm(uri, vol / "m")
        assert visible_files(vol / "m") == files
        assert summary.verified["etag-md5"] == len(files)
        assert starts(proxy, victim).count(0) == 3


def test_crc32_comes_from_zlib_ng_and_matches_the_standard_value_chunk_by_chunk():
    # awscrt's CRC32 is software on x86 (a fifth of the pull's CPU); the pull hashes with zlib-ng's, which
    # must give exactly the value S3 and zlib compute, however the bytes are split.
    import os
    import zlib

    from zlib_ng import zlib_ng

    from nodewarm.bootstrap.weights.verify import hasher_factory

    data = os.urandom(3 * 1024 * 1024 + 17)
    h = hasher_factory("CRC32")()
    for cut in range(0, len(data), 1024 * 1024 - 3):
        h.update(memoryview(data)[cut:cut + 1024 * 1024 - 3])
    assert h._fn is zlib_ng.crc32
    assert h.digest() == zlib.crc32(data).to_bytes(4, "big")
