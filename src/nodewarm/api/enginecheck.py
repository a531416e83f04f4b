"""The engine check (``spec.readiness.engineCheck``): the names and wire formats its four parts share.

A node is Warm only when vLLM itself booted on it against the node's copy of the weights and its restored
compile caches, answered one completion and exited. The parts, and what passes between them:

1. The node agent (nodewarm/bootstrap/enginecheck/request.py), once weights, caches, image and GPUs are in place,
   asks for the check on its own Node: ``REQUEST_ANNOTATION`` = ``Request`` (state ``requested`` and a fresh id). The
   agent cannot create the pod itself: on AL2023 it acts as the node, and NodeRestriction lets a node create
   only mirror pods.
2. The controller (nodewarm/controller/enginecheck/) creates the check pod from the profile's rendered PodTemplate
   (``template_name``, nodewarm/nodeclasses/enginecheck.py), bound to that node, named ``pod_name(profile, node,
   id)`` and labelled ``labels(profile)``; it deletes the pod once the node reports the outcome (or asks again).
3. The runner in the pod (`nodewarm engine-check`, nodewarm/bootstrap/enginecheck/runner.py; its flags are
   ``RunnerArgs``) boots vLLM with the rendered start script, argv and env, answers one completion, stops vLLM,
   judges the compile cache against the agent's baseline and writes a ``Result`` as the container's termination
   message (``TERMINATION_LOG``), exit code 0 when it passed. With ``spec.serving.snapshot`` the pod runs the
   serving container itself beside the runner, which only observes it (``RunnerArgs.observe``): it waits for its
   /health, asks the same completion and judges the same way, but never starts or stops vLLM, which the agent then
   checkpoints (nodewarm.api.snapshot).
4. The agent reads that message from the pod's status (a node may read the pods bound to it), reports Warm=True or
   Warm=False with ``Result.reason`` and records the outcome in ``REQUEST_ANNOTATION`` (state ``passed`` or
   ``failed``, with the times and the engine's last log lines), which the controller turns into an Event.

Standard library only, like the rest of nodewarm.api. The wire values are kept: a Node already carries them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum

from .snapshot import CONTAINER as SERVING_CONTAINER

APP = "nodewarm-engine-check"
CONTAINER = "engine-check"
# On the Node, by the agent: the request, then the outcome (JSON: Request, then Outcome).
REQUEST_ANNOTATION = "nodewarm.io/engine-check"
# On the check pod, by the controller: which request it answers, and the Node it is bound to.
REQUEST_ID_ANNOTATION = "nodewarm.io/engine-check-id"
NODE_ANNOTATION = "nodewarm.io/node"
TERMINATION_LOG = "/dev/termination-log"
# The observing runner's env (snapshot mode): its pod's namespace, to say where vLLM's log is (HOSTNAME is the pod).
NAMESPACE_ENV = "POD_NAMESPACE"
# The kubelet keeps at most 4096 bytes of a termination message; the runner trims its log tail to fit.
TERMINATION_MESSAGE_LIMIT = 4096
LOG_TAIL_LINES = 20
MESSAGE_LIMIT = 1024            # characters of Result.message and of each log line in a termination message
LOG_LINE_LIMIT = 300
# vLLM's own strict mode for its AOT artifacts: a load failure fails the boot instead of compiling again. Not in
# vLLM's compile hash (envs.compile_factors leaves it out), so it changes no key. nodewarm renders AOT off
# (nodeclasses/vllm.py); for Inductor's cache the runner is the strict mode (runner.py).
STRICT_ENV = {"VLLM_FORCE_AOT_LOAD": "1"}


class State(StrEnum):
    REQUESTED = "requested"
    PASSED = "passed"
    FAILED = "failed"


class Reason(StrEnum):
    """The Warm condition's reason after a check (and ``Result.reason``)."""
    ENGINE_SERVED = "EngineServed"                    # Warm=True: booted, answered, nothing compiled after a restore
    ENGINE_BOOT_FAILED = "EngineBootFailed"           # vLLM exited (or never answered) before serving
    COMPILE_CACHE_NOT_LOADED = "CompileCacheNotLoaded"  # a restored bundle did not load: vLLM compiled again
    MODEL_DOES_NOT_FIT = "ModelDoesNotFit"            # weights or KV cache for max-model-len do not fit this node
    ENGINE_CHECK_TIMED_OUT = "EngineCheckTimedOut"    # no answer within readiness.engineCheck.timeout
    ENGINE_CHECK_NOT_RUN = "EngineCheckNotRun"        # the pod never ran (not created, unschedulable, image, ...)


def template_name(profile: str) -> str:
    """The rendered PodTemplate the controller creates check pods from (serving namespace)."""
    return f"{profile}-engine-check"


def labels(profile: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/instance": profile}


def label_selector(profile: str) -> str:
    return ",".join(f"{k}={v}" for k, v in labels(profile).items())


def pod_name(profile: str, node: str, request_id: str) -> str:
    """One pod per node and request: a node name can be 253 characters, so it is hashed."""
    digest = hashlib.sha256(f"{node}\0{request_id}".encode()).hexdigest()[:10]
    return f"{template_name(profile)[:52]}-{digest}"


@dataclass(frozen=True)
class Request:
    """``REQUEST_ANNOTATION`` while the agent waits: the controller creates the pod for ``id``."""
    id: str
    at: str                                   # RFC 3339, when the agent asked
    state: str = State.REQUESTED

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


@dataclass(frozen=True)
class Result:
    """What the runner found: the termination message of the check container (JSON, <= 4096 bytes)."""
    passed: bool
    reason: str
    message: str
    compile_cache: str = ""       # hit | miss | cold | unknown: the runner's judgement of the restored bundle
    marked_stale: bool = False    # a miss: the bundle's generation was marked stale for the next publisher
    started_at: float | None = None         # epoch seconds: vLLM's process started
    ready_at: float | None = None           # its /health answered
    first_token_at: float | None = None     # the first completion came back
    log_tail: tuple[str, ...] = ()          # the engine's last log lines

    @property
    def boot_s(self) -> float | None:
        if self.started_at is None or self.ready_at is None:
            return None
        return round(self.ready_at - self.started_at, 3)

    @property
    def first_token_s(self) -> float | None:
        if self.ready_at is None or self.first_token_at is None:
            return None
        return round(self.first_token_at - self.ready_at, 3)

    def to_json(self, limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
        """Compact JSON within ``limit`` bytes. The message and each log line are cut to a share of it first, then
        the oldest lines go: the last lines (where an engine says why it stopped) are the ones kept."""
        def cut(text: str, n: int) -> str:
            return text if len(text) <= n else text[: n - 3] + "..."

        out = replace(self, message=cut(self.message, MESSAGE_LIMIT),
                      log_tail=tuple(cut(line, LOG_LINE_LIMIT) for line in self.log_tail))
        while True:
            text = json.dumps({**asdict(out), "log_tail": list(out.log_tail)}, separators=(",", ":"))
            if len(text.encode()) <= limit:
                return text
            if not out.log_tail:
                raise ValueError(f"an engine-check result cannot fit {limit} bytes")
            out = replace(out, log_tail=out.log_tail[1:])

    @classmethod
    def from_json(cls, text: str) -> "Result":
        d = json.loads(text)
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d["log_tail"] = tuple(d.get("log_tail") or ())
        return cls(**d)


@dataclass(frozen=True)
class Outcome:
    """``REQUEST_ANNOTATION`` once the agent has the answer: what `nodewarm status` shows and the controller's
    Event says (with the log tail when it failed)."""
    id: str
    state: str                                # passed | failed
    reason: str
    message: str
    boot_s: float | None = None
    first_token_s: float | None = None
    compile_cache: str = ""
    log_tail: tuple[str, ...] = ()

    @classmethod
    def of(cls, request_id: str, r: Result) -> "Outcome":
        return cls(request_id, State.PASSED if r.passed else State.FAILED, r.reason, r.message, r.boot_s,
                   r.first_token_s, r.compile_cache, r.log_tail if not r.passed else ())

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "log_tail": list(self.log_tail)}, separators=(",", ":"))


def read_annotation(text: str | None) -> Request | Outcome | None:
    """The Node's ``REQUEST_ANNOTATION``: a Request, an Outcome, or None when absent or unreadable."""
    if not text:
        return None
    try:
        d = json.loads(text)
        if d.get("state") == State.REQUESTED:
            return Request(str(d["id"]), str(d.get("at", "")))
        if d.get("state") in (State.PASSED, State.FAILED):
            known = {f.name for f in fields(Outcome)}
            d = {k: v for k, v in d.items() if k in known}
            d["log_tail"] = tuple(d.get("log_tail") or ())
            return Outcome(**d)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return None


@dataclass(frozen=True)
class RunnerArgs:
    """`nodewarm engine-check`'s flags: the renderer writes them (to_argv), the runner reads them (parse)."""
    port: int
    served_model_name: str
    timeout_s: int
    baseline: str                             # the agent's post-restore snapshot (podlayout.BASELINE_FILE)
    vllm_cache_root: str
    inductor_dir: str
    triton_dir: str
    pch_dir: str
    engine: tuple[str, ...]                   # the vLLM container's command + args, as rendered
    cache_uri: str | None = None              # set: a miss marks the bundle stale there (the pod's identity)
    start_record: str | None = None           # the start script's record: where vLLM loaded the weights from
    result: str = TERMINATION_LOG
    observe: bool = False                     # vLLM runs in another container: watch it, never start or stop it
    env: dict[str, str] = field(default_factory=dict, compare=False)   # not a flag: see runner

    def to_argv(self) -> list[str]:
        out = ["--port", str(self.port), "--served-model-name", self.served_model_name,
               "--timeout", str(self.timeout_s), "--baseline", self.baseline,
               "--vllm-cache-root", self.vllm_cache_root, "--inductor-dir", self.inductor_dir,
               "--triton-dir", self.triton_dir, "--pch-dir", self.pch_dir, "--result", self.result]
        if self.cache_uri:
            out += ["--uri", self.cache_uri]
        if self.start_record:
            out += ["--start-record", self.start_record]
        if self.observe:
            out.append("--observe")
        return out + ["--", *self.engine]


def add_runner_flags(p: argparse.ArgumentParser) -> None:
    """The flags of RunnerArgs.to_argv, for the CLI's parser (bootstrap/enginecheck/cli.py)."""
    p.add_argument("--port", type=int, required=True, help="the port vLLM serves on (spec.serving.port)")
    p.add_argument("--served-model-name", required=True, help="the model name the completion asks for")
    p.add_argument("--timeout", type=int, required=True, metavar="SECONDS",
                   help="boot + one completion must finish within this (readiness.engineCheck.timeout)")
    p.add_argument("--baseline", required=True, help="the node agent's post-restore snapshot of the cache dirs")
    for name in ("vllm-cache-root", "inductor-dir", "triton-dir", "pch-dir"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--uri", dest="cache_uri", help="compileCache.uri: a bundle that did not load is marked stale here")
    p.add_argument("--start-record", help="the start script's record of where vLLM loaded the weights from")
    p.add_argument("--result", default=TERMINATION_LOG, help=f"where the JSON result goes (default {TERMINATION_LOG})")
    p.add_argument("--observe", action="store_true",
                   help="vLLM runs in the pod's container " + SERVING_CONTAINER + " (spec.serving.snapshot): wait for "
                        "its /health on the pod's loopback and ask it, never start or stop it; no engine after --")
    p.add_argument("engine", nargs=argparse.REMAINDER,
                   help="after --: the vLLM container's command and args, as rendered")


def runner_args(ns: argparse.Namespace) -> RunnerArgs:
    engine = list(ns.engine)
    if engine[:1] == ["--"]:
        engine = engine[1:]
    if ns.observe and engine:
        raise ValueError("--observe starts no engine: give no command after --")
    if not ns.observe and not engine:
        raise ValueError("no engine command after --: give the vLLM container's command and args")
    return RunnerArgs(ns.port, ns.served_model_name, ns.timeout, ns.baseline, ns.vllm_cache_root, ns.inductor_dir,
                      ns.triton_dir, ns.pch_dir, tuple(engine), ns.cache_uri, ns.start_record, ns.result, ns.observe)
