"""Prove the weights load with the loader vLLM will use.

Two checks, split by what each can still prove once the download has verified every byte against S3:

* ``check_header`` (every *.safetensors, as it lands): the file is well-formed safetensors. The header
  parses, every tensor's dtype and shape match its byte span, and the spans tile the data section exactly
  (no hole, no overlap, nothing past the end), as the format demands. Microseconds, no read of the data.
* ``check_loadable`` (opt-in, ``--stream-check``; one file per run, the first to land): streams it through
  runai-model-streamer's local file engine on the CPU (the same header parsing and chunked reads vLLM's
  `--load-format runai_streamer` does), tuned as the vLLM pod's is (concurrency from
  --model-loader-extra-config, chunk size from RUNAI_STREAMER_CHUNK_BYTESIZE), so the streamer and those
  settings are proven on this node before the pod lands. Tensors are consumed and dropped (owned=False), so
  memory stays bounded. It needs torch.

Why no file is streamed by default: the checksum already proved the bytes are S3's, the header check that
each file parses, and the download left every page in the page cache (pwrite goes through it); re-reading
proves nothing more, costs a memory pass on the critical path and a torch import in the agent (docs/agent.md,
"Load check, as each file lands").
"""

from __future__ import annotations

import json
import os
import struct
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator
from pathlib import Path

from nodewarm.api.errors import NodewarmError


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


# Bytes per element of the safetensors dtypes; a dtype not listed (a newer format) is checked for bounds
# and tiling only, so the check never refuses what a newer loader reads.
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U16": 2, "I16": 2,
             "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's own limit


def check_header(path: Path) -> int:
    """Parse ``path``'s safetensors header and check it against the file's size; returns the tensor bytes.

    Raises LoadCheckFailed naming the file and what is wrong."""
    def bad(why: str) -> LoadCheckFailed:
        return LoadCheckFailed(f"{path.name} is not a loadable safetensors file: {why}")

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise bad(f"{size} bytes, shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > min(_MAX_HEADER, size - 8):
                raise bad(f"header length {n} does not fit the file ({size} bytes)")
            raw = f.read(n)
    except OSError as e:
        raise LoadCheckFailed(f"{path.name} cannot be read: {e}") from e
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(f"header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    data_len, spans = size - 8 - n, []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = t["dtype"], t["shape"], t["data_offsets"]
            elements = 1
            for d in shape:
                if not isinstance(d, int) or d < 0:
                    raise ValueError(f"shape {shape}")
                elements *= d
            if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
                raise ValueError(f"data_offsets {[begin, end]}")
        except (KeyError, TypeError, ValueError) as e:
            raise bad(f"tensor {name!r}: malformed entry ({e})") from None
        if dtype in _ITEMSIZE and elements * _ITEMSIZE[dtype] != end - begin:
            raise bad(f"tensor {name!r}: {dtype} {shape} needs {elements * _ITEMSIZE[dtype]} bytes, "
                      f"data_offsets span {end - begin}")
        spans.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise bad(f"tensor {name!r} starts at {begin}, expected {at} (a hole or an overlap in the data)")
        at = end
    if at != data_len:
        raise bad(f"tensors cover {at} bytes of a {data_len}-byte data section (truncated or padded file)")
    return at
