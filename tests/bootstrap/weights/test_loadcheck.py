"""The load check reads the weights as the vLLM pod will, and a model it cannot load fails clearly.
Real runai-model-streamer (CPU), real local S3 server, a real loop-mounted ext4 volume."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.bootstrap_fixtures import KiB, loop_volume, model_files, put_model, warm
from nodewarm.api.errors import NodewarmError

pytestmark = pytest.mark.s3


def test_a_model_without_safetensors_fails_clearly_before_any_download(s3, proxy, tmp_path):
    uri = put_model(s3, {"config.json": b"{}", "pytorch_model.bin": os.urandom(64 * KiB)})
    with loop_volume(tmp_path, 32) as vol:
        with pytest.raises(NodewarmError) as e:
            warm(uri, vol / "m", load_check=True)
        assert e.value.reason == "NoSafetensors"
        assert "pytorch_model.bin" in str(e.value) and "safetensors" in str(e.value)
        assert proxy.gets() == []  # nothing pulled for a model vLLM's loader could not read


@pytest.mark.torch
def test_the_load_check_runs_with_the_pods_streamer_settings(s3, proxy, tmp_path):
    files = model_files(shards=2, mib_per_shard=1, seed=41)
    uri = put_model(s3, files)
    with loop_volume(tmp_path, 64) as vol:
        # The CLI path the DaemonSet takes, with the values render puts in the vLLM pod (see test_render).
        p = subprocess.run([sys.executable, "-m", "nodewarm.cli", "bootstrap", "weights", "--uri", uri,
                            "--dest", str(vol / "m"), "--allow-non-nvme", "--json", "--headroom-gib", "0",
                            "--streamer-concurrency", "3", "--streamer-chunk-bytes", str(2 * 1024 * 1024)],
                           capture_output=True, text=True, timeout=300, env=os.environ)
        assert p.returncode == 0, p.stderr
        check = json.loads(p.stdout)["load_check"]
        assert check["files"] == 2 and check["streamer"] == {"concurrency": 3, "chunk_bytes": 2 * 1024 * 1024}


@pytest.mark.torch
def test_each_file_is_checked_as_it_lands_and_one_is_streamed_while_the_rest_downloads(s3, proxy, tmp_path,
                                                                                         monkeypatch):
    import threading

    from nodewarm_dev.testenv.faultproxy import Hook
    from nodewarm.bootstrap.weights import pipeline

    files = model_files(shards=2, mib_per_shard=1, seed=42)
    uri = put_model(s3, files)
    first, second = sorted(n for n in files if n.endswith(".safetensors"))
    streamed, headers, first_checked = [], [], threading.Event()
    real_stream, real_header = pipeline.check_loadable, pipeline.check_header

    def stream(paths, tuning):
        out = real_stream(paths, tuning)
        streamed.extend(p.name for p in paths)
        first_checked.set()
        return out

    def header(path):
        headers.append(path.name)
        return real_header(path)

    monkeypatch.setattr(pipeline, "check_loadable", stream)
    monkeypatch.setattr(pipeline, "check_header", header)
    waited = []
    # The second shard's bytes are held back until the first shard has been streamed: a check that
    # waited for the whole download would never come, and the hook would give up.
    proxy.rule = lambda r: Hook(lambda req: waited.append(first_checked.wait(60))) \
        if r.is_get and r.path.endswith(second) else None
    with loop_volume(tmp_path, 64) as vol:
        # The held GET waits as long as the hook may hold it: the streamer's torch import can take seconds on a
        # loaded machine, and the tests' 1 s stall timeout would turn that wait into retries that give up.
        summary = warm(uri, vol / "m", load_check=True, stream_check=True, concurrency=1, stall_timeout_s=60.0,
                       request_timeout_s=90.0)
    assert waited and all(waited)
    assert streamed == [first], "the streamer reads one file, the first to land"
    assert headers == [first, second], "every safetensors file gets the header check"
    c = summary.load_check
    assert c["files"] == 2 and c["streamed_file"] == first and c["overlapped"]
    assert c["streamed_bytes"] == c["bytes"] // 2  # the two shards are the same size
    assert "load_check_tail" in summary.phases


def _tensor_file(tmp_path, header: dict, data_len: int, name: str = "m.safetensors"):
    raw = json.dumps(header).encode()
    path = tmp_path / name
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * data_len)
    return path


def test_the_header_check_accepts_what_the_format_allows(tmp_path):
    from support.bootstrap_fixtures import safetensors_bytes
    from nodewarm.bootstrap.weights.loadcheck import check_header

    p = tmp_path / "ok.safetensors"
    p.write_bytes(safetensors_bytes({"a": ("F32", [3, 4]), "b": ("BF16", [5]), "c": ("U8", [0])}))
    assert check_header(p) == 3 * 4 * 4 + 5 * 2
    # A dtype this check does not know (a newer format) is held to bounds and tiling only.
    newer = _tensor_file(tmp_path, {"__metadata__": {"format": "pt"}, "w": {"dtype": "F4_E2M1", "shape": [64],
                                                                             "data_offsets": [0, 32]}}, 32)
    assert check_header(newer) == 32


@pytest.mark.parametrize("header,data_len,why", [
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 12, "cover 16 bytes of a 12-byte"),
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 20, "cover 16 bytes of a 20-byte"),
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, 12, "needs 16 bytes"),
    ({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
      "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]}}, 12, "starts at 8, expected 4"),
    ({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
      "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, 6, "starts at 2, expected 4"),
    ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, 4, "malformed entry"),
    ({"w": {"dtype": "F32", "shape": [1]}}, 4, "malformed entry"),
])
def test_the_header_check_names_the_file_and_what_is_wrong(tmp_path, header, data_len, why):
    from nodewarm.bootstrap.weights.loadcheck import LoadCheckFailed, check_header

    with pytest.raises(LoadCheckFailed) as e:
        check_header(_tensor_file(tmp_path, header, data_len, "model-7.safetensors"))
    assert str(e.value).startswith("model-7.safetensors is not a loadable safetensors file") and why in str(e.value)


def test_the_header_check_refuses_a_truncated_or_non_json_header(tmp_path):
    from nodewarm.bootstrap.weights.loadcheck import LoadCheckFailed, check_header

    short = tmp_path / "a.safetensors"
    short.write_bytes(b"\x01\x02")
    huge = tmp_path / "b.safetensors"
    huge.write_bytes((10**6).to_bytes(8, "little") + b"{}")
    junk = tmp_path / "c.safetensors"
    junk.write_bytes((9).to_bytes(8, "little") + b"{not json")
    for path, why in ((short, "shorter than the 8-byte"), (huge, "does not fit the file"), (junk, "not JSON")):
        with pytest.raises(LoadCheckFailed) as e:
            check_header(path)
        assert why in str(e.value) and path.name in str(e.value)


def test_by_default_every_file_is_header_checked_and_nothing_is_streamed(s3, proxy, tmp_path, monkeypatch):
    from nodewarm.bootstrap.weights import pipeline

    def never(paths, tuning):
        raise AssertionError("the streamer (and torch) is opt-in: --stream-check")

    monkeypatch.setattr(pipeline, "check_loadable", never)
    files = model_files(shards=3, mib_per_shard=0.5, seed=43)
    with loop_volume(tmp_path, 32) as vol:
        summary = warm(put_model(s3, files), vol / "m", load_check=True)
    c = summary.load_check
    assert (c["files"], c["header_checked"], c["streamed_file"], c["streamer"]) == (3, 3, None, None)
