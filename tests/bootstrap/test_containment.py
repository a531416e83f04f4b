"""Nothing outside its folder touched: manifest paths are checked before root unlinks them, no symlink
in DEST or in the pod-writable compile-cache hostPath is followed, a new model URI removes the old
model's files, partials of deleted objects go, restore checks free space, and a full local disk is
reported as such (never as an S3 error). Real loop-mounted ext4 volumes, real local S3 servers."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

from support.bootstrap_fixtures import KiB, loop_volume, model_files, put_model, visible_files, warm
from support.s3faults import Reply
from nodewarm.bootstrap.agent import AgentConfig
from nodewarm.bootstrap.compilecache import cachekey, hardware, publish, restore, signing
from nodewarm.bootstrap.compilecache.cachestore import CacheStore, parse_uri
from nodewarm.bootstrap.weights.partial import PARTIAL_DIR
from nodewarm.api.errors import NodewarmError

pytestmark = pytest.mark.s3

MiB = 1024 * KiB


def test_manifest_paths_outside_dest_are_never_unlinked(s3, proxy, tmp_path):
    files = model_files(shards=1, mib_per_shard=1, seed=31)
    uri = put_model(s3, files)
    with loop_volume(tmp_path, 64) as vol:
        dest = vol / "models" / "m"
        warm(uri, dest)
        absolute, upward, linked = vol / "etc-x", vol / "x", vol / "outside" / "y"
        linked.parent.mkdir()
        for canary in (absolute, upward, linked):
            canary.write_text("keep")
        (dest / "sub").symlink_to(linked.parent)
        # A manifest naming files outside DEST (written by anything that could write DEST/.nodewarm).
        doc = json.loads((dest / ".nodewarm/manifest.json").read_text())
        template = doc["files"][0]
        doc["files"] += [{**template, "rel_path": rel, "key": "gone/" + rel.strip("/")}
                         for rel in (str(absolute), "../../x", "sub/y")]
        (dest / ".nodewarm/manifest.json").write_text(json.dumps(doc))
        try:
            warm(uri, dest)
        except NodewarmError as e:
            assert e.reason == "UnsafePath", e  # refusing the planted link is fine; following it is not
        assert absolute.read_text() == upward.read_text() == linked.read_text() == "keep"


def test_a_symlink_inside_dest_is_never_followed(s3, proxy, tmp_path):
    files = {**model_files(shards=1, mib_per_shard=1, seed=32), "sub/extra.json": b"{}"}
    uri = put_model(s3, files)
    with loop_volume(tmp_path, 64) as vol:
        outside, dest = vol / "outside", vol / "m"
        outside.mkdir()
        dest.mkdir()
        (dest / "sub").symlink_to(outside)
        with pytest.raises(NodewarmError) as e:
            warm(uri, dest)
        assert e.value.reason == "UnsafePath" and "sub" in str(e.value)
        assert list(outside.iterdir()) == []


def test_a_new_model_uri_removes_the_old_models_files(s3, proxy, tmp_path):
    old = model_files(shards=3, mib_per_shard=0.5, seed=33)
    new = {"config.json": b'{"new": true}', "model.safetensors": old["model-00001-of-00003.safetensors"]}
    uri_old, uri_new = put_model(s3, old), put_model(s3, new)
    with loop_volume(tmp_path, 64) as vol:
        dest = vol / "m"
        warm(uri_old, dest)
        summary = warm(uri_new, dest)
        assert visible_files(dest) == new  # vLLM must not see the old model's shards and tokenizer
        assert summary.removed == len(set(old) - set(new))


def test_partials_of_objects_deleted_from_s3_are_removed(s3, proxy, tmp_path):
    files = model_files(shards=2, mib_per_shard=2, seed=34)
    uri = put_model(s3, files)
    victim = "model-00001-of-00002.safetensors"
    proxy.rule = lambda r: Reply(403, "AccessDenied") if r.is_get and r.path.endswith(victim) and \
        r.headers["range"].startswith("bytes=1048576-") else None
    with loop_volume(tmp_path, 64) as vol:
        dest = vol / "m"
        with pytest.raises(NodewarmError):
            warm(uri, dest, concurrency=1)
        assert [p.name for p in (dest / PARTIAL_DIR).iterdir()] != []
        bucket, key = uri.removeprefix("s3://").split("/", 1)
        s3.client().delete_object(Bucket=bucket, Key=key + victim)
        time.sleep(1.2)  # rclone's directory cache
        proxy.rule = lambda r: None
        warm(uri, dest)
        assert [p for p in (dest / PARTIAL_DIR).rglob("*")] == []  # its preallocated partial is gone


# --- compile-cache restore, as the agent sets it up on the NVMe mount ---

PROBE = cachekey.RuntimeProbe(
    torch_version="2.13.0+cpu", torch_build="d34d1007" * 8, cuda="", triton="", triton_build="", vllm="0.32.0",
    vllm_path="/opt/venv/lib/python3.11/site-packages/vllm", python_prefix="/opt/venv",
)
ENV = {"VLLM_USE_AOT_COMPILE": "1"}
FAST = publish.PublishSettings(quiet_s=1.0, poll_s=0.2, timeout_s=30, settle_s=2.0)


def _publish(s3, tmp_path: Path, cfg: AgentConfig, payload: int) -> None:
    """Publish a bundle for ``cfg``'s key: a vLLM root and an Inductor root with ``payload`` random bytes."""
    src = {"vllm": tmp_path / "src/vllm/torch_compile_cache", "inductor": tmp_path / "src/inductor"}
    (src["vllm"] / "torch_aot_compile/ab12/rank_0_0").mkdir(parents=True)
    (src["vllm"] / "torch_aot_compile/ab12/rank_0_0/model").write_bytes(b"aot")
    (src["inductor"] / "fxgraph/cd").mkdir(parents=True)
    (src["inductor"] / "fxgraph/cd/entry").write_bytes(os.urandom(payload))
    store = CacheStore(parse_uri(cfg.compile_cache_uri))  # the AWS environment points at s3 (aws_env)
    priv = signing.load_private(tmp_path / "signing.pem")
    # Published from this same node: its hardware, as the restore below probes it.
    factors = cachekey.build_factors(PROBE, hardware.probe(Path("/"), {}, ENV), cfg.serving_spec(), ENV)
    assert publish.publish_once(store, src, factors, priv, {"node": "publisher"}, FAST).status == "published"


def _agent(s3, tmp_path: Path, mount: Path) -> AgentConfig:
    bucket = "cc-" + uuid.uuid4().hex[:12]
    s3.create_bucket(bucket)
    key = signing.generate(tmp_path / "signing.pem").public
    return AgentConfig(profile="m", model_uri="s3://unused/m/", dest=mount / "models/m", mount=mount, node_name="n",
                       compile_cache_uri=f"s3://{bucket}/cc", verify_key=key)


def _restore(cfg: AgentConfig) -> restore.RestoreResult:
    return restore.restore_for_node(cfg.compile_cache_uri, cfg.verify_key, cfg.serving_spec(), cfg.cache_dirs,
                                    (PROBE, ENV))


def test_restore_on_a_fresh_mount_installs_every_root(aws_env, tmp_path):
    with loop_volume(tmp_path, 128) as mount:
        cfg = _agent(aws_env, tmp_path, mount)
        _publish(aws_env, tmp_path, cfg, 4 * KiB)
        result = _restore(cfg)  # a fresh node: not even compile-cache/ exists yet
        assert (result.status, result.reason) == ("restored", "Restored"), result.message
        roots = cfg.cache_dirs.roots()
        assert (roots["vllm"] / "torch_aot_compile/ab12/rank_0_0/model").read_bytes() == b"aot"
        assert (roots["inductor"] / "fxgraph/cd/entry").stat().st_size == 4 * KiB
        assert not [p for p in mount.iterdir() if p.name.startswith(".nodewarm-restore-")]


def test_restore_never_follows_a_link_a_pod_planted_in_the_cache_hostpath(aws_env, tmp_path):
    with loop_volume(tmp_path, 128) as mount:
        cfg = _agent(aws_env, tmp_path, mount)
        _publish(aws_env, tmp_path, cfg, 4 * KiB)
        outside = mount / "etc"
        outside.mkdir()
        cache = mount / "compile-cache"
        cache.mkdir()
        (cache / "vllm").symlink_to(outside)  # the serving pod can write its hostPath: it swapped vllm/ for a link
        result = _restore(cfg)
        assert (result.status, result.reason) == ("cold", "UnsafePath"), result.message
        assert list(outside.iterdir()) == []
        assert not [p for p in mount.iterdir() if p.name.startswith(".nodewarm-restore-")]  # staging removed


def test_restore_checks_free_space_first(aws_env, tmp_path):
    with loop_volume(tmp_path, 128) as mount:
        cfg = _agent(aws_env, tmp_path, mount)
        _publish(aws_env, tmp_path, cfg, 48 * MiB)  # random: the archive is as large as what it unpacks to
        filler = mount / "filler"
        filler.write_bytes(b"\1" * (64 * MiB))
        result = _restore(cfg)
        assert (result.status, result.reason) == ("cold", "InsufficientNVMe"), result.message
        assert "free" in result.message


def test_a_full_disk_while_downloading_a_bundle_is_not_an_s3_error(aws_env, tmp_path):
    with loop_volume(tmp_path, 8) as vol:
        bucket = "cc-" + uuid.uuid4().hex[:12]
        aws_env.create_bucket(bucket)
        store = CacheStore(parse_uri(f"s3://{bucket}/cc"))
        store.put("cc/big", os.urandom(12 * MiB))
        with pytest.raises(NodewarmError) as e:
            store.download("cc/big", vol / "big", 16 * MiB)
        assert e.value.reason == "InsufficientNVMe", e.value
