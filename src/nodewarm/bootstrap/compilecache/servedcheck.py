"""After vLLM is ready: prove the compile-cache hit, report it on the Node, and republish what serving needed.

Runs in the publisher sidecar (``nodewarm publish --ready-url ... --baseline ...``), which sees the same cache
dirs as vLLM. The node agent saved a baseline right after its restore (hitcheck.Baseline); once vLLM answers
its health check and the cache dirs have been quiet for ``quiet_s``, the trees are judged against it:

* restored and nothing compiled      -> ``hit``
* restored and serving compiled      -> ``miss``: the bundle's generation is marked stale, then this node's
  caches (restored + what serving added) replace it (publish.publish_once, a conditional replace)
* nothing restored                   -> ``cold``: this node's compile is published if the key has no good bundle
* vLLM started cold (its start script streamed the model from S3: nodewarm/nodeclasses/servestart.py) -> ``cold``,
  ``ColdStart``: it compiled under another model string into a private dir, so the node's cache dirs say
  nothing about a hit; nothing is marked stale and nothing is published

The outcome lands on the Node as ``nodewarm.io/compile-cache`` (hit|miss|cold) through ``report``; the
controller counts it in ``nodewarm_compile_cache_total{result}``.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from watchdog.observers import Observer

from nodewarm import logs

from . import cachekey, hitcheck, publish
from .cachestore import CacheStore, envelope_key

log = logs.get("bootstrap.compilecache")

Outcome = Literal["hit", "miss", "cold"]


@dataclass(frozen=True)
class ServedResult:
    outcome: Outcome | None         # None: vLLM never became ready within the timeout
    reason: str
    message: str
    verdict: hitcheck.HitResult | None = None
    published: publish.PublishResult | None = None


def outcome_of(baseline: hitcheck.Baseline, verdict: hitcheck.HitResult) -> tuple[Outcome, str]:
    """Pure: the Node's label value and reason. Never ``hit`` without a restore, never ``restored``."""
    if not baseline.restored:
        return "cold", baseline.reason or "NothingRestored"
    if verdict.status == "hit":
        return "hit", verdict.reason
    return "miss", verdict.reason


def http_ready(url: str) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:
                return 200 <= resp.status < 300
        except (urllib.error.URLError, OSError):
            return False
    return ready


def wait_served(roots: Mapping[str, Path], ready: Callable[[], bool], settings: publish.PublishSettings,
                clock: Callable[[], float] = time.monotonic) -> bool:
    """Block until ``ready()`` and then no file activity in the roots for ``quiet_s``; False on timeout."""
    detector = publish.QuietDetector(settings.quiet_s)
    observer = Observer()
    for path in roots.values():
        Path(path).mkdir(parents=True, exist_ok=True)
        observer.schedule(publish._Touch(detector, clock), str(path), recursive=True)
    observer.start()
    deadline = None if settings.timeout_s is None else clock() + settings.timeout_s
    try:
        while not ready():
            if deadline is not None and clock() >= deadline:
                return False
            time.sleep(settings.poll_s)
        detector.touch(clock())     # what serving still flushes after ready gets quiet_s to land
        while not detector.due(clock()):
            time.sleep(settings.poll_s)
        return True
    finally:
        observer.stop()
        observer.join()


def prove_and_publish(store: CacheStore, roots: Mapping[str, Path], factors: cachekey.Factors,
                      key: Ed25519PrivateKey, producer: Mapping[str, str], baseline: hitcheck.Baseline,
                      ready: Callable[[], bool], settings: publish.PublishSettings = publish.PublishSettings(),
                      report: Callable[[Outcome, str, str], None] | None = None,
                      runtime: cachekey.RuntimeProbe | None = None,
                      started_from: Callable[[], str | None] = lambda: None) -> ServedResult:
    """``started_from()``: where vLLM loaded the model from (the start script's record: local | s3), read once
    vLLM is ready, when the script has long written it."""
    if not wait_served(roots, ready, settings):
        return ServedResult(None, "NotReady", f"vLLM was not ready within {settings.timeout_s} s")
    if started_from() == "s3":
        message = ("vLLM started cold (the model streamed from S3, this node's copy was incomplete): it compiled "
                   "under another model string, in a private cache dir, so nothing is proven or published")
        log.info("compilecache.served", outcome="cold", reason="ColdStart")
        if report is not None:
            report("cold", "ColdStart", message)
        return ServedResult("cold", "ColdStart", message)
    verdict = hitcheck.judge(baseline.snapshot, hitcheck.snapshot(roots), restored=baseline.restored, served=True)
    outcome, reason = outcome_of(baseline, verdict)
    mine = envelope_key(cachekey.prefix(factors, store.root), cachekey.key_id(factors))
    if baseline.restored and baseline.envelope_key != mine:
        # The agent and this publisher keyed differently: the serving spec or runtime they see differs.
        log.warning("compilecache.served.key_disagrees", agent=baseline.envelope_key, publisher=mine)
    if outcome == "miss" and baseline.envelope_key:
        publish.mark_stale(store, baseline.envelope_key, baseline.generation, verdict.reason)
    message = verdict.message if baseline.restored else f"nothing was restored ({reason}); serving compiled"
    log.info("compilecache.served", outcome=outcome, reason=reason, evidence=list(verdict.evidence))
    if report is not None:
        report(outcome, reason, message)
    published = None
    if outcome != "hit":
        published = publish.publish_once(store, roots, factors, key, producer, settings, runtime=runtime)
    return ServedResult(outcome, reason, message, verdict, published)
