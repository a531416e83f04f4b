"""Prove the weights load with the loader vLLM will use, and leave them in the page cache.

Streams every *.safetensors from the NVMe copy through runai-model-streamer's local file engine on the
CPU (the same header parsing and chunked reads vLLM's `--load-format runai_streamer` does). Tensors are
consumed and dropped (owned=False: the streamer reuses its buffers), so memory stays bounded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from nodewarm.errors import NodewarmError


class LoadCheckFailed(NodewarmError):
    reason = "LoadCheckFailed"


class LoadCheckUnavailable(NodewarmError):
    reason = "LoadCheckUnavailable"


@dataclass(frozen=True)
class LoadCheck:
    files: int
    bytes: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


def check_loadable(paths: list[Path]) -> LoadCheck:
    """Stream each file's tensors; raises LoadCheckFailed naming the first file that does not parse."""
    try:
        from runai_model_streamer import SafetensorsStreamer
    except ImportError as e:
        raise LoadCheckUnavailable(
            f"runai-model-streamer (with torch) is not importable here ({e}); install nodewarm[streamer,torch] "
            "or pass --skip-load-check") from e
    total = 0
    start = time.monotonic()
    with SafetensorsStreamer() as streamer:
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
