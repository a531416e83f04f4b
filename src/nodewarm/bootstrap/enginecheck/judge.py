"""What an engine check found, from the engine's own evidence: its exit, its log, the cache dirs on disk. Pure.

* vLLM answered and, after a restore, wrote no compiled output and logged no compile -> passed (EngineServed);
  on a node with nothing restored the check's own compile is expected (``cold``) and passes too: the caches it
  leaves are what the serving pod then loads.
* after a restore vLLM compiled (hitcheck.judge: a new hash dir, new or rewritten artifacts, an AOT load failure)
  -> CompileCacheNotLoaded, as soon as the disk shows it (the runner's strict mode does not wait for the whole
  compile) or after the answer.
* vLLM exited or never answered with a log saying the weights or the KV cache for max-model-len do not fit
  -> ModelDoesNotFit; any other exit -> EngineBootFailed; the clock ran out -> EngineCheckTimedOut.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodewarm.api.enginecheck import Reason

from ..compilecache import hitcheck

# vLLM 0.32's words for "this does not fit here" (vllm/v1/core/kv_cache_utils.py _check_enough_kv_cache_memory,
# vllm/v1/worker/cpu_worker.py determine_available_memory, torch's CUDA allocator).
_DOES_NOT_FIT = re.compile(
    r"No available memory for the cache blocks"
    r"|is larger than the available KV cache memory"
    r"|on kv cache allocation is less than requested memory for kv"
    r"|CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError"
)


def failure_reason(log_text: str) -> Reason:
    """Why vLLM did not serve, by what it said before it exited."""
    return Reason.MODEL_DOES_NOT_FIT if _DOES_NOT_FIT.search(log_text) else Reason.ENGINE_BOOT_FAILED


def fit_line(log_text: str) -> str | None:
    """The log line that says what did not fit (for the condition's message), if any."""
    for line in reversed(log_text.splitlines()):
        if _DOES_NOT_FIT.search(line):
            return line.strip()
    return None


@dataclass(frozen=True)
class CacheVerdict:
    outcome: str                     # hit | miss | cold | unknown
    verdict: hitcheck.HitResult

    @property
    def not_loaded(self) -> bool:
        """A restored bundle that the engine did not load: the check fails and the bundle is stale."""
        return self.outcome == "miss"


def cache_verdict(baseline: hitcheck.Baseline, now: hitcheck.TreeSnapshot, log_text: str,
                  served: bool) -> CacheVerdict:
    """The restored bundle against what the engine did with it (the publisher's judge, on the check's boot)."""
    v = hitcheck.judge(baseline.snapshot, now, restored=baseline.restored, log=hitcheck.scan_log(log_text),
                       served=served)
    if not baseline.restored:
        return CacheVerdict("cold", v)
    return CacheVerdict({"hit": "hit", "miss": "miss"}.get(v.status, "unknown"), v)


def compiled_after_restore(baseline: hitcheck.Baseline, now: hitcheck.TreeSnapshot,
                           log_text: str) -> CacheVerdict | None:
    """While vLLM boots: the miss it has already shown after a restore (the strict mode's early stop), else None."""
    if not baseline.restored:
        return None
    v = cache_verdict(baseline, now, log_text, served=False)
    return v if v.not_loaded else None
