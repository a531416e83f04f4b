"""Prove the weights load with the loader vLLM will use, and leave them in the page cache.

Streams every *.safetensors from the NVMe copy through runai-model-streamer's local file engine on the
CPU (the same header parsing and chunked reads vLLM's `--load-format runai_streamer` does). Tensors are
consumed and dropped (owned=False: the streamer reuses its buffers), so memory stays bounded. The
streamer is tuned as the vLLM pod's is (concurrency from --model-loader-extra-config, chunk size from
RUNAI_STREAMER_CHUNK_BYTESIZE, both rendered from the profile), so the check reads the files the way
serving will, and a setting the streamer rejects fails here, on the node, before the pod lands.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator
from pathlib import Path

from nodewarm.errors import NodewarmError


class LoadCheckFailed(NodewarmError):
    reason = "LoadCheckFailed"


class LoadCheckUnavailable(NodewarmError):
    reason = "LoadCheckUnavailable"


@dataclass(frozen=True)
class StreamerTuning:
    """The vLLM pod's streamer settings (nodeclasses.vllm renders both); None: the streamer's default."""

    concurrency: int | None = None
    chunk_bytes: int | None = None

    def env(self) -> dict[str, str]:
        out = {}
        if self.concurrency is not None:
            out["RUNAI_STREAMER_CONCURRENCY"] = str(self.concurrency)
        if self.chunk_bytes is not None:
            out["RUNAI_STREAMER_CHUNK_BYTESIZE"] = str(self.chunk_bytes)
        return out


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    # The streamer's native library reads its settings from the environment, as vLLM sets them.
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass(frozen=True)
class LoadCheck:
    files: int
    bytes: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


def check_loadable(paths: list[Path], tuning: StreamerTuning = StreamerTuning()) -> LoadCheck:
    """Stream each file's tensors; raises LoadCheckFailed naming the first file that does not parse."""
    if not paths:
        raise LoadCheckFailed("no *.safetensors file to load: vLLM's runai_streamer loader reads only safetensors",
                              reason="NoSafetensors")
    try:
        from runai_model_streamer import SafetensorsStreamer
    except ImportError as e:
        raise LoadCheckUnavailable(
            f"runai-model-streamer (with torch) is not importable here ({e}); install nodewarm[streamer,torch] "
            "or pass --skip-load-check") from e
    total = 0
    start = time.monotonic()
    with _environment(tuning.env()), SafetensorsStreamer() as streamer:
        for path in paths:
            # One file per request, so a failure names its file.
            try:
                streamer.stream_file(str(path), device="cpu", owned=False)
                for _name, tensor in streamer.get_tensors():
                    total += tensor.numel() * tensor.element_size()
            except Exception as e:  # noqa: BLE001 - whatever the streamer raises, the file is not loadable
                raise LoadCheckFailed(f"{path.name} does not load with runai-model-streamer: "
                                      f"{type(e).__name__}: {e}") from e
    return LoadCheck(len(paths), total, time.monotonic() - start)
