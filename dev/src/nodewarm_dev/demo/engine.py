"""Real vLLM as a demo node's serving pod: the rendered vllm container (and its publisher sidecar) started from the
bound Pod object, with the node's root holding what its agent pulled and restored
(nodewarm_dev/testenv/podrun.py), measured from the start to the first completion answered.

Only the runtime is this machine's: the image is the serving environment (``.venv-serving``), the node a folder,
the GPU a CPU (``NODE_RUNTIME_ENV``, which the rendered Deployment must not carry), the Pod Identity credentials the
local S3 server's keys. The pods share this machine's network, so they run one at a time on the profile's port
(the demo gives the profile a free one).

A compile-cache hit is vLLM's and the publisher's word, never a guess from timings: ``evidence`` reads the
engine's own log (Inductor's cache hits and misses, an AOT artifact that failed to load) and the publisher
sidecar's verdict lands on the Node (``nodewarm.io/compile-cache``).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from nodewarm import logs
from nodewarm_dev.testenv import enginenode, podrun, vllmclient

log = logs.get("demo.engine")

VLLM_CONTAINER = "vllm"
PUBLISHER_CONTAINER = "nodewarm-publish"
# What this CPU "node"'s runtime adds to the rendered pod (never part of the profile): vLLM's CPU backend settings,
# and Inductor's cache log lines, vLLM's own evidence of what it loaded and what it compiled.
NODE_RUNTIME_ENV = {**enginenode.CPU_RUNTIME_ENV, **enginenode.EVIDENCE_ENV}
# A pod (vLLM's API server, engine core and worker, the publisher sidecar) peaked at 3.6 GB resident here; one is
# started only with this much memory available (never swap, never the OOM killer).
ENGINE_MEMORY_BYTES = 4 * 2**30
READY_TIMEOUT_S = 900
VERDICT_TIMEOUT_S = 180


@dataclass(frozen=True)
class Evidence:
    """What the vLLM container's log says: where the start script loaded the model from, whether the Run:ai
    streamer read it, and the engine's compile (enginenode.evidence: Inductor's cache lookups, AOT load failures)."""
    engine: enginenode.EngineEvidence
    streamed: bool              # "Loading safetensors using Runai Model Streamer"
    start_path: str | None      # the start script's decision: local | s3 | wait

    def verdict(self) -> str:
        """vLLM's own word on the compile: loaded (every graph from the cache) | recompiled (an AOT artifact failed
        to load: never a hit) | compiled | unknown (no lookup logged)."""
        e = self.engine
        if e.aot_load_failures:
            return "recompiled"
        if e.loaded_without_compiling:
            return "loaded"
        if e.fx_misses:
            return "compiled"
        return "unknown"

    def to_dict(self) -> dict:
        return {**self.engine.to_dict(), "startPath": self.start_path, "streamedWithRunai": self.streamed,
                "verdict": self.verdict()}


_START = re.compile(r'"event": "serve_start\.(local|s3|wait)"')


def evidence(text: str) -> Evidence:
    """Pure: the evidence in a vLLM container's log (the start script's JSON line, then vLLM's and torch's)."""
    start = _START.findall(text)
    return Evidence(enginenode.evidence(text), "Runai Model Streamer" in text, start[-1] if start else None)


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def group_rss(pgids: set[int]) -> int:
    """Resident bytes of every process in these process groups (a pod's containers and their children)."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            pgrp = int(stat.rsplit(")", 1)[1].split()[2])
            if pgrp in pgids:
                total += int((d / "statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


class RssPeak:
    """Samples a pod's resident memory twice a second until stopped (``peak``, bytes), and the machine's 1-minute
    load average (``load``, the mean): on a shared machine the second says how far the timings are its own."""

    def __init__(self, pgids: set[int]):
        self.pgids, self.peak, self._loads = pgids, 0, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-peak")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, group_rss(self.pgids))
            self._loads.append(os.getloadavg()[0])

    @property
    def load(self) -> float:
        return round(sum(self._loads) / len(self._loads), 2)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.peak


@dataclass(frozen=True)
class PodEnv:
    """Everything a demo pod needs from the demo beyond its spec."""
    node_root: Path
    work: Path
    configmaps: dict[str, dict]
    runtime_env: dict[str, str]            # credentials, the S3 endpoint, NODE_RUNTIME_ENV
    volumes: dict[str, Path] = field(default_factory=dict)     # the signing-key secret, the ServiceAccount token


@dataclass
class Served:
    """One pod's run: epoch seconds of start, ready (/health 200) and the first completion answered."""
    pod: str
    node: str
    started: float
    ready: float
    first_completion: float
    completion: str
    evidence: Evidence
    peak_rss_bytes: int
    log: Path
    load_avg: float                   # the machine's mean 1-minute load average while the pod ran (2 cores here)
    publisher: dict | None = None     # its verdict line ({"event": "compilecache.served", ...}) when it runs
    published: dict | None = None     # its publish line, when it published or found the key published

    @property
    def boot_s(self) -> float:
        return self.ready - self.started

    @property
    def first_completion_s(self) -> float:
        return self.first_completion - self.ready


def _json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def publisher_verdict(text: str) -> dict | None:
    """The publisher's outcome line (servedcheck: hit|miss|cold with its reason) in its log."""
    return next((d for d in _json_lines(text) if d.get("event") == "compilecache.served"), None)


def publisher_reported(text: str) -> dict | None:
    """Its write of that verdict on the Node (nodestatus.report_compile_cache), which comes after the verdict line:
    a sidecar stopped in between leaves the Node without the outcome."""
    return next((d for d in _json_lines(text) if d.get("event") == "compile_cache.reported"), None)


def publisher_published(text: str) -> dict | None:
    """Its publish result line, when it published (a cold node's first compile, or a miss's replacement)."""
    return next((d for d in _json_lines(text) if d.get("event") in ("compilecache.publish.done",
                                                                    "compilecache.publish.lost")), None)


def serve(pod: dict, env: PodEnv, port: int, model: str, *, with_publisher: bool,
          wait_for: str = "verdict") -> Served:
    """Run the pod's init containers, start its vllm container (and its publisher sidecar), wait for the first
    completion, then for the publisher (``wait_for``: ``verdict`` = its hit/miss/cold verdict written on the Node,
    ``published`` = a bundle published), stop both.

    ``pod``: the Pod object as the API server holds it (camelCase, as podrun reads it)."""
    if (avail := mem_available()) < ENGINE_MEMORY_BYTES:
        raise RuntimeError(f"only {avail / 2**30:.1f} GiB of memory available, a vLLM pod needs "
                           f"{ENGINE_MEMORY_BYTES / 2**30:.0f}: stop other work first (never swap)")
    spec, meta = pod["spec"], pod["metadata"]
    common = dict(node_root=env.node_root, work=env.work, configmaps=env.configmaps, volumes=env.volumes,
                  pod_name=meta["name"], namespace=meta["namespace"], node_name=spec["nodeName"])
    started = time.time()
    for c in spec.get("initContainers") or ():      # as the kubelet: each to completion, in order, first
        init = podrun.start(spec, c["name"], init=True, extra_env=env.runtime_env, **common)
        try:
            rc = init.proc.wait(READY_TIMEOUT_S)
        finally:
            init.stop()
        if rc:
            raise RuntimeError(f"init container {c['name']} on {spec['nodeName']} exited {rc}: {init.text()[-2000:]}")
    containers = [podrun.start(spec, VLLM_CONTAINER, extra_env=env.runtime_env, **common)]
    engine = containers[0]
    rss = RssPeak({engine.proc.pid})
    base = f"http://127.0.0.1:{port}"
    try:
        if with_publisher:
            containers.append(podrun.start(spec, PUBLISHER_CONTAINER, extra_env=env.runtime_env, **common))
            rss.pgids.add(containers[1].proc.pid)
        log.info("demo.engine.started", pod=meta["name"], node=spec["nodeName"], argv=engine.argv,
                 publisher=with_publisher)
        vllmclient.wait_ready(base, timeout=READY_TIMEOUT_S, alive=lambda: engine.proc.poll() is None,
                              log_tail=engine.text)
        ready = time.time()
        answer = vllmclient.complete(base, model)
        done = time.time()
        verdict = published = None
        if with_publisher:
            pub = containers[1]
            want = publisher_reported if wait_for == "verdict" else publisher_published
            end = time.time() + VERDICT_TIMEOUT_S
            while want(pub.text()) is None:
                if pub.proc.poll() is not None or time.time() > end:
                    raise RuntimeError(f"the publisher sidecar on {spec['nodeName']} gave no {wait_for} "
                                       f"(exit {pub.proc.poll()}); its log ends:\n{pub.text()[-3000:]}")
                time.sleep(0.5)
            verdict, published = publisher_verdict(pub.text()), publisher_published(pub.text())
    finally:
        for c in reversed(containers):
            c.stop()
        peak = rss.stop()
    ev = evidence(engine.text())
    served = Served(meta["name"], spec["nodeName"], started, ready, done, answer["choices"][0]["text"], ev, peak,
                    engine.log, rss.load, verdict, published)
    log.info("demo.engine.served", pod=meta["name"], node=spec["nodeName"], boot_s=round(served.boot_s, 3),
             first_completion_s=round(served.first_completion_s, 3), vllm_compile=ev.verdict(),
             evidence=ev.to_dict(), peak_rss_mb=round(peak / 1e6), load_avg=served.load_avg, publisher=verdict)
    return served


def make_model(dest: Path) -> None:
    """The tiny Llama of nodewarm_dev.testenv.tinymodel, made by the serving environment (it has transformers and
    torch)."""
    podrun.require_serving_venv()
    enginenode.make_model(dest)
