"""Files another model's folder holds verified, hard-linked instead of downloaded: the rule (manifest.same_content,
pure) and model rolls against the real local S3 server."""

from __future__ import annotations

import json
import os

import pytest

from support.bootstrap_fixtures import KiB, model_files, new_bucket, put_model, visible_files
from nodewarm.bootstrap.weights import WeightsConfig, capacity, manifest, warm_weights
from nodewarm.bootstrap.weights.capacity import Headroom, InsufficientNVMe
from nodewarm.bootstrap.weights.manifest import LocalEntry, RemoteObject

MD5 = "0123456789abcdef0123456789abcdef"


def held(size=10, etag=MD5, checksum=None, verified_by="etag-md5", mtime_ns=5) -> LocalEntry:
    return LocalEntry(rel_path="old-name", key="v1/old-name", size=size, etag=etag, version_id=None,
                      checksum=checksum, verified_by=verified_by, mtime_ns=mtime_ns)


def wanted(size=10, etag=MD5, checksum=None, algorithm=None, encrypted=False) -> RemoteObject:
    return RemoteObject(key="v2/new-name", rel_path="new-name", size=size, etag=etag, checksum=checksum,
                        checksum_algorithm=algorithm, encrypted_etag=encrypted)


def test_same_content_is_the_md5_etag_and_size_never_the_name():
    assert manifest.same_content(held(), wanted())  # names differ: irrelevant
    assert manifest.same_content(held(etag=MD5.upper()), wanted())
    assert not manifest.same_content(held(size=11), wanted())
    assert not manifest.same_content(held(etag="f" * 32), wanted())
    assert not manifest.same_content(held(etag=MD5 + "-2"), wanted(etag=MD5 + "-2"))  # depends on the part layout
    assert not manifest.same_content(held(etag="kms"), wanted(etag="kms"))
    assert not manifest.same_content(held(), wanted(encrypted=True))  # SSE-KMS/SSE-C: no digest of the bytes


def test_same_content_by_checksum_when_both_have_one_of_one_algorithm():
    by_crc = held(etag="a" * 32, checksum="AAAAAA==", verified_by="checksum-crc32c")
    assert manifest.same_content(by_crc, wanted(etag="b" * 32, checksum="AAAAAA==", algorithm="CRC32C"))
    # The checksums decide, whatever the ETags say.
    assert not manifest.same_content(by_crc, wanted(etag="a" * 32, checksum="BBBBBB==", algorithm="CRC32C"))
    # Of two algorithms nothing compares: the MD5 ETag decides.
    assert manifest.same_content(by_crc, wanted(etag="a" * 32, checksum="x", algorithm="SHA256"))
    assert not manifest.same_content(by_crc, wanted(etag="b" * 32, checksum="x", algorithm="SHA256"))
    # Linked before: what counts is how the bytes were verified when they were downloaded.
    relinked = held(etag="a" * 32, checksum="AAAAAA==", verified_by="linked:checksum-crc32c")
    assert manifest.same_content(relinked, wanted(etag="b" * 32, checksum="AAAAAA==", algorithm="CRC32C"))


def test_only_verified_untouched_files_may_give_their_bytes():
    assert manifest.may_link_from(held(), (10, 5))
    assert manifest.may_link_from(held(verified_by="linked:etag-md5"), (10, 5))
    assert not manifest.may_link_from(held(), (10, 6))  # written to after it was verified
    assert not manifest.may_link_from(held(), None)  # gone, or not a plain file
    assert not manifest.may_link_from(held(verified_by=manifest.UNVERIFIED), (10, 5))
    assert not manifest.may_link_from(held(verified_by="linked:" + manifest.UNVERIFIED), (10, 5))


def pull(uri: str, dest, *link_from):
    return warm_weights(WeightsConfig(uri=uri, dest=dest, allow_non_nvme=True, headroom=Headroom(0, 0),
                                      load_check=False, link_from=link_from,
                                      pull_overrides={"concurrency": 4, "part_size": 512 * KiB}))


def four_files(seed: int) -> dict[str, bytes]:
    files = model_files(shards=3, mib_per_shard=1, seed=seed)
    return {n: b for n, b in files.items() if n.endswith(".safetensors") or n == "config.json"}


@pytest.fixture
def roll(s3):
    """v1 under one prefix, v2 under another: the same bytes but for one shard, a new one of the same name."""
    bucket, v1 = new_bucket(), four_files(seed=1)
    changed = "model-00003-of-00003.safetensors"
    v2 = {**v1, changed: four_files(seed=2)[changed]}
    assert v2[changed] != v1[changed] and len(v2[changed]) == len(v1[changed])
    return (put_model(s3, v1, prefix="models/v1/", bucket=bucket), v1,
            put_model(s3, v2, prefix="models/v2/", bucket=bucket), v2, changed)


@pytest.mark.s3
def test_a_roll_links_the_unchanged_files_and_downloads_only_the_changed_one(roll, proxy, tmp_path):
    uri1, v1, uri2, v2, changed = roll
    one, two = tmp_path / "view/aaaaaaaaaaaa", tmp_path / "view/bbbbbbbbbbbb"
    pull(uri1, one)
    proxy.reset_counters()

    summary = pull(uri2, two, one)
    assert visible_files(two) == v2 and visible_files(one) == v1
    assert summary.ok and summary.linked_files == 3 and summary.linked_bytes == sum(
        len(b) for n, b in v2.items() if n != changed)
    assert summary.downloaded_files == 1 and summary.downloaded_bytes == len(v2[changed])
    assert {r.path.rsplit("/", 1)[1] for r in proxy.gets()} == {changed} and proxy.body_bytes == len(v2[changed])
    for name in v2:
        assert ((two / name).stat().st_ino == (one / name).stat().st_ino) == (name != changed)
    entries = {e["rel_path"]: e for e in json.loads((two / ".nodewarm/manifest.json").read_text())["files"]}
    assert {n: e["verified_by"] for n, e in entries.items()} == {
        n: "etag-md5" if n == changed else "linked:etag-md5" for n in v2}

    # Both folders are verified models of their own: a rerun of either transfers and links nothing.
    proxy.reset_counters()
    for uri, dest, files in ((uri1, one, v1), (uri2, two, v2)):
        again = pull(uri, dest, one, two)
        assert again.skipped == len(files) and again.linked_files == again.downloaded_files == 0
    assert proxy.gets() == []


@pytest.mark.s3
def test_a_file_written_to_after_it_was_verified_is_not_linked(roll, proxy, tmp_path):
    uri1, _, uri2, v2, changed = roll
    one, two = tmp_path / "one", tmp_path / "two"
    pull(uri1, one)
    st = (one / "config.json").stat()
    os.utime(one / "config.json", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    summary = pull(uri2, two, one)
    assert visible_files(two) == v2
    assert summary.linked_files == 2 and summary.downloaded_files == 2
    assert (two / "config.json").stat().st_ino != (one / "config.json").stat().st_ino


@pytest.mark.s3
def test_capacity_counts_only_the_bytes_to_download(roll, proxy, tmp_path, monkeypatch):
    uri1, _, uri2, v2, changed = roll
    one, two = tmp_path / "one", tmp_path / "two"
    pull(uri1, one)
    room = len(v2[changed]) + 1
    monkeypatch.setattr(capacity, "free_space", lambda path: capacity.Space(path, room, 10 * room))
    with pytest.raises(InsufficientNVMe):
        pull(uri2, tmp_path / "alone")  # with nothing to link from, the model does not fit
    assert pull(uri2, two, one).downloaded_files == 1
