#!/usr/bin/env python
"""Compile a small transformer with torch.compile (Inductor, CPU) in a fresh process and report.

Used by tests/bootstrap/compilecache/test_compile_hit.py, bench/compile_cache.py and `nodewarm demo` as "a node
serving a model": each run is its own process so nothing in memory can fake a cache hit. Prints one line,
``RESULT:{json}``, with the first-call wall and CPU time, Inductor/AOTAutograd cache counters and the max
difference from eager mode (a wrong-ISA cache hit shows up there as NaN).

The cache dir must be known before ``import torch``, so it comes in as an argument and is exported
first.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import time


def cpu_seconds() -> float:
    """User+system CPU of this process and its reaped children: steadier than wall time on shared cores."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir", required=True, help="TORCHINDUCTOR_CACHE_DIR for this run")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.abspath(args.cache_dir)

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, d: int, heads: int):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                       for z in self.qkv(self.ln1(x)).split(d, dim=-1))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(a)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Model(nn.Module):
        def __init__(self, d: int, layers: int, vocab: int = 512):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block(d, 4) for _ in range(layers))
            self.lnf, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

        def forward(self, ids):
            x = self.emb(ids)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.lnf(x))

    torch.manual_seed(0)
    model = Model(args.d, args.layers).eval()
    ids = torch.randint(0, 512, (args.batch, args.seq))
    compiled = torch.compile(model)
    with torch.no_grad():
        ref = model(ids)
        cpu0, start = cpu_seconds(), time.perf_counter()
        out = compiled(ids)
        first_call_s = time.perf_counter() - start
        first_call_cpu_s = cpu_seconds() - cpu0

    from torch._dynamo.utils import counters

    cache_counters = {f"{group}.{name}": n for group in ("inductor", "aot_autograd")
                      for name, n in counters[group].items() if "cache" in name}
    maxdiff = (out - ref).abs().max().item()
    print("RESULT:" + json.dumps({
        "first_call_s": round(first_call_s, 3),
        "first_call_cpu_s": round(first_call_cpu_s, 3),
        "counters": cache_counters,
        "maxdiff": None if math.isnan(maxdiff) else maxdiff,
        "nan": math.isnan(maxdiff),
    }), flush=True)


if __name__ == "__main__":
    main()
