"""`nodewarm status`: where each warming node stands, from the cluster's own objects, read-only.

Two halves in one module:

* the pure part (``rows``, ``explain`` and the dataclasses they return) turns observed objects, plain JSON dicts
  as the API server sends them (NodeClaims ``karpenter.sh/v1``, Nodes, WarmProfiles ``nodewarm.io/v1alpha1``,
  Events) and the clock into table rows and one node's explanation. No I/O: tests feed it realistic objects.
* the thin shell (``observe``, ``run``, ``register``) lists those objects with the kubeconfig's identity and
  prints. It only reads: ``list`` on nodes, nodeclaims and warmprofiles, ``list`` on events in the namespace
  the controller writes them to (``default``, where events about cluster-scoped objects go). ``RBAC_RULES``
  is that ClusterRole's rules (events need only a Role in ``default``).

Where each column comes from:

* phase: the NodeClaim's Karpenter conditions (Launched, Registered) and deletionTimestamp, the Node's startup
  taint, its ``nodewarm.io/Warm`` condition (the agent) and the controller's record ``nodewarm.io/state``;
* time in phase: the start of the phase from the same objects (claim creation, Launched/Registered transition,
  the agent's timeline, the record's ``decided``);
* weights: while pulling, the agent's ``nodewarm.io/weights-progress`` (bytes done/total, written at most every
  30 s: bootstrap/agent.py ``LiveProgress``); once pulled, its ``nodewarm.io/weights`` summary;
* cache: ``nodewarm.io/compile-cache`` (hit/miss once serving proves it, cold at warm time); ``restored`` when
  the agent restored a bundle that serving has not judged yet;
* deadline: ``spec.readiness.deadline`` of the node's WarmProfile counted from registration, as the controller
  counts it (controller/plan.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

from nodewarm.api import defaults
from nodewarm.api.names import (
    CACHE_ANNOTATION, CACHE_LABEL, CACHE_OUTCOMES, CACHE_REASON_ANNOTATION, CLEANUP_CONDITION, CLEANUP_FINALIZER,
    GENERATION_LABEL, GPUS_ANNOTATION,
    IMAGE_ANNOTATION, INSTANCE_TYPE_LABEL, LAUNCH_FAILURE_ANNOTATION, NODEPOOL_LABEL, PROGRESS_ANNOTATION, STATE_ANNOTATION,
    TIMELINE_ANNOTATION, WARM_CONDITION, WARM_GENERATION_ANNOTATION, WEIGHTS_ANNOTATION,
)
from nodewarm.api.timeline import Timeline

EVENTS_NAMESPACE = "default"                # where Node and NodeClaim events go (controller/events.py)

# What a user running `nodewarm status` needs, and nothing more (tests/test_status.py runs it with exactly this).
RBAC_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
    {"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": ["list"]},
    {"apiGroups": ["nodewarm.io"], "resources": ["warmprofiles"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},   # in `default` only: a Role is enough
]

# Phases, in the order a node goes through them.
LAUNCHING = "Launching"                     # NodeClaim created, instance not launched yet
REGISTERING = "Registering"                 # instance launched, no Node yet
WARMING = "Warming"                         # Node registered under the startup taint, not Warm yet
WARM = "Warm"                               # reported Warm, the controller has not lifted the taint yet
SERVING = "Untainted(serving)"              # the controller lifted the taint on Warm
COLD = "DeadlineUntaint(cold)"              # the deadline passed and onDeadline=untaint lifted it cold
KEPT = "DeadlineKeep"                       # the deadline passed, the taint stays (keep, or replace refused)
FAILED = "Failed"                           # the agent reported Warm=False
REPLACING = "Replacing"                     # the NodeClaim (or Node) is being deleted
UNTAINTED = "Untainted(external)"           # the taint is gone but nodewarm did not lift it


# --------------------------------------------------------------------------------------------------- helpers

def parse_time(s) -> float | None:
    from datetime import datetime

    if not s or not isinstance(s, str):
        return None
    try:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def fmt_duration(s: float | None) -> str:
    """kubectl-like: 45s, 4m12s, 2h5m, 3d4h."""
    if s is None:
        return "-"
    s = max(0, int(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s % 60 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m" if s % 3600 // 60 else f"{s // 3600}h"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def fmt_gb(n: int) -> str:
    g = n / 1e9
    return f"{g:.0f}" if g >= 10 else f"{g:.1f}" if g >= 0.1 else f"{g:.2f}"


def _duration_s(text: str) -> float | None:
    from nodewarm.api.warmprofile import parse_duration_s

    try:
        return float(parse_duration_s(text))
    except Exception:  # noqa: BLE001 - a profile the CLI cannot read still shows its nodes, without deadline
        return None


def _condition(obj: dict, ctype: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == ctype:
            return c
    return None


def _true_at(obj: dict, ctype: str) -> float | None:
    c = _condition(obj, ctype)
    return parse_time(c.get("lastTransitionTime")) if c and c.get("status") == "True" else None


def _json_ann(node: dict, key: str) -> dict:
    try:
        v = json.loads(((node.get("metadata") or {}).get("annotations") or {}).get(key, ""))
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def _ann(obj: dict | None, key: str) -> str:
    return (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(key, "")


def _label(obj: dict | None, key: str) -> str:
    return (((obj or {}).get("metadata") or {}).get("labels") or {}).get(key, "")


# --------------------------------------------------------------------------------------------------- profiles

@dataclass(frozen=True)
class ProfileView:
    name: str
    node_pool: str
    taint_key: str
    deadline: str
    deadline_s: float | None
    on_deadline: str
    # A deleted profile whose clean-up is held (its finalizer still on): it keeps gating its pool, so its nodes
    # stay its own. ``cleanup`` is the reason of its Cleanup condition (WouldDrift: removing the taint would
    # replace the pool's nodes), "Pending" before the controller has written one; "" for a live profile.
    cleanup: str = ""
    cleanup_message: str = ""

    @classmethod
    def from_obj(cls, o: dict) -> "ProfileView":
        spec = o.get("spec") or {}
        r = spec.get("readiness") or {}
        deadline = r.get("deadline", defaults.DEADLINE)
        cleanup, message = "", ""
        if _held(o):
            c = _condition(o, CLEANUP_CONDITION) or {}
            cleanup, message = c.get("reason") or "Pending", c.get("message") or \
                "the controller has not reported on the clean-up yet"
        return cls(name=o["metadata"]["name"], node_pool=(spec.get("nodes") or {}).get("nodePool", ""),
                   taint_key=r.get("taintKey", defaults.TAINT_KEY), deadline=deadline, deadline_s=_duration_s(deadline),
                   on_deadline=r.get("onDeadline", defaults.ON_DEADLINE), cleanup=cleanup, cleanup_message=" ".join(message.split()))


def _held(o: dict) -> bool:
    """Deleted, its clean-up still holding it (the controller's ``held_profiles``)."""
    md = o.get("metadata") or {}
    return bool(md.get("deletionTimestamp")) and CLEANUP_FINALIZER in (md.get("finalizers") or ())


# --------------------------------------------------------------------------------------------------- rows

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
class Row:
    node: str                        # "" while the claim has no Node
    node_claim: str
    profile: str
    phase: str
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
    cleanup: str = ""                # the profile is deleted, its clean-up held: why (see ProfileView.cleanup)

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


@dataclass(frozen=True)
class Observed:
    """Everything `status` reads, as the API server returned it."""
    nodes: list[dict]
    claims: list[dict]
    profiles: list[dict]
    events: list[dict] = field(default_factory=list)


def _pairs(obs: Observed) -> list[tuple[dict | None, dict | None]]:
    """NodeClaims with their Node (by providerID, as Karpenter and the controller pair them), then Nodes of a
    nodewarm NodePool that no claim names."""
    by_pid = {(n.get("spec") or {}).get("providerID", ""): n for n in obs.nodes}
    by_name = {n["metadata"]["name"]: n for n in obs.nodes}
    used: set[str] = set()
    out: list[tuple[dict | None, dict | None]] = []
    for c in obs.claims:
        st = c.get("status") or {}
        n = by_pid.get(st.get("providerID", "")) if st.get("providerID") else None
        if n is None and st.get("nodeName"):
            n = by_name.get(st["nodeName"])
        if n is not None:
            used.add(n["metadata"]["name"])
        out.append((c, n))
    out += [(None, n) for n in obs.nodes if n["metadata"]["name"] not in used]
    return out


def _weights(node: dict | None, timeline: dict) -> Weights:
    if node is None:
        return Weights()
    final = _json_ann(node, WEIGHTS_ANNOTATION)
    if final.get("bytes") is not None and "weights_done" in timeline:
        return Weights(int(final["bytes"]), int(final["bytes"]), final.get("mbps"), None, True)
    p = _json_ann(node, PROGRESS_ANNOTATION)
    if p.get("totalBytes") is not None:
        try:
            return Weights(int(p.get("doneBytes", 0)), int(p["totalBytes"]), p.get("mbps"), parse_time(p.get("at")))
        except (TypeError, ValueError):
            return Weights()
    return Weights()


def _cache(node: dict | None, timeline: dict) -> str:
    v = _ann(node, CACHE_ANNOTATION)
    if v in CACHE_OUTCOMES:
        return v
    if _label(node, CACHE_LABEL) in CACHE_OUTCOMES:       # the controller's label (cold after a deadline)
        return _label(node, CACHE_LABEL)
    if "compile_cache_restored" in timeline:
        return "restored"
    if "compile_cache_cold" in timeline:
        return "cold"
    return "-"


def _state(node: dict | None) -> dict:
    return _json_ann(node, STATE_ANNOTATION) if node is not None else {}


def _timeline(node: dict | None) -> dict:
    return _json_ann(node, TIMELINE_ANNOTATION) if node is not None else {}


def _phase(claim: dict | None, node: dict | None, prof: ProfileView | None, now: float
           ) -> tuple[str, float | None, str, str]:
    """(phase, since, reason, message)."""
    taint = prof.taint_key if prof else defaults.TAINT_KEY
    if claim is not None and claim["metadata"].get("deletionTimestamp"):
        return REPLACING, parse_time(claim["metadata"]["deletionTimestamp"]), "NodeClaimDeleting", \
            "Karpenter is terminating the NodeClaim (a replacement, if any, is a new NodeClaim)"
    if node is not None and node["metadata"].get("deletionTimestamp"):
        return REPLACING, parse_time(node["metadata"]["deletionTimestamp"]), "NodeDeleting", "the Node is being deleted"
    if node is None:
        assert claim is not None
        launched = _true_at(claim, "Launched")
        if launched is None:
            c = _condition(claim, "Launched") or {}
            return (LAUNCHING, parse_time(claim["metadata"].get("creationTimestamp")), c.get("reason") or "NotLaunched",
                    c.get("message") or "waiting for Karpenter to launch the instance")
        return REGISTERING, launched, "NotRegistered", "instance launched, its Node has not registered yet"
    state = _state(node)
    warm = _condition(node, WARM_CONDITION) or {}
    tainted = any(t.get("key") == taint for t in (node.get("spec") or {}).get("taints") or ())
    timeline = _timeline(node)
    decision = state.get("decision")
    if decision == "Untainted":
        return SERVING, parse_time(state.get("decided")), warm.get("reason") or "Untainted", warm.get("message", "")
    if decision == "DeadlineUntaint":
        return COLD, parse_time(state.get("decided")), "DeadlineExceeded", warm.get("message") or \
            "not Warm by the deadline: untainted cold"
    if decision == "DeadlineKeep" and tainted and warm.get("status") != "True":
        return KEPT, parse_time(state.get("decided")), warm.get("reason") or "DeadlineExceeded", \
            warm.get("message") or "not Warm by the deadline: the taint stays"
    if not tainted:
        if warm.get("status") == "True":
            return SERVING, parse_time(warm.get("lastTransitionTime")), warm.get("reason", ""), warm.get("message", "")
        return UNTAINTED, None, "TaintGone", f"{taint} is not on the node and nodewarm did not lift it"
    if warm.get("status") == "True":
        since = parse_time(timeline.get(Timeline.WARM_REPORTED)) or parse_time(warm.get("lastTransitionTime"))
        return WARM, since, warm.get("reason", ""), warm.get("message", "")
    if warm.get("status") == "False":
        return FAILED, parse_time(warm.get("lastTransitionTime")), warm.get("reason", ""), warm.get("message", "")
    since = (_true_at(claim, "Registered") if claim is not None else None) or \
        parse_time(node["metadata"].get("creationTimestamp"))
    return WARMING, since, _warming_reason(timeline), "the node agent has not reported nodewarm.io/Warm yet"


def _pending(tl: dict, start: str, ends: tuple[str, ...]) -> bool:
    return start in tl and not any(k in tl for k in ends)


def _warming_reason(tl: dict) -> str:
    """What a warming node is busy with, by the agent's timeline so far (the first still running, in the order
    they usually end last)."""
    if not tl:
        return "NoAgentReport"
    for reason, (_, start, ends) in zip(("PullingWeights", "PullingImage", "WaitingForGPUs", "RestoringCache"),
                                        (AGENT_PHASES[1], AGENT_PHASES[3], AGENT_PHASES[4], AGENT_PHASES[2])):
        if _pending(tl, start, ends):
            return reason
    return "Warming"


def _deadline_left(claim: dict | None, node: dict | None, prof: ProfileView | None, phase: str,
                   now: float) -> float | None:
    """Seconds until the controller acts on readiness.deadline (<= 0: passed), as controller/plan.py counts."""
    if prof is None or prof.deadline_s is None or node is None or phase not in (WARMING, FAILED):
        return None
    start = (_true_at(claim, "Registered") if claim is not None else None) or \
        parse_time(node["metadata"].get("creationTimestamp"))
    if start is None:
        return None
    return start + prof.deadline_s - now


def _row(claim: dict | None, node: dict | None, prof: ProfileView | None, now: float) -> Row:
    phase, since, reason, message = _phase(claim, node, prof, now)
    timeline = _timeline(node)
    gen = _label(node, GENERATION_LABEL) or _ann(node, WARM_GENERATION_ANNOTATION)
    gpus = _ann(node, GPUS_ANNOTATION).rsplit(" ", 1)[-1]      # "advertised GpusAdvertised 8/8" -> 8/8
    if not gpus and node is not None:
        alloc = ((node.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu")
        gpus = str(alloc) if alloc is not None else ""
    return Row(
        node=node["metadata"]["name"] if node else "", node_claim=claim["metadata"]["name"] if claim else "",
        profile=prof.name if prof else "", phase=phase, phase_since=since,
        in_phase_s=(now - since) if since is not None else None, reason=reason, message=" ".join(message.split()),
        weights=_weights(node, timeline), cache=_cache(node, timeline),
        deadline_left_s=_deadline_left(claim, node, prof, phase, now),
        deadline=prof.deadline if prof else "", on_deadline=prof.on_deadline if prof else "",
        instance_type=_label(node, INSTANCE_TYPE_LABEL) or _label(claim, INSTANCE_TYPE_LABEL),
        generation=gen, image=_ann(node, IMAGE_ANNOTATION).split(" ", 1)[0], gpus=gpus,
        cleanup=prof.cleanup if prof else "")


def _profiles(obs: Observed) -> dict[str, ProfileView]:
    """NodePool -> profile, by the controller's rule (``profile_for_pool``): a NodePool belongs to the oldest live
    profile that names it (creationTimestamp, then name; a later one is refused NodePoolTaken), else to a deleted
    one whose clean-up still holds it (its finalizer on: it keeps gating the pool). A deleted profile with no
    clean-up pending binds nothing."""
    out: dict[str, ProfileView] = {}

    def age(o: dict) -> tuple[str, str]:
        return (o.get("metadata") or {}).get("creationTimestamp") or "", (o.get("metadata") or {}).get("name") or ""

    live = sorted((o for o in obs.profiles if not (o.get("metadata") or {}).get("deletionTimestamp")), key=age)
    for o in live + sorted(filter(_held, obs.profiles), key=age):
        try:
            p = ProfileView.from_obj(o)
        except (KeyError, TypeError, AttributeError):
            continue
        if p.node_pool:
            out.setdefault(p.node_pool, p)
    return out


def rows(obs: Observed, now: float, profile: str | None = None) -> list[Row]:
    """One row per NodeClaim of a WarmProfile's NodePool (with its Node when there is one) and per Node of such
    a pool that no claim names; ``profile`` keeps that profile's only. Sorted by profile, then name."""
    by_pool = _profiles(obs)
    out = []
    for claim, node in _pairs(obs):
        pool = _label(claim, NODEPOOL_LABEL) or _label(node, NODEPOOL_LABEL)
        prof = by_pool.get(pool)
        if prof is None:
            rec = _state(node).get("profile")
            prof = next((p for p in by_pool.values() if p.name == rec), None)
        if prof is None or (profile and prof.name != profile):
            continue
        out.append(_row(claim, node, prof, now))
    return sorted(out, key=lambda r: (r.profile, r.name))


# --------------------------------------------------------------------------------------------------- one node

# The agent's timeline keys (bootstrap/agent.py), as (label, start key, end keys).
AGENT_PHASES = (
    ("node agent", "agent_started", ("warm_reported", "agent_failed")),
    ("pull weights", "weights_started", ("weights_done", "weights_failed")),
    ("restore compile cache", "compile_cache_started", ("compile_cache_restored", "compile_cache_cold")),
    ("pre-pull serving image", "image_prepull_started", ("image_prepull_done", "image_prepull_ended")),
    ("wait for GPUs advertised", "gpus_wait_started", ("gpus_advertised", "gpus_wait_ended")),
)


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

    def to_dict(self) -> dict:
        return {"row": self.row.to_dict(), "timeline": [s.to_dict() for s in self.steps],
                "waitsFor": self.waits_for, "events": [asdict(e) for e in self.events], "notes": self.notes}


def _steps(claim: dict | None, node: dict | None, row: Row) -> list[Step]:
    steps = []
    if claim is not None:
        created = parse_time(claim["metadata"].get("creationTimestamp"))
        launched, registered = _true_at(claim, "Launched"), _true_at(claim, "Registered")
        steps.append(Step("launch instance (Karpenter)", created, launched, "Launched" if launched else "running"))
        if launched is not None or registered is not None:
            steps.append(Step("register node", launched, registered, "Registered" if registered else "running"))
    tl = _timeline(node)
    if tl.get("launch_started"):
        steps.append(Step("boot to agent start", parse_time(tl["launch_started"]), parse_time(tl.get("agent_started")),
                          "agent_started" if tl.get("agent_started") else "running"))
    for what, start, ends in AGENT_PHASES:
        if start not in tl:
            continue
        end = next((k for k in ends if k in tl), None)
        steps.append(Step(what, parse_time(tl[start]), parse_time(tl[end]) if end else None, end or "running"))
    state = _state(node)
    if state.get("decided"):
        steps.append(Step(f"controller: {state.get('decision', '?')}", parse_time(state.get("warm") or
                                                                                     state.get("registered")),
                          parse_time(state["decided"]), state.get("decision", "")))
    return sorted(steps, key=lambda s: (s.start is None, s.start or 0.0))


def _waits_for(claim: dict | None, node: dict | None, row: Row, now: float) -> list[str]:
    tl = _timeline(node)
    out: list[str] = []
    if row.phase == LAUNCHING:
        return [f"Karpenter to launch the instance ({row.reason}: {row.message})"]
    if row.phase == REGISTERING:
        return ["the node to register (its kubelet joining the cluster)"]
    if row.phase == REPLACING:
        return ["Karpenter to finish terminating it"]
    if row.phase == WARMING:
        if not tl:
            out.append("the node agent to report (no timeline on the Node yet: it writes its progress every 30s "
                       "once the pull has run that long, or an older agent reports only when done)")
        if "weights_started" in tl and not any(k in tl for k in ("weights_done", "weights_failed")):
            w = row.weights
            if w.total is not None and w.done is not None:
                s = f"weights {w.percent or 0:.0f}% ({fmt_gb(w.done)}/{fmt_gb(w.total)} GB"
                if w.mbps:
                    s += f", {w.mbps:.0f} MB/s"
                if w.mbps and w.total > w.done:
                    s += f", ~{fmt_duration((w.total - w.done) / (w.mbps * 1e6))} left"
                if w.reported_at is not None:
                    s += f", reported {fmt_duration(now - w.reported_at)} ago"
                out.append(s + ")")
            else:
                out.append("weights (listing, checking capacity or pulling: no byte count reported yet)")
        if "compile_cache_started" in tl and not any(k in tl for k in ("compile_cache_restored", "compile_cache_cold")):
            out.append("compile-cache restore")
        if "image_prepull_started" in tl and not any(k in tl for k in ("image_prepull_done", "image_prepull_ended")):
            out.append("image pre-pull (the kubelet pulling the serving image)")
        if "gpus_wait_started" in tl and not any(k in tl for k in ("gpus_advertised", "gpus_wait_ended")):
            out.append("GPUs not advertised: device plugin (the Node's allocatable nvidia.com/gpu)")
    elif row.phase == WARM:
        out.append("the controller to lift the startup taint (the node reported Warm)")
    elif row.phase == SERVING:
        out.append("nothing from nodewarm: the taint is lifted; the vLLM pods are the scheduler's to place")
    elif row.phase == COLD:
        out.append("the node's weights copy to complete (labelled warm=cold: the vLLM pod streams the model or "
                   "waits for the copy) and a cold first compile")
    elif row.phase == KEPT:
        out.append(f"the node to turn Warm, or someone to act: {row.reason}: {row.message}")
    elif row.phase == FAILED:
        out.append(f"nothing: the agent reported Warm=False ({row.reason}: {row.message})")
    elif row.phase == UNTAINTED:
        out.append("nothing from nodewarm: the taint was removed by someone else")
    if row.deadline_left_s is not None:
        then = {"untaint": "untaint (cold)", "replace": "replace the node", "keep": "keep the taint"}.get(
            row.on_deadline, row.on_deadline)
        if row.deadline_left_s > 0:
            out.append(f"deadline in {fmt_duration(row.deadline_left_s)} then {then}")
        else:
            out.append(f"deadline passed {fmt_duration(-row.deadline_left_s)} ago: the controller will {then}")
    return out


def _events(events: list[dict], claim: dict | None, node: dict | None, limit: int) -> list[EventLine]:
    want = set()
    if node is not None:
        want.add(("Node", node["metadata"]["name"]))
    if claim is not None:
        want.add(("NodeClaim", claim["metadata"]["name"]))
    out = []
    for e in events:
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
    by_pool = _profiles(obs)
    for claim, node in _pairs(obs):
        if name not in ((node or {}).get("metadata", {}).get("name"), (claim or {}).get("metadata", {}).get("name")):
            continue
        pool = _label(claim, NODEPOOL_LABEL) or _label(node, NODEPOOL_LABEL)
        prof = by_pool.get(pool)
        row = _row(claim, node, prof, now)
        notes = []
        if prof is None:
            notes.append(f"no WarmProfile manages NodePool {pool or '(none)'}: no deadline known")
        elif prof.cleanup:
            notes.append(held_note(prof))
        if node is not None and _ann(node, LAUNCH_FAILURE_ANNOTATION):
            notes.append(f"launch failure recorded: {_ann(node, LAUNCH_FAILURE_ANNOTATION)}")
        if node is not None and _ann(node, CACHE_REASON_ANNOTATION):
            notes.append(f"compile cache: {row.cache} ({_ann(node, CACHE_REASON_ANNOTATION)})")
        if node is not None and _ann(node, IMAGE_ANNOTATION):
            notes.append(f"image pre-pull: {_ann(node, IMAGE_ANNOTATION)}")
        if node is not None and _ann(node, GPUS_ANNOTATION):
            notes.append(f"GPUs: {_ann(node, GPUS_ANNOTATION)}")
        return Explanation(row, _steps(claim, node, row), _waits_for(claim, node, row, now),
                           _events(obs.events, claim, node, events_limit), notes)
    return None


# --------------------------------------------------------------------------------------------------- output

COLUMNS = (("NAME", lambda r: r.name), ("PROFILE", lambda r: r.profile), ("PHASE", lambda r: r.phase),
           ("FOR", lambda r: fmt_duration(r.in_phase_s)), ("WEIGHTS", lambda r: r.weights.text()),
           ("CACHE", lambda r: r.cache), ("REASON", lambda r: r.reason or "-"),
           ("DEADLINE", lambda r: r.deadline_text()))
WIDE = (("NODECLAIM", lambda r: r.node_claim or "-"), ("INSTANCE-TYPE", lambda r: r.instance_type or "-"),
        ("GENERATION", lambda r: r.generation or "-"), ("IMAGE", lambda r: r.image or "-"),
        ("GPUS", lambda r: r.gpus or "-"))


def table(cells: list[list[str]]) -> str:
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells)


def format_rows(rs: list[Row], wide: bool = False) -> str:
    cols = COLUMNS + (WIDE if wide else ())
    return table([[h for h, _ in cols]] + [[f(r) for _, f in cols] for r in rs])


def _clock(t: float | None, ref: float | None) -> str:
    if t is None:
        return "-"
    from datetime import datetime, timezone

    s = datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S.%f")[:-3]
    return s + (f" (+{t - ref:.1f}s)" if ref is not None and t >= ref else "")


def format_explanation(x: Explanation) -> str:
    r = x.row
    lines = [f"Node:        {r.node or '<none yet>'}", f"NodeClaim:   {r.node_claim or '-'}",
             f"Profile:     {r.profile or '-'}" + (f" (deadline {r.deadline}, onDeadline={r.on_deadline})"
                                                   if r.deadline else "")
             + (f" deleted, clean-up held: {r.cleanup}" if r.cleanup else ""),
             f"Phase:       {r.phase} for {fmt_duration(r.in_phase_s)}",
             f"Reason:      {r.reason or '-'}" + (f": {r.message}" if r.message else ""),
             f"Weights:     {r.weights.text()}", f"Cache:       {r.cache}",
             f"Deadline:    {r.deadline_text()}" + (" left" if (r.deadline_left_s or 0) > 0 else "")]
    if r.instance_type or r.generation or r.gpus:
        lines.append(f"Instance:    {r.instance_type or '-'}  generation {r.generation or '-'}  GPUs {r.gpus or '-'}")
    lines.append("")
    lines.append("Waiting for:")
    lines += [f"  - {w}" for w in x.waits_for] or ["  - nothing"]
    lines.append("")
    lines.append("Timeline (UTC; + from the first step):")
    ref = next((s.start for s in x.steps if s.start is not None), None)
    if x.steps:
        cells = [["STEP", "START", "END", "TOOK", "OUTCOME"]]
        for s in x.steps:
            took = fmt_secs(s.end - s.start) if s.start is not None and s.end is not None else "-"
            cells.append([s.what, _clock(s.start, ref), _clock(s.end, ref), took, s.outcome or "-"])
        lines += ["  " + line for line in table(cells).splitlines()]
    else:
        lines.append("  (nothing recorded yet)")
    if x.notes:
        lines.append("")
        lines.append("Notes:")
        lines += [f"  - {n}" for n in x.notes]
    lines.append("")
    lines.append("Events (last, oldest first):")
    if x.events:
        cells = [["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]]
        cells += [[_clock(e.time, None), e.type, e.reason, e.object, e.message[:160]] for e in x.events]
        lines += ["  " + line for line in table(cells).splitlines()]
    else:
        lines.append("  <none>")
    return "\n".join(lines)


def held_note(p: ProfileView) -> str:
    return (f"WarmProfile {p.name} is deleted; its clean-up is held ({CLEANUP_CONDITION}={p.cleanup}), so it still "
            f"gates NodePool {p.node_pool}: {p.cleanup_message}")


def held_notes(rs: list[Row], obs: Observed) -> list[str]:
    """One line per held profile among the rows: what its clean-up waits for and how to finish it."""
    shown = {r.profile for r in rs if r.cleanup}
    return [held_note(p) for p in _profiles(obs).values() if p.name in shown]


def fmt_secs(s: float) -> str:
    return f"{s:.1f}s" if s < 60 else fmt_duration(s)


# --------------------------------------------------------------------------------------------------- I/O shell

def api_client_from(kubeconfig: str | None):
    """--kubeconfig, else $KUBECONFIG / ~/.kube/config, else in-cluster: a user's command, so files first."""
    from kubernetes import client, config

    from nodewarm.api.errors import NodewarmError

    cfg = client.Configuration()
    # $KUBECONFIG read now (the client reads it once, at import); a list of files is merged as kubectl does.
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    try:
        if path:
            config.load_kube_config(config_file=path, client_configuration=cfg)
        else:
            try:
                config.load_kube_config(client_configuration=cfg)
            except (config.ConfigException, OSError):
                config.load_incluster_config(client_configuration=cfg)
    except (config.ConfigException, OSError) as e:
        raise NodewarmError(f"cannot load cluster credentials ({e}); pass --kubeconfig FILE or set $KUBECONFIG",
                            "NoCredentials") from None
    return client.ApiClient(cfg)


def observe(api_client, node: str | None = None, profile: str | None = None) -> Observed:
    """List what `status` reads, paginated: the WarmProfiles, then only the Nodes and NodeClaims of their NodePools
    (a label selector: a 5,000-node cluster's other nodes are never sent). Events only for one node: they are
    the explanation's, not the table's."""
    from nodewarm.controller.kube import EVENTS, NODECLAIMS, NODES, WARMPROFILES, Kube

    k = Kube(api_client, request_timeout_s=60.0)

    def all_items(res, namespace=None, **q) -> list[dict]:
        items, cont = [], None
        while True:
            page = k.list(res, namespace, limit=500, **({"continue": cont} if cont else {}), **q)
            items += page.get("items") or []
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                return items

    profiles = all_items(WARMPROFILES)
    pools = sorted({p.node_pool for p in _profiles(Observed([], [], profiles)).values()
                    if not profile or p.name == profile})
    if not pools:
        return Observed(nodes=[], claims=[], profiles=profiles)
    selector = f"{NODEPOOL_LABEL} in ({','.join(pools)})"
    obs = Observed(nodes=all_items(NODES, labelSelector=selector), claims=all_items(NODECLAIMS, labelSelector=selector),
                   profiles=profiles)
    if node is not None:
        names = {node}
        for c, n in _pairs(obs):
            if node in ((n or {}).get("metadata", {}).get("name"), (c or {}).get("metadata", {}).get("name")):
                names |= {x["metadata"]["name"] for x in (c, n) if x is not None}
        for name in sorted(names):
            obs.events.extend(all_items(EVENTS, EVENTS_NAMESPACE, fieldSelector=f"involvedObject.name={name}"))
    return obs


def run(args: argparse.Namespace) -> int:
    from kubernetes.client.exceptions import ApiException

    from nodewarm.api.errors import NodewarmError

    api = api_client_from(args.kubeconfig)
    try:
        obs = observe(api, args.node, args.profile)
    except ApiException as e:
        hint = " (needs list on nodes, nodeclaims, warmprofiles and events: see `nodewarm status --help`)" \
            if e.status in (401, 403) else ""
        raise NodewarmError(f"cannot read the cluster: {e.status} {e.reason}{hint}", "ApiError") from None
    now = time.time()
    if args.node:
        x = explain(obs, args.node, now)
        if x is None:
            print(f"nodewarm: no NodeClaim or Node named {args.node} in a WarmProfile's NodePool", file=sys.stderr)
            return 1
        print(json.dumps(x.to_dict(), indent=1) if args.output == "json" else format_explanation(x))
        return 0
    rs = rows(obs, now, args.profile)
    if args.profile and not any((p.get("metadata") or {}).get("name") == args.profile for p in obs.profiles):
        print(f"nodewarm: no WarmProfile named {args.profile}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps({"items": [r.to_dict() for r in rs]}, indent=1))
    elif not rs:
        print("No nodes of a WarmProfile's NodePool" + (f" (profile {args.profile})" if args.profile else "") + ".")
    else:
        print(format_rows(rs, wide=args.output == "wide"))
        for note in held_notes(rs, obs):
            print(f"\n{note}")
    return 0


EPILOG = """\
phases: Launching -> Registering -> Warming -> Warm -> Untainted(serving); past readiness.deadline:
DeadlineUntaint(cold) or DeadlineKeep; Failed (the agent reported Warm=False); Replacing (being deleted).
WEIGHTS shows bytes done/total while the agent pulls (it writes them at most every 30s), the size once pulled.
CACHE: hit/miss once serving proves it, cold at warm time, restored while a restored bundle awaits proof.
A deleted WarmProfile whose clean-up is held (its startup taint stays in the NodePool while removing it would
replace live nodes) still gates its pool: its nodes show under it, and a note under the table says why and how
to finish (JSON: "cleanup" on each row).

examples:
  nodewarm status                               # every node of every WarmProfile
  nodewarm status --profile qwen3-35b -o wide   # + NodeClaim, instance type, generation, image, GPUs
  nodewarm status ip-10-0-7-12.ec2.internal     # one node: timeline, what it waits for, its Events
  nodewarm status -o json | jq '.items[] | select(.phase=="Warming")'

read-only; the identity needs (ClusterRole):
  nodes, nodeclaims.karpenter.sh, warmprofiles.nodewarm.io: list
  events: list in namespace default (only for `status NODE`)
"""


def register(sub) -> None:
    p = sub.add_parser("status", help="where each warming node stands (phase, weights, cache, deadline)",
                       description="Show each node of a WarmProfile's NodePool: its phase, how long it has been in "
                                   "it, weights progress, compile cache, reason and the deadline left; or explain "
                                   "one node. Reads the cluster only.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("node", nargs="?", help="a Node (or NodeClaim) name: explain that one")
    p.add_argument("--profile", "-p", help="only this WarmProfile's nodes")
    p.add_argument("-o", "--output", choices=("wide", "json"), help="wide: more columns; json: machine-readable")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster)")
    p.set_defaults(func=run)
