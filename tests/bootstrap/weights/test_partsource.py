"""The pull's other source of parts is whatever it is handed (weights/sharing.py's PartSource), and what it gives is
verified like S3's bytes: a file with a wrong byte from it is rejected and comes again from S3 alone.

The source here is a test double of the seam (peers/fetch.py's PeerSource is the real one, tests/bootstrap/peers).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import boto3
import pytest

from support.bootstrap_fixtures import KiB, model_files, put_model, visible_files, warm
from nodewarm.bootstrap.s3client import RetryPolicy
from nodewarm.bootstrap.weights import s3pull
from nodewarm.bootstrap.weights.manifest import RemoteObject
from nodewarm.bootstrap.weights.progress import Progress

CHUNK = 4 * KiB


@dataclass(frozen=True)
class Holder:
    node: str


@dataclass(frozen=True)
class Choice:
    source: str
    peer: Holder | None = None


class Conns:
    def __init__(self):
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeSource:
    """Holds ``files`` (rel path -> bytes) as holder "h"; ``flip``: (rel, offset) of a byte it gives wrong. The first
    ask for each part is answered "wait", so the pull's deferral goes through the seam too."""

    retry_after_s = 0.01

    def __init__(self, files: dict[str, bytes], flip: tuple[str, int] | None = None):
        self.files, self.flip = files, flip
        self.asked: set[tuple[str, int]] = set()
        self.conns: list[Conns] = []
        self.parts: list[tuple[str, int]] = []
        self.dropped: dict[str, str] = {}
        self.s3_parts = self.bytes_discarded = 0

    def connections(self) -> Conns:
        self.conns.append(Conns())
        return self.conns[-1]

    def choose(self, rel, offset, waited_s, skip):
        if "h" in skip or "h" in self.dropped:
            return Choice("s3")
        if (rel, offset) not in self.asked:
            self.asked.add((rel, offset))
            return Choice("wait")
        return Choice("peer", Holder("h"))

    def fetch(self, conns, holder, rel, etag, offset, length, buf, on_chunk, cancelled):
        assert conns in self.conns and holder == Holder("h")
        data = bytearray(self.files[rel][offset:offset + length])
        if self.flip is not None and self.flip[0] == rel and offset <= self.flip[1] < offset + length:
            data[self.flip[1] - offset] ^= 0xFF
        for start in range(0, length, CHUNK):
            on_chunk(memoryview(data)[start:start + CHUNK], start)
        self.parts.append((rel, offset))

    def drop(self, node, why):
        self.dropped.setdefault(node, why)

    def from_s3(self):
        self.s3_parts += 1

    def discarded(self, nbytes):
        self.bytes_discarded += nbytes

    def summary(self):
        return {"parts": len(self.parts), "partsFromS3": self.s3_parts, "dropped": dict(self.dropped)}


def test_parts_from_an_injected_source_land_verified_and_s3_is_never_asked(tmp_path):
    data = bytes(range(256)) * 1000  # 256,000 bytes: 4 parts of 64 KiB, the last one short
    obj = RemoteObject("models/m/w.bin", "w.bin", len(data), hashlib.md5(data).hexdigest())
    # Nothing listens there: a GET to "S3" would fail the pull.
    client = boto3.client("s3", endpoint_url="http://127.0.0.1:9", region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    source, pulled = FakeSource({obj.rel_path: data}), []
    cfg = s3pull.PullConfig(concurrency=2, part_size=64 * KiB, retry=RetryPolicy(attempts=1, base_s=0.01, cap_s=0.01))
    with Progress("download", len(data), 3600) as progress:
        s3pull.pull(client, "b", [obj], tmp_path, cfg, progress, pulled.append, peers=source)
    assert (tmp_path / "w.bin").read_bytes() == data
    assert [(p.obj.rel_path, p.verified_by) for p in pulled] == [("w.bin", "etag-md5")]
    assert sorted(source.parts) == [("w.bin", i * 64 * KiB) for i in range(4)]
    assert source.s3_parts == 0 and source.dropped == {}
    assert len(source.conns) == 2 and all(c.closed for c in source.conns)  # one per worker, closed as it ends


@pytest.mark.s3
def test_a_wrong_byte_from_the_injected_source_is_rejected_and_the_file_comes_from_s3(s3, proxy, tmp_path):
    files = model_files(shards=2, mib_per_shard=1)
    uri = put_model(s3, files)
    shard = next(n for n in files if n.endswith(".safetensors"))
    source = FakeSource(files, flip=(shard, 100_000))
    proxy.reset_counters()
    summary = warm(uri, tmp_path / "m", peers=source)
    assert summary.ok and visible_files(tmp_path / "m") == files  # the wrong byte never got a final name
    assert "verification" in source.dropped["h"]
    assert source.bytes_discarded > 0
    assert proxy.body_bytes >= len(files[shard])  # that file came again, from S3
    assert summary.peers == source.summary()  # the pull reports what its source says
