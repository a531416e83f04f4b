"""A model-like file set: real safetensors shards (header + F16 tensors) plus config/tokenizer JSON.

The bytes are random, but every shard is a valid safetensors file, so the bootstrap's load check (the
Run:ai streamer, vLLM's loader) parses it exactly as it would a real checkpoint.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

MIB = 2**20
_WRITE_CHUNK = 8 * MIB


def write_safetensors(path: Path, nbytes: int, tensors: int = 4) -> None:
    """One shard of about ``nbytes``: ``tensors`` F16 tensors of equal size, written to a temp name first."""
    per = (nbytes // tensors) // 2 * 2            # F16: whole 2-byte elements
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for i in range(tensors):
        header[f"layers.{i}.weight"] = {"dtype": "F16", "shape": [per // 2], "data_offsets": [offset, offset + per]}
        offset += per
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)                  # the format aligns the data section to 8 bytes
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        left = offset
        while left:
            n = min(left, _WRITE_CHUNK)
            f.write(os.urandom(n))
            left -= n
    tmp.rename(path)


def write_model(dest: Path, total_mb: int, shards: int = 4) -> list[Path]:
    """A checkpoint directory of ``shards`` safetensors files totalling ~``total_mb`` MiB, plus JSON files."""
    dest.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(shards):
        p = dest / f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(p, total_mb * MIB // shards)
        files.append(p)
    (dest / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 256,
                                                  "num_hidden_layers": 2, "torch_dtype": "float16"}))
    (dest / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}))
    (dest / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {f"layers.{j}.weight": files[0].name for j in range(4)}}))
    return files + [dest / "config.json", dest / "tokenizer.json", dest / "model.safetensors.index.json"]
