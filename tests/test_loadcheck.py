"""The load check reads the weights as the vLLM pod will, and a model it cannot load fails clearly.
Real runai-model-streamer (CPU), real local S3 server, a real loop-mounted ext4 volume."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bootstrap_fixtures import KiB, loop_volume, model_files, proxy, put_model, warm  # noqa: F401
from nodewarm.errors import NodewarmError

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
def test_each_file_is_load_checked_as_it_lands_while_the_rest_downloads(s3, proxy, tmp_path, monkeypatch):
    import threading

    from faultproxy import Hook
    from nodewarm.bootstrap.weights import pipeline

    files = model_files(shards=2, mib_per_shard=1, seed=42)
    uri = put_model(s3, files)
    first, second = sorted(n for n in files if n.endswith(".safetensors"))
    checked, first_checked = [], threading.Event()
    real = pipeline.check_loadable

    def recording(paths, tuning):
        out = real(paths, tuning)
        checked.extend(p.name for p in paths)
        if first in checked:
            first_checked.set()
        return out

    monkeypatch.setattr(pipeline, "check_loadable", recording)
    waited = []
    # The second shard's bytes are held back until the first shard has been load-checked: a check that
    # waited for the whole download would never come, and the hook would give up.
    proxy.rule = lambda r: Hook(lambda req: waited.append(first_checked.wait(60))) \
        if r.is_get and r.path.endswith(second) else None
    with loop_volume(tmp_path, 64) as vol:
        summary = warm(uri, vol / "m", load_check=True, concurrency=1)
    assert waited and all(waited)
    assert checked == [first, second]
    assert summary.load_check["files"] == 2 and summary.load_check["overlapped"]
    assert "load_check_tail" in summary.phases
