"""One table row per subject: its phase and for how long, weights, compile cache, the deadline left and more."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from nodewarm.api import enginecheck, lifecycle, models
from nodewarm.api.lifecycle import Phase
from nodewarm.api.names import (
    CACHE_ANNOTATION, CACHE_LABEL, CACHE_OUTCOMES, GENERATION_LABEL, GPUS_ANNOTATION, IMAGE_ANNOTATION,
    INSTANCE_TYPE_LABEL, MODELS_ANNOTATION, PROGRESS_ANNOTATION, WEIGHTS_ANNOTATION,
)
from nodewarm.api.timeline import AGENT_STEPS, Timeline
from nodewarm.api.timeutil import fmt_duration, parse_time
from nodewarm.api.views import NodeView, ProfileMeta, warm_generation
from nodewarm.api.warmprofile import parse_duration_s

from .observed import Observed, Subject, cleanup, owners, subjects


def fmt_gb(n: int) -> str:
    g = n / 1e9
    return f"{g:.0f}" if g >= 10 else f"{g:.1f}" if g >= 0.1 else f"{g:.2f}"


@dataclass(frozen=True)
class Weights:
    done: int | None = None          # bytes
    total: int | None = None
    mbps: float | None = None
    reported_at: float | None = None  # when the agent last wrote it (in-flight progress only)
    final: bool = False               # the agent's summary after the pull, not in-flight progress

    @property
    def percent(self) -> float | None:
        if self.done is None or not self.total:
            return None
        return 100.0 * self.done / self.total

    def text(self) -> str:
        if self.done is None or self.total is None:
            return "-"
        if self.final:
            return f"{fmt_gb(self.total)} GB done"
        return f"{fmt_gb(self.done)}/{fmt_gb(self.total)} GB {self.percent or 0:.0f}%"


@dataclass(frozen=True)
class ModelRow:
    """One model the node agent reports on its Node (nodewarm.io/models, api/models.py), and its label there."""
    name: str                        # the model's view name: the profile's for the first model, else <profile>-<name>
    state: str                       # pulling | warm | evicting | failed
    generation: str                  # held verified
    labelled: bool                   # the Node carries the model's label with that generation (its pods may land)
    bytes: int
    last_used: str                   # RFC 3339
    pending: str                     # a generation pulled beside it (a roll), or that failed
    reason: str
    message: str                     # why it failed (NoCapacity: what did not fit)

    def text(self) -> str:
        """name=state, the reason of a failure."""
        return f"{self.name}={self.state}" + (f"({self.reason})" if self.reason else "")


@dataclass(frozen=True)
class Row:
    node: str                        # "" while the claim has no Node
    node_claim: str
    profile: str
    phase: Phase
    phase_since: float | None        # epoch seconds
    in_phase_s: float | None
    reason: str
    message: str
    weights: Weights
    cache: str                       # hit | miss | cold | restored | -
    deadline_left_s: float | None    # None: no deadline running (decided, warm, or no profile)
    deadline: str                    # the profile's readiness.deadline
    on_deadline: str
    instance_type: str
    generation: str
    image: str
    gpus: str
    cleanup: str = ""                # the profile is deleted, its clean-up held: why (observed.cleanup)
    engine: str = "-"                # the engine check (readiness.engineCheck): engine_text
    models: tuple[ModelRow, ...] = ()   # what the agent reports it holds or pulls (spec.models)

    @property
    def name(self) -> str:
        return self.node or f"nodeclaim/{self.node_claim}"

    def deadline_text(self) -> str:
        if self.deadline_left_s is None:
            return "-"
        if self.deadline_left_s > 0:
            return fmt_duration(self.deadline_left_s)
        return f"passed {fmt_duration(-self.deadline_left_s)} ago"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["name"] = self.name
        d["weights"]["percent"] = self.weights.percent
        return d


def deadline_s(p: ProfileMeta) -> float | None:
    try:
        return float(parse_duration_s(p.deadline))
    except Exception:  # noqa: BLE001 - a profile the CLI cannot read still shows its nodes, without deadline
        return None


def weights(node: NodeView | None) -> Weights:
    if node is None:
        return Weights()
    final = node.json_annotation(WEIGHTS_ANNOTATION)
    if final.get("bytes") is not None and Timeline.WEIGHTS_DONE in node.timeline:
        return Weights(int(final["bytes"]), int(final["bytes"]), final.get("mbps"), None, True)
    p = node.json_annotation(PROGRESS_ANNOTATION)
    if p.get("totalBytes") is not None:
        try:
            return Weights(int(p.get("doneBytes", 0)), int(p["totalBytes"]), p.get("mbps"), parse_time(p.get("at")))
        except (TypeError, ValueError):
            return Weights()
    return Weights()


def held_models(s: Subject) -> tuple[ModelRow, ...]:
    node = s.node_view
    if node is None:
        return ()
    out = []
    for m in models.decode(node.annotations.get(MODELS_ANNOTATION)).values():
        label = s.node_label(models.held_label_key(s.profile.name if s.profile else node.profile, m.name))
        out.append(ModelRow(m.name, m.state, m.generation, bool(m.generation) and label == m.generation, m.bytes,
                            m.last_used, m.pending, m.reason, " ".join(m.message.split())))
    return tuple(out)


def fmt_secs(s: float) -> str:
    return f"{s:.1f}s" if s < 60 else fmt_duration(s)


def engine_check(node: NodeView | None) -> enginecheck.Request | enginecheck.Outcome | None:
    """The agent's engine-check annotation on the Node: its request while the check runs, then the outcome."""
    return enginecheck.read_annotation(node.annotations.get(enginecheck.REQUEST_ANNOTATION)) if node else None


def engine_text(ec: enginecheck.Request | enginecheck.Outcome | None) -> str:
    """running; passed, with vLLM's boot and first-token times on this node; failed, with the reason; or -."""
    if isinstance(ec, enginecheck.Request):
        return "running"
    if isinstance(ec, enginecheck.Outcome):
        if ec.state == enginecheck.State.PASSED:
            times = [f"{what} {fmt_secs(v)}" for what, v in (("boot", ec.boot_s), ("first token", ec.first_token_s))
                     if isinstance(v, (int, float))]
            return "passed" + (f" ({', '.join(times)})" if times else "")
        return f"failed: {ec.reason}"
    return "-"


def cache(s: Subject) -> str:
    node = s.node_view
    v = node.annotations.get(CACHE_ANNOTATION, "") if node is not None else ""
    if v in CACHE_OUTCOMES:
        return v
    label = s.node_label(CACHE_LABEL)
    if label in CACHE_OUTCOMES:                  # the controller's label (cold after a deadline)
        return label
    timeline = node.timeline if node is not None else {}
    if Timeline.COMPILE_CACHE_RESTORED in timeline:
        return "restored"
    if Timeline.COMPILE_CACHE_COLD in timeline:
        return "cold"
    return "-"


def _pending(tl: dict, step) -> bool:
    return step.start in tl and not any(k in tl for k in step.ends)


# What a warming node is busy with, by the agent's timeline so far: the first step still running, in the order
# they usually end last (the weights, the image, the GPUs, the compile cache).
_BUSY = (("PullingWeights", AGENT_STEPS[1]), ("PullingImage", AGENT_STEPS[3]), ("WaitingForGPUs", AGENT_STEPS[4]),
         ("RestoringCache", AGENT_STEPS[2]))


def warming_reason(tl: dict, engine_running: bool = False) -> str:
    """``engine_running``: the node's engine-check annotation is a request (the agent waits for the check pod)."""
    if not tl:
        return "NoAgentReport"
    busy = next((reason for reason, step in _BUSY if _pending(tl, step)), None)
    return busy or ("CheckingEngine" if engine_running else "Warming")


def row(s: Subject, now: float) -> Row:
    stage = s.stage()
    node, prof = s.node_view, s.profile
    ec = engine_check(node)
    reason = (warming_reason(node.timeline, isinstance(ec, enginecheck.Request))
              if stage.phase is Phase.WARMING and node is not None else stage.reason)
    left = None
    limit = deadline_s(prof) if prof is not None else None
    if limit is not None and node is not None and stage.phase in lifecycle.DEADLINE_PHASES:
        left = lifecycle.deadline_start(s.claim_view, node) + limit - now
    ann = node.annotations if node is not None else {}
    gpus = ann.get(GPUS_ANNOTATION, "").rsplit(" ", 1)[-1]      # "advertised GpusAdvertised 8/8" -> 8/8
    if not gpus and s.node is not None:
        alloc = ((s.node.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu")
        gpus = str(alloc) if alloc is not None else ""
    generation = s.node_label(GENERATION_LABEL) or warm_generation(ann) or ""
    return Row(
        node=s.node_name, node_claim=s.claim_name, profile=prof.name if prof else "", phase=stage.phase,
        phase_since=stage.since, in_phase_s=(now - stage.since) if stage.since is not None else None,
        reason=reason, message=" ".join(stage.message.split()), weights=weights(node), cache=cache(s),
        deadline_left_s=left, deadline=prof.deadline if prof else "", on_deadline=prof.on_deadline if prof else "",
        instance_type=s.label(INSTANCE_TYPE_LABEL), generation=generation,
        image=ann.get(IMAGE_ANNOTATION, "").split(" ", 1)[0], gpus=gpus, cleanup=cleanup(prof) if prof else "",
        engine=engine_text(ec), models=held_models(s))


def rows(obs: Observed, now: float, profile: str | None = None) -> list[Row]:
    """One row per NodeClaim of a WarmProfile's NodePool (with its Node when there is one) and per Node of such
    a pool that no claim names; ``profile`` keeps that profile's only. Sorted by profile, then name."""
    by_name = {p.name: p for p in owners(obs).values()}
    out = []
    for s in subjects(obs):
        if s.profile is None and s.node_view is not None and s.node_view.state is not None:
            # A node whose pool no profile gates now, with a record of the profile that decided it: shown under it.
            s = replace(s, profile=by_name.get(s.node_view.state.profile))
        if s.profile is None or (profile and s.profile.name != profile):
            continue
        out.append(row(s, now))
    return sorted(out, key=lambda r: (r.profile, r.name))
