"""`nodewarm engine-check`: boot vLLM as the serving pod would, ask it one completion, stop it, say what happened.

Runs as the check pod's one container (nodewarm/nodeclasses/enginecheck.py renders it; the controller creates it on
the node that asked). The engine command is the vLLM container's, as rendered: the start script, which finds the
node's verified copy and execs vLLM's server with the rendered argv; the pod's env is the vLLM container's plus
vLLM's own strict AOT mode (nodewarm.api.enginecheck.STRICT_ENV).

The strict mode for the compile cache: after a restore, the first compiled output vLLM writes (or logs) is a load
failure, and the check stops vLLM then, instead of waiting out a compile the serving pod would have paid after the
node was counted ready; the bundle's generation is marked stale (with the pod's identity, the publisher's, which may
write stale markers) so the next publisher replaces it. A cold node (nothing restored) compiles here, and its
caches are then what the serving pod loads.

The result is one JSON object (nodewarm.api.enginecheck.Result) written where ``--result`` says: the container's
termination message, which the node agent reads from the pod's status. vLLM's output goes on to this container's
log as it comes (``kubectl logs``); its last lines travel in the result.

Observe mode (``--observe``, ``spec.serving.snapshot``): vLLM is not this process's child but the pod's serving
container, verbatim, so that the agent can checkpoint it once it answered. The runner waits for its /health on the
pod's loopback, asks the same completion and judges the compile cache the same way (from the disk alone: vLLM's log
is that container's), and never stops it. A failure's message names the container whose log says why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from nodewarm import logs
from nodewarm.api.enginecheck import (LOG_TAIL_LINES, MESSAGE_LIMIT, NAMESPACE_ENV, STRICT_ENV, Reason, Result,
                                      RunnerArgs)
from nodewarm.api.snapshot import CONTAINER as SERVING_CONTAINER

from ..compilecache import hitcheck
from ..compilecache.bundle import CacheDirs
from . import judge

log = logs.get("bootstrap.enginecheck")

POLL_S = 1.0
# How often the cache dirs are scanned for compiled output while vLLM boots after a restore (a scan of a
# bundle's few thousand files takes milliseconds).
SCAN_S = 2.0
STOP_GRACE_S = 30.0
LOG_KEEP_BYTES = 8 << 20           # the log kept for the judge: vLLM's compile lines come early in a boot
PROMPT = "nodewarm engine check:"


class EngineLog:
    """vLLM's output, passed on to this container's stdout line by line, and kept for the judge."""

    def __init__(self, stream, out=sys.stdout):
        self._lines: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self._text: list[str] = []
        self._size = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream, out), name="engine-log", daemon=True)
        self._thread.start()

    def _read(self, stream, out) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            try:
                out.write(line)
                out.flush()
            except (OSError, ValueError):
                pass
            with self._lock:
                self._lines.append(line.rstrip("\n"))
                if self._size < LOG_KEEP_BYTES:
                    self._text.append(line)
                    self._size += len(line)

    def text(self) -> str:
        with self._lock:
            return "".join(self._text)

    def tail(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._lines)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


@dataclass
class Engine:
    proc: subprocess.Popen
    log: EngineLog
    started_at: float

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        """SIGTERM to vLLM's process group (its API server, engine core and workers), then SIGKILL: whatever it
        held (GPU memory, the port) is free when this returns."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self.log.join(5)
        return self.proc.returncode


def start_engine(argv: tuple[str, ...], env: dict[str, str]) -> Engine:
    started = time.time()
    proc = subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    return Engine(proc, EngineLog(proc.stdout), started)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def complete_once(port: int, model: str, timeout: float) -> str:
    """One greedy completion of one token; its text. Raises on an error answer."""
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=max(1.0, timeout)) as r:
        doc = json.loads(r.read())
    return doc["choices"][0]["text"]


def _roots(a: RunnerArgs) -> dict[str, Path]:
    """The cache roots as the agent's baseline and the publisher name and scope them (vLLM's is its
    torch_compile_cache, not the rest of $VLLM_CACHE_ROOT such as modelinfos/, which every boot writes)."""
    return CacheDirs(vllm_root=Path(a.vllm_cache_root), inductor=Path(a.inductor_dir), triton=Path(a.triton_dir),
                     pch=Path(a.pch_dir)).roots()


def _start_path(record: str | None) -> str | None:
    if not record:
        return None
    try:
        return json.loads(Path(record).read_text()).get("path")
    except (OSError, ValueError, AttributeError):
        return None


def check(a: RunnerArgs, env: dict[str, str] | None = None, clock=time.monotonic) -> Result:
    """Boot (or, observing, wait for), answer, stop (unless observing), judge. Never raises for what the engine
    does: every end is a Result."""
    deadline = clock() + a.timeout_s
    try:
        baseline = hitcheck.load_baseline(Path(a.baseline))
    except (OSError, ValueError, KeyError) as e:
        return Result(False, Reason.ENGINE_CHECK_NOT_RUN, f"no baseline from the node agent at {a.baseline} "
                      f"({type(e).__name__}: {e}): the check runs only after the agent's restore")
    if a.observe:
        return observe(a, baseline, deadline, {**os.environ, **(env or {})}, clock)
    engine = start_engine(a.engine, {**os.environ, **(env or {}), **STRICT_ENV})
    log.info("enginecheck.started", pid=engine.proc.pid, restored=baseline.restored, timeout_s=a.timeout_s)
    try:
        served = _serve_once(a, baseline, deadline, clock, engine.alive, engine.log.text,
                             f"vLLM did not answer /health within {a.timeout_s} s")
    finally:
        code = engine.stop()
    text = engine.log.text()
    reason = judge.failure_reason(text)
    said = judge.fit_line(text) if reason == Reason.MODEL_DOES_NOT_FIT else None
    exited = (reason, f"vLLM exited with code {code} before it served"
              + (f": {said}" if said else ": see its last log lines"))
    return _judged(a, baseline, served, text, exited,
                   Result(False, "", "", started_at=engine.started_at, ready_at=served.ready_at,
                          first_token_at=served.first_at, log_tail=engine.log.tail()))


def observe(a: RunnerArgs, baseline: hitcheck.Baseline, deadline: float, env: dict[str, str],
            clock=time.monotonic) -> Result:
    """Snapshot mode: vLLM is the pod's serving container, started by the kubelet beside this one; wait for it on the
    pod's loopback, ask it, judge, and leave it running for the agent's checkpoint. Its log is that container's, out
    of reach here: the disk alone shows a compile, and a failure's message says where the log is."""
    # Containers start in the pod's order, the vLLM container first: its boot is timed from this one's start.
    started = time.time()
    log.info("enginecheck.observing", container=SERVING_CONTAINER, port=a.port, restored=baseline.restored,
             timeout_s=a.timeout_s)
    served = _serve_once(a, baseline, deadline, clock, lambda: True, lambda: "",
                         f"vLLM (container {SERVING_CONTAINER}) did not answer /health on 127.0.0.1:{a.port} "
                         f"within {a.timeout_s} s")
    # Unreachable by _serve_once (a watched engine never "exits" here), kept so every end has words.
    never = (Reason.ENGINE_BOOT_FAILED, f"vLLM (container {SERVING_CONTAINER}) never served")
    r = _judged(a, baseline, served, "", never,
                Result(False, "", "", started_at=started, ready_at=served.ready_at, first_token_at=served.first_at))
    return r if r.passed else replace(r, message=with_log_hint(r.message, logs_command(env)))


def logs_command(env: dict[str, str]) -> str:
    """Where the observed vLLM's log is: its container in this pod (HOSTNAME is the pod's name)."""
    ns = env.get(NAMESPACE_ENV)
    return (f"kubectl logs {f'-n {ns} ' if ns else ''}{env.get('HOSTNAME') or 'POD'} "
            f"-c {SERVING_CONTAINER}")


def with_log_hint(message: str, command: str) -> str:
    """The message with where the log is at its end, which Result.to_json's cut to MESSAGE_LIMIT must not lose."""
    hint = f"; vLLM's log: {command}"
    room = MESSAGE_LIMIT - len(hint)
    return (message if len(message) <= room else message[: room - 3] + "...") + hint


@dataclass
class Served:
    """How far the engine got: ready and answered, or why not (a failure, or the compile the disk showed)."""
    ready_at: float | None = None
    first_at: float | None = None
    failure: tuple[str, str] | None = None
    early: judge.CacheVerdict | None = None


def _serve_once(a: RunnerArgs, baseline: hitcheck.Baseline, deadline: float, clock: Callable[[], float],
                alive: Callable[[], bool], log_text: Callable[[], str], timed_out: str) -> Served:
    """Wait for /health while ``alive()`` (stopping early when a restored bundle is being compiled again), then ask
    the one completion."""
    s = Served()
    next_scan = clock()
    while s.ready_at is None:
        if not alive():
            break
        if healthy(a.port):
            s.ready_at = time.time()
            break
        if clock() >= deadline:
            s.failure = (Reason.ENGINE_CHECK_TIMED_OUT, timed_out)
            break
        if baseline.restored and clock() >= next_scan:
            next_scan = clock() + SCAN_S
            s.early = judge.compiled_after_restore(baseline, hitcheck.snapshot(_roots(a)), log_text())
            if s.early is not None:
                log.warning("enginecheck.compiling_after_restore", reason=s.early.verdict.reason,
                            stopping=not a.observe)
                break
        time.sleep(POLL_S)
    if s.ready_at is not None:
        try:
            complete_once(a.port, a.served_model_name, deadline - clock())
            s.first_at = time.time()
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as e:
            s.failure = (Reason.ENGINE_BOOT_FAILED, f"vLLM answered /health but not a completion: "
                         f"{type(e).__name__}: {e}")
    return s


def _judged(a: RunnerArgs, baseline: hitcheck.Baseline, s: Served, text: str, exited: tuple[str, str],
            result: Result) -> Result:
    """The Result once the engine is done with: the compile cache first (a bundle that did not load is stale
    whatever else happened), then the failure, an exit before serving (``exited``), where the weights came from."""
    cache = judge.cache_verdict(baseline, hitcheck.snapshot(_roots(a)), text, served=s.first_at is not None)
    if s.early is not None and not cache.not_loaded:
        cache = s.early        # what stopped the boot stands, whatever the last scan of a stopped engine shows
    result = replace(result, compile_cache=cache.outcome)
    if cache.not_loaded:
        return _not_loaded(a, baseline, cache, result)
    if s.failure is not None:
        return replace(result, reason=s.failure[0], message=s.failure[1])
    if s.ready_at is None:
        return replace(result, reason=exited[0], message=exited[1])
    where = _start_path(a.start_record)
    if where not in (None, "local"):
        return replace(result, reason=Reason.ENGINE_BOOT_FAILED,
                       message=f"vLLM loaded the model from {where}, not from this node's copy")
    return replace(result, passed=True, reason=Reason.ENGINE_SERVED,
                   message=f"vLLM booted in {result.boot_s:.1f} s on this node's copy and answered in "
                           f"{result.first_token_s:.2f} s; compile cache: {cache.outcome} ({cache.verdict.reason})")


def _not_loaded(a: RunnerArgs, baseline: hitcheck.Baseline, cache: judge.CacheVerdict, result: Result) -> Result:
    """The restored bundle did not load: fail, and mark its generation stale where this pod's identity may."""
    marked = False
    note = "not marked stale: this pod has no compile-cache writer identity (no compileCache.publisher)"
    if a.cache_uri and baseline.envelope_key:
        from ..compilecache import publish
        from ..compilecache.cachestore import CacheStore, parse_uri

        try:
            publish.mark_stale(CacheStore(parse_uri(a.cache_uri)), baseline.envelope_key, baseline.generation,
                               cache.verdict.reason)
            marked, note = True, f"generation {baseline.generation} marked stale for the next publisher"
        except Exception as e:  # noqa: BLE001 - the verdict stands whether or not the marker could be written
            note = f"could not mark it stale: {type(e).__name__}: {e}"
            log.warning("enginecheck.stale_not_marked", error=note)
    return replace(result, reason=Reason.COMPILE_CACHE_NOT_LOADED, marked_stale=marked,
                   message=f"the restored compile cache did not load ({cache.verdict.reason}: "
                           f"{cache.verdict.message}); {note}")


def write_result(path: str, result: Result) -> None:
    """The termination message: written whole (the kubelet reads the file once the container exits)."""
    Path(path).write_text(result.to_json())
