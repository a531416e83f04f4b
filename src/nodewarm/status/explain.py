"""One node at length: its row, the timeline of its steps, what it waits for, notes and its last Events."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from nodewarm.api import enginecheck, lifecycle
from nodewarm.api.decisions import OnDeadline, Reason
from nodewarm.api.lifecycle import Phase
from nodewarm.api.names import CACHE_REASON_ANNOTATION, GPUS_ANNOTATION, IMAGE_ANNOTATION, LAUNCH_FAILURE_ANNOTATION
from nodewarm.api.timeline import AGENT_STEPS, Timeline
from nodewarm.api.timeutil import fmt_duration, parse_time

from .observed import Observed, Subject, held_note, named
from .rows import Row, engine_check, fmt_gb, fmt_secs, row


@dataclass(frozen=True)
class Step:
    what: str
    start: float | None
    end: float | None
    outcome: str = ""               # the end key (e.g. compile_cache_cold) or "running"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EventLine:
    time: float | None
    type: str
    reason: str
    object: str                      # Node/NAME | NodeClaim/NAME
    message: str
    count: int = 1


@dataclass(frozen=True)
class Explanation:
    row: Row
    steps: list[Step]
    waits_for: list[str]
    events: list[EventLine]
    notes: list[str]
    engine: str = ""                 # the engine check at length (engine_line); "" when the node has none

    def to_dict(self) -> dict:
        return {"row": self.row.to_dict(), "timeline": [s.to_dict() for s in self.steps],
                "waitsFor": self.waits_for, "events": [asdict(e) for e in self.events], "notes": self.notes,
                "engine": self.engine}


def steps(s: Subject) -> list[Step]:
    out = []
    claim, node = s.claim_view, s.node_view
    if claim is not None:
        launched, registered = claim.launched, claim.registered
        out.append(Step("launch instance (Karpenter)", claim.created or None, launched,
                        "Launched" if launched else "running"))
        if launched is not None or registered is not None:
            out.append(Step("register node", launched, registered, "Registered" if registered else "running"))
    tl = node.timeline if node is not None else {}
    if tl.get(Timeline.LAUNCH_STARTED):
        started = tl.get(Timeline.AGENT_STARTED)
        out.append(Step("boot to agent start", parse_time(tl[Timeline.LAUNCH_STARTED]), parse_time(started),
                        Timeline.AGENT_STARTED if started else "running"))
    for step in AGENT_STEPS:
        if step.start not in tl:
            continue
        end = next((k for k in step.ends if k in tl), None)
        out.append(Step(step.what, parse_time(tl[step.start]), parse_time(tl[end]) if end else None, end or "running"))
    state = node.state if node is not None else None
    if state is not None and state.decided:
        out.append(Step(f"controller: {state.decision}", parse_time(state.warm or state.registered),
                        parse_time(state.decided), state.decision))
    return sorted(out, key=lambda x: (x.start is None, x.start or 0.0))


# How many of the engine's last log lines (the agent's Outcome) a failed check's explanation shows.
ENGINE_TAIL_LINES = 5


def engine_line(ec: enginecheck.Request | enginecheck.Outcome | None) -> str:
    """The engine check as the node reports it: running, or its outcome with vLLM's times on this node."""
    if isinstance(ec, enginecheck.Request):
        return f"running (requested {ec.at or '?'}, request {ec.id})"
    if not isinstance(ec, enginecheck.Outcome):
        return ""
    cache = f", compile cache {ec.compile_cache}" if ec.compile_cache else ""
    if ec.state == enginecheck.State.PASSED:
        boot = fmt_secs(ec.boot_s) if isinstance(ec.boot_s, (int, float)) else "?"
        first = fmt_secs(ec.first_token_s) if isinstance(ec.first_token_s, (int, float)) else "?"
        return f"passed ({ec.reason}): vLLM booted in {boot}, first token {first} after ready{cache}"
    return f"failed ({ec.reason}): {' '.join(ec.message.split())}{cache}"


def _running(tl: dict, start: Timeline, *ends: Timeline) -> bool:
    return start in tl and not any(k in tl for k in ends)


_THEN = {OnDeadline.UNTAINT: "untaint (cold)", OnDeadline.REPLACE: "replace the node",
         OnDeadline.KEEP: "keep the taint"}


def waits_for(s: Subject, r: Row, now: float) -> list[str]:
    tl = s.node_view.timeline if s.node_view is not None else {}
    out: list[str] = []
    if r.phase is Phase.LAUNCHING:
        return [f"Karpenter to launch the instance ({r.reason}: {r.message})"]
    if r.phase is Phase.REGISTERING:
        if s.node_view is None:
            return ["the node to register (its kubelet joining the cluster)"]
        return [f"Karpenter to register the node ({r.message})"]
    if r.phase is Phase.REPLACING:
        return ["Karpenter to finish terminating it"]
    if r.phase is Phase.WARMING:
        if not tl:
            out.append("the node agent to report (no timeline on the Node yet: it writes its progress every 30s "
                       "once the pull has run that long, or an older agent reports only when done)")
        if _running(tl, Timeline.WEIGHTS_STARTED, Timeline.WEIGHTS_DONE, Timeline.WEIGHTS_FAILED):
            w = r.weights
            if w.total is not None and w.done is not None:
                text = f"weights {w.percent or 0:.0f}% ({fmt_gb(w.done)}/{fmt_gb(w.total)} GB"
                if w.mbps:
                    text += f", {w.mbps:.0f} MB/s"
                if w.mbps and w.total > w.done:
                    text += f", ~{fmt_duration((w.total - w.done) / (w.mbps * 1e6))} left"
                if w.reported_at is not None:
                    text += f", reported {fmt_duration(now - w.reported_at)} ago"
                out.append(text + ")")
            else:
                out.append("weights (listing, checking capacity or pulling: no byte count reported yet)")
        if _running(tl, Timeline.COMPILE_CACHE_STARTED, Timeline.COMPILE_CACHE_RESTORED, Timeline.COMPILE_CACHE_COLD):
            out.append("compile-cache restore")
        if _running(tl, Timeline.IMAGE_PREPULL_STARTED, Timeline.IMAGE_PREPULL_DONE, Timeline.IMAGE_PREPULL_ENDED):
            out.append("image pre-pull (the kubelet pulling the serving image)")
        if _running(tl, Timeline.GPUS_WAIT_STARTED, Timeline.GPUS_ADVERTISED, Timeline.GPUS_WAIT_ENDED):
            out.append("GPUs not advertised: device plugin (the Node's allocatable nvidia.com/gpu)")
        if isinstance(engine_check(s.node_view), enginecheck.Request):
            out.append("the engine check: vLLM booting on this node in its check pod, which the controller creates "
                       f"from PodTemplate {enginecheck.template_name(r.profile)} in the serving namespace")
    elif r.phase is Phase.WARM and r.reason == Reason.TAINT_READDED:
        out.append(f"the controller to lift the startup taint again ({r.message})")
    elif r.phase is Phase.WARM:
        out.append("the controller to lift the startup taint (the node reported Warm)")
    elif r.phase is Phase.SERVING:
        out.append("nothing from nodewarm: the taint is lifted; the vLLM pods are the scheduler's to place")
    elif r.phase is Phase.COLD:
        out.append("the node's weights copy to complete (labelled warm=cold: the vLLM pod streams the model or "
                   "waits for the copy) and a cold first compile")
    elif r.phase is Phase.KEPT:
        out.append(f"the node to turn Warm, or someone to act: {r.reason}: {r.message}")
    elif r.phase is Phase.FAILED:
        out.append(f"nothing: the agent reported Warm=False ({r.reason}: {r.message})")
    elif r.phase is Phase.UNTAINTED:
        out.append("nothing from nodewarm: the taint was removed by someone else")
    if r.deadline_left_s is not None:
        then = _THEN.get(r.on_deadline, r.on_deadline)
        if r.deadline_left_s > 0:
            out.append(f"deadline in {fmt_duration(r.deadline_left_s)} then {then}")
        else:
            out.append(f"deadline passed {fmt_duration(-r.deadline_left_s)} ago: the controller will {then}")
    return out


def events(evs: list[dict], s: Subject, limit: int) -> list[EventLine]:
    want = {(kind, name) for kind, name in (("Node", s.node_name), ("NodeClaim", s.claim_name)) if name}
    out = []
    for e in evs:
        io = e.get("involvedObject") or {}
        if (io.get("kind"), io.get("name")) not in want:
            continue
        t = (parse_time(e.get("lastTimestamp")) or parse_time(e.get("eventTime"))
             or parse_time(e.get("firstTimestamp")) or parse_time((e.get("metadata") or {}).get("creationTimestamp")))
        out.append(EventLine(t, e.get("type", ""), e.get("reason", ""), f"{io.get('kind')}/{io.get('name')}",
                             " ".join((e.get("message") or "").split()), int(e.get("count") or 1)))
    out.sort(key=lambda x: x.time or 0.0)
    return out[-limit:]


def explain(obs: Observed, name: str, now: float, events_limit: int = 10) -> Explanation | None:
    """One node (or NodeClaim, by name): its row, its timeline, what it waits for, its last Events."""
    s = named(obs, name)
    if s is None:
        return None
    r = row(s, now)
    ann = s.node_view.annotations if s.node_view is not None else {}
    notes = []
    if s.profile is None:
        notes.append(f"no WarmProfile manages NodePool {s.pool or '(none)'}: no deadline known")
    elif r.cleanup:
        notes.append(held_note(s.profile))
    if ann.get(LAUNCH_FAILURE_ANNOTATION):
        notes.append(f"launch failure recorded: {ann[LAUNCH_FAILURE_ANNOTATION]}")
    if ann.get(CACHE_REASON_ANNOTATION):
        notes.append(f"compile cache: {r.cache} ({ann[CACHE_REASON_ANNOTATION]})")
    if ann.get(IMAGE_ANNOTATION):
        notes.append(f"image pre-pull: {ann[IMAGE_ANNOTATION]}")
    if ann.get(GPUS_ANNOTATION):
        notes.append(f"GPUs: {ann[GPUS_ANNOTATION]}")
    back = lifecycle.readded(s.node_view, s.taint_key()) if s.node_view is not None else None
    if back is not None:
        notes.append(f"the startup taint is back: nodewarm lifted it at {back.decided} ({back.decision}) and it is on "
                     "the node again (Karpenter's registration merges the NodeClaim's startupTaints into the Node; an "
                     "operator or a re-apply can put it back too): the node is undecided again, and the controller "
                     "lifts it again once the node is Warm, or at its deadline")
    ec = engine_check(s.node_view)
    if isinstance(ec, enginecheck.Outcome) and ec.log_tail:
        notes.append("engine check, the engine's last lines: " + " | ".join(ec.log_tail[-ENGINE_TAIL_LINES:]))
    return Explanation(r, steps(s), waits_for(s, r, now), events(obs.events, s, events_limit), notes,
                       engine_line(ec))
