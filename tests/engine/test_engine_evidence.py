"""vLLM's AOT load failure is a miss, never a hit: for the engine tests' own reading of vLLM's log
(nodewarm_dev.testenv.enginenode.evidence) and for the publisher's judge (hitcheck), on the lines vLLM 0.32 prints.

On CPU vLLM 0.32 fails to load its restored AOT artifact, says so, and compiles the model again, mostly from
Inductor's restored entries: the log then shows Inductor cache *hits* beside the failure, which must not read
as a hit. Pure: no engine is booted (tests/engine/test_engine_compile_cache.py boots it).
"""

from __future__ import annotations

import pytest

from nodewarm.bootstrap.compilecache import hitcheck
from nodewarm_dev.testenv import enginenode

HASH = "ab" * 32
MODEL = f"/compile-cache/vllm/torch_compile_cache/torch_aot_compile/{HASH}/rank_0_0/model"
# vLLM 0.32's warning when its AOT artifact does not load (compilation/decorators.py), as measured on CPU.
FAILURE = (f"WARNING 12-01 21:20:00 [decorators.py:334] Compiling model again due to a load failure from {MODEL}, "
           "reason: 'function' object has no attribute 'finalize_loading'\n")
# What follows it: vLLM compiles again and Inductor finds the restored graphs (TORCH_LOGS lines).
FX_HITS = ("INFO torch._inductor.codecache: fx graph cache hit for key fabc123\n"
           "INFO torch._inductor.codecache: fx graph cache hit for key fdef456\n")


def test_the_engine_evidence_calls_an_aot_load_failure_a_compile_despite_inductor_hits():
    ev = enginenode.evidence(FAILURE + FX_HITS)
    assert ev.fx_hits and not ev.fx_misses and ev.aot_load_failures == 1
    assert not ev.loaded_without_compiling


def test_the_judge_calls_an_aot_load_failure_a_miss_beside_every_sign_of_a_hit():
    """Inductor hits in the counters, nothing new on disk, vLLM served: still a miss, because of the failure."""
    snap = hitcheck.TreeSnapshot(frozenset({f"torch_aot_compile/{HASH}"}), frozenset({"fabc123"}),
                                 frozenset({f"vllm/torch_aot_compile/{HASH}/rank_0_0/model"}))
    log = hitcheck.scan_log(FAILURE + FX_HITS)
    assert log.aot_failed == 1
    r = hitcheck.judge(snap, snap, restored=True, log=log, counters={"inductor.fxgraph_cache_hit": 2}, served=True)
    assert (r.status, r.reason) == ("miss", "AotLoadFailed"), r.message
