"""The node agent: weights, compile caches and the serving image, together -> the `nodewarm.io/Warm` condition.

(Over 300 lines: the agent's one run is one sequence (three concurrent phases, their timeline, the result and the
condition it reports); the phases' own work lives in modelcache.warmer (each model's weights and compile cache),
gpuwait and imageprepull, and what is here is how they are started, timed and reported together.)

This is what the systemd unit (AL2023) and the DaemonSet (Bottlerocket, Auto Mode) run as
`nodewarm bootstrap run`. The three phases share nothing (the weights' folder, the compile-cache folder,
the kubelet's image store), so they run at once and Warm is reported when the last one ends; the
timeline records each phase's start and end. Only the weights can fail the node (not NVMe, too small,
S3 errors): a compile-cache problem only makes the first compile cold and an image not pre-pulled is
pulled by the kubelet when the pod lands, so both are reported but never fail the warm-up. Whatever happens, the outcome ends up in the condition, so the
controller (which alone may lift the taint) knows what to do: an exception nodewarm has no reason for
is reported as InternalError naming its type, never left to kill the agent before it reports. A
launcher failure recorded before this start (launchrecord) is reported first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nodewarm import logs
from nodewarm.api.defaults import default
from nodewarm.api.models import HeldModel
from nodewarm.api.models import encode as encode_models
from nodewarm.api.errors import NodewarmError
from nodewarm.api.names import (
    CACHE_ANNOTATION, CACHE_REASON_ANNOTATION, GENERATION_LABEL, GPUS_ANNOTATION, IMAGE_ANNOTATION,
    LAUNCH_FAILURE_ANNOTATION, MODELS_ANNOTATION, PROGRESS_ANNOTATION, SNAPSHOT_ANNOTATION, TIMELINE_ANNOTATION,
    WARM_GENERATION_ANNOTATION, WEIGHTS_ANNOTATION,
)
from nodewarm.api.podlayout import BASELINE_FILE, CACHE_DIR, model_path
from nodewarm.api.servingspec import ServingSpec
from nodewarm.api.timeline import Timeline
from nodewarm.api.timeutil import fmt_time
from nodewarm.api.warmprofile import DEFAULT_PREPULL_TIMEOUT_S

from . import launchrecord
from .gpuwait import GPU_WAIT_S
from .modelcache.warmer import Model, Warmer, node_cache_dirs
from .weights import WeightsSummary
from .weights import progress as weights_progress
from .weights.loadcheck import StreamerTuning

# The compile cache and the engine check are imported where they run, after the weights' first GET: they are
# not the pull's, and the agent's start-up is on the warm-up's critical path (tests/bootstrap/test_agent_startup.py).
if TYPE_CHECKING:
    from nodewarm.api.enginecheck import Outcome, Result

    from .compilecache import bundle, cachekey, restore

log = logs.get("bootstrap.agent")

RESULT_FILE = "agent-result.json"
# How often, at most, the agent writes its in-flight progress on its Node (LiveProgress): one small status patch
# per warming node per 30 s (a 1,000-node scale-up: ~33 writes/s while they pull), none when nothing changed.
PROGRESS_REPORT_S = 30.0
# The compile-cache phase, the image and the GPU waits start once the weights' first GET is out (or their phase
# ended), at the latest this long after the agent's start: the cache's botocore client, signature imports and
# restore, the waits' kubernetes client, compete for the GIL with the pull's own start-up (~0.1-0.3 CPU-s
# here), while they have the whole download to finish in.
CACHE_HEAD_START_MAX_S = 5.0


class LiveProgress:
    """While the node warms: the weights' bytes done/total and the timeline so far, on the Node for
    `nodewarm status` (annotations ``nodewarm.io/weights-progress`` and ``nodewarm.io/timeline``).

    Rate-limited (one write per ``interval_s``, the first after one interval, none when nothing changed),
    best effort (a failed write is logged and the warm-up goes on; a refused one stops the writes) and
    stopped before the final report, so it can never overwrite the final timeline with an older one.
    ``write(annotations)`` sends them (nodestatus.report_progress with the agent's identity)."""

    def __init__(self, write, interval_s: float = PROGRESS_REPORT_S):
        self._write, self._interval = write, interval_s
        self.timeline: dict[str, str] | None = None     # the warm-up's, bound by warm(); mutated by its phases
        self._snap: weights_progress.Snapshot | None = None
        self._last: tuple | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-progress", daemon=True)

    def on_progress(self, phase: str, snap) -> None:
        if phase == "download":
            self._snap = snap

    def annotations(self) -> dict[str, str]:
        out = {}
        if self.timeline:
            out[TIMELINE_ANNOTATION] = json.dumps(dict(self.timeline), separators=(",", ":"))
        s = self._snap
        if s is not None:
            out[PROGRESS_ANNOTATION] = json.dumps(
                {"doneBytes": s.done, "totalBytes": s.total, "mbps": round(s.rate_bps / 1e6, 1), "at": _stamp()},
                separators=(",", ":"))
        return out

    def flush(self) -> bool:
        """Write now if something changed since the last write; whether it wrote."""
        ann = self.annotations()
        s = self._snap
        key = (ann.get(TIMELINE_ANNOTATION), (s.done, s.total) if s is not None else None)
        if not ann or key == self._last:
            return False
        try:
            self._write(ann)
        except NodewarmError as e:      # refused: this identity may not write here; stop trying
            log.warning("agent.progress_not_reported", error=str(e), stopping=True)
            self._stop.set()
            return False
        except Exception as e:  # noqa: BLE001 - progress is a courtesy: the warm-up and its report go on
            log.warning("agent.progress_not_reported", error=f"{type(e).__name__}: {e}")
            return False
        self._last = key
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def start(self) -> "LiveProgress":
        self._thread.start()
        return self

    def stop(self) -> None:
        """No write is in flight or will start once this returns."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

@dataclass(frozen=True)
class AgentConfig:
    profile: str
    model_uri: str
    dest: Path
    mount: Path
    node_name: str
    compile_cache_uri: str | None = None
    verify_key: str | None = None
    spec: ServingSpec | None = None                 # None: derived from the profile name, TP 1
    allow_non_nvme: bool = False
    load_check: bool = True
    host_root: Path = Path("/")
    runtime: tuple[cachekey.RuntimeProbe, dict] | None = None   # the serving image's, when known
    generation: str = ""        # api.generation of the profile this config came from: the Node's label
    readiness_taint: str = ""   # the startup taint: while it is on, the controller writes the generation label
    streamer: StreamerTuning | None = None          # set: stream one file with the vLLM pod's settings
    state_dir: Path | None = None                   # launcher records in, agent-result.json out
    node_labels: dict[str, str] = field(default_factory=dict)   # this Node's: part of its hardware view
    serving_image: str | None = None                # pulled by the kubelet meanwhile (imageprepull.py)
    prepull_namespace: str = default("bootstrap.namespace")     # where the image pre-pull pod runs
    prepull_deadline_s: float = float(DEFAULT_PREPULL_TIMEOUT_S)  # spec.bootstrap.imagePrepullTimeout
    gpu_wait_s: float = GPU_WAIT_S                  # how long Warm waits for the Node to advertise the GPUs
    progress_report_s: float = PROGRESS_REPORT_S     # in-flight progress on the Node at most this often (0: never)
    engine_check_s: float | None = None             # readiness.engineCheck's timeout; None: no engine check
    serving_namespace: str = default("serving.namespace")   # where the check pod runs (the serving pod's)
    peering: object | None = field(default=None, compare=False)  # peers.peering.Peering: peers on
    extras: tuple[Model, ...] = ()                  # the required further models, in the order they warm
    report_models: bool = False                     # the profile has spec.models: report names.MODELS_ANNOTATION
    headroom: object | None = None                  # weights.capacity.Headroom; None: the pull's default
    snapshot: object | None = None                  # snapshot.take.Settings: serving.snapshot on (AL2023)

    @property
    def cache_dirs(self) -> bundle.CacheDirs:
        return node_cache_dirs(self.mount)

    def first_model(self) -> Model:
        """The profile's own model (spec.model), reported as required with no priority of its own."""
        return Model(self.profile, self.model_uri, self.dest, self.generation, self.serving_spec())

    def warmer(self) -> Warmer:
        """How this node warms each of the profile's models (modelcache.warmer)."""
        return Warmer(mount=self.mount, host_root=self.host_root, allow_non_nvme=self.allow_non_nvme,
                      load_check=self.load_check, headroom=self.headroom, compile_cache_uri=self.compile_cache_uri,
                      verify_key=self.verify_key, runtime=self.runtime, node_labels=self.node_labels,
                      peering=self.peering)

    @property
    def baseline_path(self) -> Path:
        """Host side of the publisher's --baseline (api.podlayout.BASELINE_FILE)."""
        return self.mount / CACHE_DIR / BASELINE_FILE

    def serving_spec(self) -> ServingSpec:
        return self.spec or ServingSpec(model=model_path(self.profile))

    @property
    def gpus_wanted(self) -> int:
        """What the rendered vLLM pod requests (nodewarm/nodeclasses/vllm.py): tensor x pipeline parallel size."""
        s = self.serving_spec()
        return s.tp * s.pp


@dataclass
class AgentResult:
    warm: bool
    reason: str
    message: str
    weights: WeightsSummary | None = None
    cache: restore.RestoreResult | None = None
    image: object | None = None         # imageprepull.PrepullResult
    gpus: object | None = None          # gpuwait.GpuResult
    timeline: dict[str, str] = field(default_factory=dict)
    engine: Outcome | None = None       # the engine check's, when the profile asks for one
    snapshot: object | None = None      # snapshot.take.TakeResult, when serving.snapshot is on and the check passed
    models: tuple[HeldModel, ...] = ()  # with spec.models: every model warmed, for names.MODELS_ANNOTATION
    extras: dict[str, WeightsSummary] = field(default_factory=dict)     # the required further models' pulls

    def to_dict(self) -> dict:
        return {"warm": self.warm, "reason": self.reason, "message": self.message, "timeline": self.timeline,
                "weights": dataclasses.asdict(self.weights) if self.weights else None,
                "compileCache": self.cache.to_dict() if self.cache else None,
                "image": dataclasses.asdict(self.image) if self.image else None,
                "gpus": dataclasses.asdict(self.gpus) if self.gpus else None,
                "engineCheck": dataclasses.asdict(self.engine) if self.engine else None,
                "snapshot": self.snapshot.annotation() if self.snapshot else None}

    def annotations(self) -> dict[str, str]:
        out = {TIMELINE_ANNOTATION: json.dumps(self.timeline, separators=(",", ":"))}
        if self.cache is not None:
            # A restore is not a hit: the outcome stays unset until the publisher proves hit or miss in serving.
            if self.cache.status == "cold":
                out[CACHE_ANNOTATION] = "cold"
            out[CACHE_REASON_ANNOTATION] = self.cache.reason
        if self.image is not None:
            out[IMAGE_ANNOTATION] = f"{self.image.status} {self.image.reason}"
        if self.gpus is not None:
            out[GPUS_ANNOTATION] = self.gpus.annotation()
        if self.engine is not None:
            from nodewarm.api.enginecheck import REQUEST_ANNOTATION

            out[REQUEST_ANNOTATION] = self.engine.to_json()
        if self.snapshot is not None:
            out[SNAPSHOT_ANNOTATION] = json.dumps(self.snapshot.annotation(), separators=(",", ":"))
        if self.models:
            out[MODELS_ANNOTATION] = encode_models(self.models)
        if self.weights is not None:
            out[WEIGHTS_ANNOTATION] = json.dumps({"files": self.weights.files, "bytes": self.weights.bytes,
                                                     "downloadedBytes": self.weights.downloaded_bytes,
                                                     "mbps": self.weights.throughput_mb_s},
                                                    separators=(",", ":"))
        return out


def _stamp(at: float | None = None) -> str:
    """``at`` (default: now) as the timeline writes it (RFC 3339, milliseconds, as the controller reads it back)."""
    return fmt_time(time.time() if at is None else at)


def _launch_started() -> str | None:
    """When the launcher began (nodewarm-launch exports it): unit start -> first byte is the boot cost."""
    try:
        return _stamp(float(os.environ["NODEWARM_LAUNCH_STARTED"]))
    except (KeyError, ValueError, OverflowError, OSError):
        return None



def warm(cfg: AgentConfig, image_wait=None, gpu_wait=None, live: LiveProgress | None = None,
         engine_check=None, snapshot=None) -> AgentResult:
    """Run the phases; never raises an Exception: every failure becomes the result.

    ``image_wait(stop)`` waits for the serving image on this node, ``gpu_wait(stop)`` for the Node to advertise
    the GPUs the vLLM pod requests (both need the API; run() binds them). ``live`` hears the timeline and the
    pull's progress while they run. ``engine_check()`` -> (request id, enginecheck Result), once the phases
    succeeded: the node is Warm only if vLLM served on it (readiness.engineCheck; run() binds it).
    ``snapshot(request id, compile-cache result)`` -> snapshot.take.TakeResult, once the check passed
    (serving.snapshot; run() binds it): it never changes whether the node is Warm.
    """
    timeline = {Timeline.AGENT_STARTED: _stamp()}
    launched = _launch_started()
    if launched:
        timeline[Timeline.LAUNCH_STARTED] = launched
    if live is not None:
        live.timeline = timeline
    try:
        result = _warm(cfg, timeline, image_wait, gpu_wait, live)
        if result.warm and engine_check is not None:
            return _engine(result, engine_check, timeline, snapshot)
        return result
    except Exception as e:  # noqa: BLE001 - a bug or an old library must still reach the condition
        log.error("agent.internal_error", exc_info=True, error_type=type(e).__name__, error=str(e))
        timeline[Timeline.AGENT_FAILED] = _stamp()
        return AgentResult(False, "InternalError", f"the node agent failed unexpectedly: {type(e).__name__}: "
                           f"{' '.join(str(e).split())}", timeline=timeline)


def _weights(cfg: AgentConfig, timeline: dict[str, str], live: LiveProgress | None = None,
             first_get: threading.Event | None = None, stop: threading.Event | None = None,
             extras: dict[str, WeightsSummary] | None = None) -> WeightsSummary:
    """``first_get`` is set once the pull's first GET is out, or when this phase ends without one. The required
    further models are pulled after the first one, each into ``extras`` by name."""
    timeline[Timeline.WEIGHTS_STARTED] = _stamp()

    def heard(phase: str, snap) -> None:
        if first_get is not None and phase == "download":
            first_get.set()
        if live is not None:
            live.on_progress(phase, snap)

    warmer = cfg.warmer()
    try:
        # The pull makes its Progress in this thread: the listener set here is the one it calls.
        with weights_progress.listening(heard):
            summary = warmer.weights(cfg.first_model(), stop=stop, streamer=cfg.streamer)
    except NodewarmError:
        timeline[Timeline.WEIGHTS_FAILED] = _stamp()
        raise
    finally:
        if first_get is not None:
            first_get.set()
    held = [cfg.dest]
    for m in cfg.extras:
        try:
            with weights_progress.listening(heard):
                pulled = warmer.weights(m, stop=stop, link_from=tuple(held))
        except NodewarmError as e:
            timeline[Timeline.WEIGHTS_FAILED] = _stamp()
            raise NodewarmError(f"model {m.name} ({m.uri}): {e}", e.reason) from e
        held.append(m.dest)
        if extras is not None:
            extras[m.name] = pulled
    if summary.first_byte_at is not None:
        timeline[Timeline.FIRST_BYTE] = _stamp(summary.first_byte_at)
    timeline[Timeline.WEIGHTS_DONE] = _stamp()
    return summary


def _compile_cache(cfg: AgentConfig, timeline: dict[str, str],
                   after: threading.Event | None = None) -> restore.RestoreResult:
    """Restore this node's bundle; with ``after``, once it is set (or CACHE_HEAD_START_MAX_S passed)."""
    if after is not None:
        after.wait(CACHE_HEAD_START_MAX_S)
    # Imported here, not with this module: the signature checks (cryptography) cost ~0.1 s the pull never needs.
    from .compilecache import hitcheck

    timeline[Timeline.COMPILE_CACHE_STARTED] = _stamp()
    warmer = cfg.warmer()
    cache = warmer.compile_cache(cfg.first_model())
    # What the publisher judges serving against (a cold node too: it then reports cold and publishes): the first
    # model's alone.
    hitcheck.save_baseline(cfg.baseline_path, cache.as_baseline())
    for m in cfg.extras if cfg.verify_key else ():
        extra = warmer.compile_cache(m)
        log.info("agent.compile_cache", model=m.name, status=extra.status, reason=extra.reason)
    timeline[Timeline.COMPILE_CACHE_RESTORED if cache.status == "restored" else Timeline.COMPILE_CACHE_COLD] = _stamp()
    log.info("agent.compile_cache", status=cache.status, reason=cache.reason, message=cache.message)
    return cache


def _image(image_wait, stop: threading.Event, timeline: dict[str, str], after: threading.Event | None = None):
    if after is not None:
        after.wait(CACHE_HEAD_START_MAX_S)
    timeline[Timeline.IMAGE_PREPULL_STARTED] = _stamp()
    result = image_wait(stop)
    timeline[Timeline.IMAGE_PREPULL_DONE if result.status == "pulled" else Timeline.IMAGE_PREPULL_ENDED] = _stamp()
    log.info("agent.image_prepull", status=result.status, reason=result.reason, message=result.message)
    return result


def _gpus(gpu_wait, stop: threading.Event, timeline: dict[str, str], after: threading.Event | None = None):
    if after is not None:
        after.wait(CACHE_HEAD_START_MAX_S)
    timeline[Timeline.GPUS_WAIT_STARTED] = _stamp()
    result = gpu_wait(stop)
    timeline[Timeline.GPUS_ADVERTISED if result.status == "advertised" else Timeline.GPUS_WAIT_ENDED] = _stamp()
    return result


def _warm(cfg: AgentConfig, timeline: dict[str, str], image_wait=None, gpu_wait=None,
          live: LiveProgress | None = None) -> AgentResult:
    # Set when the weights failed (stop waiting for the image and GPUs: the node is not warm anyway), or when the
    # agent is being stopped (SIGTERM raises SystemExit here, in the main thread): then the pull and the waits end
    # too, or leaving the pool below would wait for them (a pull of the whole model, a 10-minute image wait).
    stop = threading.Event()
    first_get = threading.Event()
    extras: dict[str, WeightsSummary] = {}
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="phase") as pool:
        weights = pool.submit(_weights, cfg, timeline, live, first_get, stop, extras)
        cache_f = pool.submit(_compile_cache, cfg, timeline, first_get) if cfg.compile_cache_uri else None
        # The image and GPU waits start once the first GET is out too: their first API call makes the kubernetes
        # client (its import ~0.25 s), which would take the GIL from the pull's start (kubeconn.py).
        image_f = pool.submit(_image, image_wait, stop, timeline, first_get) if image_wait is not None else None
        gpus_f = pool.submit(_gpus, gpu_wait, stop, timeline, first_get) if gpu_wait is not None else None
        try:
            try:
                summary = weights.result()
            except NodewarmError as e:
                stop.set()
                log.error("agent.weights_failed", reason=e.reason, error=str(e))
                return AgentResult(False, e.reason, f"weights not ready: {' '.join(str(e).split())}",
                                   timeline=timeline)
            cache = cache_f.result() if cache_f else None
            image = image_f.result() if image_f else None
            gpus = gpus_f.result() if gpus_f else None
        except BaseException:
            stop.set()
            raise

    message = (f"{summary.files} files, {summary.bytes} bytes verified in {cfg.dest} "
               f"({summary.downloaded_bytes} downloaded at {summary.throughput_mb_s:.0f} MB/s)")
    if summary.unverified:
        message += (f"; {summary.unverified} of them without an S3 checksum or MD5 ETag: SHA-256 recorded, "
                    "not verified against S3")
    if cache is not None:
        message += "; " + cache.condition_message()
    if image is not None:
        message += "; " + image.message
    if gpus is not None and gpus.status != "advertised":
        # Warm all the same (gpuwait says why: Warm=False would deadlock with a plugin that waits for the lift).
        message += f"; WARNING {gpus.reason}: {gpus.message}"
    elif gpus is not None:
        message += "; " + gpus.message
    if extras:
        message += "; also " + ", ".join(f"{name}: {x.files} files, {x.bytes} bytes verified"
                                         for name, x in extras.items())
    models = ()
    if cfg.report_models:
        now = _stamp()
        models = (cfg.first_model().held(summary, now),) + tuple(m.held(extras[m.name], now) for m in cfg.extras)
    return AgentResult(True, "WeightsVerified", message, weights=summary, cache=cache, image=image, gpus=gpus,
                       timeline=timeline, models=models, extras=extras)


def _engine(result: AgentResult, engine_check, timeline: dict[str, str], snapshot=None) -> AgentResult:
    """The engine check after the phases: its times in the timeline, its verdict the node's; then, when it passed,
    the snapshot of its engine, said in the check's outcome (the controller's Event) and the node's message."""
    from nodewarm.api.enginecheck import Outcome, Reason

    timeline[Timeline.ENGINE_CHECK_REQUESTED] = _stamp()
    request_id, r = engine_check()
    for key, at in ((Timeline.ENGINE_STARTED, r.started_at), (Timeline.ENGINE_READY, r.ready_at),
                    (Timeline.ENGINE_FIRST_TOKEN, r.first_token_at)):
        if at is not None:
            timeline[key] = _stamp(at)
    timeline[Timeline.ENGINE_CHECK_PASSED if r.passed else Timeline.ENGINE_CHECK_FAILED] = _stamp()
    log.info("agent.engine_check", passed=r.passed, reason=r.reason, message=r.message, boot_s=r.boot_s,
             first_token_s=r.first_token_s, compile_cache=r.compile_cache)
    outcome = Outcome.of(request_id, r)
    if r.passed:
        taken = None
        if snapshot is not None:
            timeline[Timeline.SNAPSHOT_STARTED] = _stamp()
            taken = snapshot(request_id, result.cache)
            timeline[Timeline.SNAPSHOT_TAKEN if taken.taken else Timeline.SNAPSHOT_NOT_TAKEN] = _stamp()
            outcome = dataclasses.replace(outcome, message=f"{outcome.message}; {taken.message}")
        return dataclasses.replace(result, reason=Reason.ENGINE_SERVED, message=f"{outcome.message}; {result.message}",
                                   engine=outcome, snapshot=taken)
    return dataclasses.replace(result, warm=False, reason=r.reason, message=f"engine check failed: {r.message}",
                               engine=outcome)


def _write_result(state_dir: Path, result: AgentResult) -> None:
    """The outcome, on the node's disk too (temp name, then rename): what the condition says, and more."""
    doc = result.to_dict()
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = state_dir / (RESULT_FILE + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        os.replace(tmp, state_dir / RESULT_FILE)
    except OSError as e:  # a full or read-only disk must not stop the report
        log.warning("agent.result_not_written", path=str(state_dir / RESULT_FILE), error=str(e))


def image_waiter(cfg: AgentConfig, api_client):
    """The image phase bound to this node (None: the profile names no serving image to pre-pull)."""
    if not cfg.serving_image or api_client is None:
        return None

    def wait(stop):
        from .imageprepull import wait_for_image  # when the wait starts: after the weights' first GET

        return wait_for_image(api_client, cfg.node_name, cfg.serving_image, namespace=cfg.prepull_namespace,
                              profile=cfg.profile, deadline_s=cfg.prepull_deadline_s, stop=stop)
    return wait


def gpu_waiter(cfg: AgentConfig, api_client):
    """The GPU phase bound to this node (None: no API to read the Node with)."""
    if api_client is None:
        return None
    started = time.monotonic()  # the deadline counts from the agent's start, not from the wait's (after the first GET)

    def wait(stop):
        from .gpuwait import wait_for_gpus

        return wait_for_gpus(api_client, cfg.node_name, cfg.gpus_wanted, deadline_s=cfg.gpu_wait_s,
                             taint_key=cfg.readiness_taint, stop=stop, started=started)
    return wait


def engine_checker(cfg: AgentConfig, api_client):
    """The engine check bound to this node (None: the profile asks for none, or no API to ask through)."""
    if cfg.engine_check_s is None or api_client is None:
        return None

    def check() -> tuple[str, Result]:
        from nodewarm.api.enginecheck import Reason, Result  # after the phases, not on the pull's path

        from .enginecheck import request

        request_id = request.new_id()
        try:
            request.ask(api_client, cfg.node_name, request_id)
        except Exception as e:  # noqa: BLE001 - refused or unreachable: the node is not proven, and says why
            return request_id, Result(False, Reason.ENGINE_CHECK_NOT_RUN,
                                      f"could not ask for the engine check: {type(e).__name__}: {e}")
        return request_id, request.wait(api_client, cfg.node_name, request_id, namespace=cfg.serving_namespace,
                                        profile=cfg.profile, timeout_s=cfg.engine_check_s)

    return check


def snapshotter(cfg: AgentConfig, api_client):
    """The snapshot step bound to this node (None: serving.snapshot is off, or no API to read the check pod)."""
    if cfg.snapshot is None or api_client is None:
        return None

    def take_one(request_id: str, cache):
        from .snapshot import take

        return take.take_for_request(cfg.snapshot, api_client, cfg.node_name, cfg.serving_namespace, cfg.profile,
                                     request_id, take.context(cfg.generation, cache))

    return take_one


def report(api_client, cfg: AgentConfig, result: AgentResult, extra: dict[str, str] | None = None) -> None:
    """``result`` on this node: the Warm condition, the facts, and when warm the generation it holds (a label
    only once the startup taint is gone; the controller writes it as it lifts the taint, nodestatus says why)."""
    from .nodestatus import report_warm

    labels, annotations = None, {**result.annotations(), **(extra or {})}
    if result.warm and cfg.generation:
        labels = {GENERATION_LABEL: cfg.generation}
        annotations[WARM_GENERATION_ANNOTATION] = cfg.generation
    report_warm(api_client, cfg.node_name, result.warm, result.reason, result.message, annotations, labels,
                startup_taint=cfg.readiness_taint or None)


def run(cfg: AgentConfig, api_client) -> AgentResult:
    """warm(), then report it on this node with the node's own identity."""
    from .nodestatus import report_warm

    start = time.monotonic()
    launch = launchrecord.read(cfg.state_dir) if cfg.state_dir else None
    if launch is not None:
        # Said now, not only in the final result: the warm-up that follows can take many minutes.
        log.warning("agent.launch_failure", **dataclasses.asdict(launch))
        report_warm(api_client, cfg.node_name, False, launch.reason, launch.condition_message(),
                    {LAUNCH_FAILURE_ANNOTATION: launch.annotation()})
        launchrecord.clear(cfg.state_dir)
    live = None
    if api_client is not None and cfg.progress_report_s > 0:
        from .nodestatus import report_progress

        live = LiveProgress(lambda ann: report_progress(api_client, cfg.node_name, ann), cfg.progress_report_s)
        live.start()
    try:
        result = warm(cfg, image_waiter(cfg, api_client), gpu_waiter(cfg, api_client), live,
                      engine_checker(cfg, api_client), snapshotter(cfg, api_client))
    finally:
        if live is not None:
            live.stop()     # before the final report: a late progress write must not overwrite its timeline
    if launch is not None:
        result.timeline[Timeline.LAUNCH_FAILED] = launch.time
    result.timeline[Timeline.WARM_REPORTED] = _stamp()
    if cfg.state_dir:
        _write_result(cfg.state_dir, result)
    report(api_client, cfg, result)
    log.info("agent.done", warm=result.warm, reason=result.reason, seconds=round(time.monotonic() - start, 3))
    return result
