"""The engine check's plan for one node: which check pod to create, which to delete, and what to tell. Pure.

A node's check pods are found by the profile's labels and the node annotation the controller puts on each pod;
the pod for the node's current Request is ``enginecheck.pod_name(profile, node, id)``. What the annotation says
decides:

* a Request, the startup taint still on: that request's pod exists (created if not), every other is deleted;
* an Outcome: every pod of the node is deleted; the one that answered is told as EngineCheckPassed/Failed
  (the Event carries the reason, the message and the engine's last log lines), counted by outcome and reason;
* anything else (no annotation, an unreadable one, a Request on a node whose taint is gone, a node being
  deleted or gone): every pod of the node is deleted, nothing more is asked for.

Pods already being deleted are left to finish; the pod of the current request that is still terminating is not
created again until it is gone (the plan asks to look again shortly).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from nodewarm.api import enginecheck as contract
from nodewarm.api.decisions import EventReason
from nodewarm.api.views import NodeView
from nodewarm.api.warmprofile import WarmProfile

from ..events import EventSpec

# An Event's message is cut at 1024 characters by the recorder (events.py); the log tail is fitted below this so
# that what is cut is the oldest lines, never the last ones.
EVENT_MESSAGE_BUDGET = 1000
# How soon a request whose pod is still terminating is looked at again (the controller does not watch pods).
TERMINATING_RECHECK_S = 5.0

# nodewarm_engine_checks_total's outcomes (not_started: the shell's, when the pod cannot be created).
STARTED, PASSED, FAILED, SUPERSEDED, NODE_GONE = "started", "passed", "failed", "superseded", "node_gone"
NOT_STARTED = "not_started"


@dataclass(frozen=True)
class CheckPod:
    """A check pod as the plan reads it."""
    name: str
    namespace: str
    uid: str
    node: str                       # NODE_ANNOTATION: the Node it was created for
    request_id: str                 # REQUEST_ID_ANNOTATION: the request it answers
    deleting: bool

    @classmethod
    def from_obj(cls, o: dict) -> "CheckPod":
        md = o["metadata"]
        ann = md.get("annotations") or {}
        return cls(md["name"], md.get("namespace", ""), md.get("uid", ""), ann.get(contract.NODE_ANNOTATION, ""),
                   ann.get(contract.REQUEST_ID_ANNOTATION, ""), bool(md.get("deletionTimestamp")))


@dataclass(frozen=True)
class Plan:
    node: str
    create: str | None = None                         # the request id to create the pod for
    delete: tuple[CheckPod, ...] = ()
    events: tuple[EventSpec, ...] = ()                # after the writes succeed
    counters: tuple[tuple[str, str], ...] = ()        # (outcome, reason) of nodewarm_engine_checks_total
    timings: tuple[tuple[str, float], ...] = ()       # (boot | first_token, seconds) of a passed check
    requeue_after: float | None = None


def _reason_label(reason: str) -> str:
    """Only the contract's reasons reach a metric label (an odd annotation must not mint series)."""
    return reason if reason in {r.value for r in contract.Reason} else "unknown"


def _fmt_s(v: float | None) -> str:
    return f"{v:.1f}s" if v is not None else "?"


def outcome_message(o: contract.Outcome, pod: str) -> str:
    """The Event's message: what the agent recorded, and for a failure the engine's last lines, as many of the
    last ones as fit the budget."""
    if o.state == contract.State.PASSED:
        head = (f"vLLM served on this node ({o.reason}): booted in {_fmt_s(o.boot_s)}, first token "
                f"{_fmt_s(o.first_token_s)} after ready" + (f", compile cache {o.compile_cache}" if o.compile_cache
                                                            else "") + f"; pod {pod} deleted")
        return head[:EVENT_MESSAGE_BUDGET]
    head = f"{o.reason}: {o.message}" + (f" (compile cache {o.compile_cache})" if o.compile_cache else "")
    head = f"{head[:EVENT_MESSAGE_BUDGET // 2]}; pod {pod} deleted"
    tail: list[str] = []
    room = EVENT_MESSAGE_BUDGET - len(head) - len("\nengine's last lines:")
    for line in reversed(o.log_tail):
        line = line[:200]
        if room - len(line) - 1 < 0:
            break
        tail.insert(0, line)
        room -= len(line) + 1
    return head + ("\nengine's last lines:\n" + "\n".join(tail) if tail else "")


def _node_event(node: NodeView, reason: str, message: str, type_: str = "Normal") -> EventSpec:
    return EventSpec("Node", node.name, node.uid, reason, message, type_)


def plan(node_name: str, node: NodeView | None, p: WarmProfile, taint_key: str, pods: list[CheckPod]) -> Plan:
    """``node`` None: the Node is gone. ``taint_key``: the startup taint gating it (lifecycle.gating_taint).
    ``pods``: the profile's check pods (any node's; this node's are picked here)."""
    mine = [x for x in pods if x.node == node_name]
    live = tuple(x for x in mine if not x.deleting)
    if node is None or node.deleting:
        return Plan(node_name, delete=live, counters=((NODE_GONE, ""),) * bool(live))
    ann = contract.read_annotation(node.annotations.get(contract.REQUEST_ANNOTATION))

    def superseded(stale: tuple[CheckPod, ...], why: str) -> tuple[EventSpec, ...]:
        return tuple(_node_event(node, EventReason.ENGINE_CHECK_SUPERSEDED,
                                 f"deleted engine-check pod {x.namespace}/{x.name} (request {x.request_id}): {why}")
                     for x in stale)

    if isinstance(ann, contract.Request) and node.has_taint(taint_key):
        stale = tuple(x for x in live if x.request_id != ann.id)
        current = [x for x in mine if x.request_id == ann.id]
        events = superseded(stale, f"the node asks for request {ann.id} now")
        counters = ((SUPERSEDED, ""),) * len(stale)
        if any(x.deleting for x in current):
            return Plan(node_name, delete=stale, events=events, counters=counters,
                        requeue_after=TERMINATING_RECHECK_S)
        if current:
            return Plan(node_name, delete=stale, events=events, counters=counters)
        name = contract.pod_name(p.name, node_name, ann.id)
        started = _node_event(node, EventReason.ENGINE_CHECK_STARTED,
                              f"created engine-check pod {p.serving.namespace}/{name} from PodTemplate "
                              f"{contract.template_name(p.name)} for request {ann.id}: vLLM boots on this node against "
                              f"its weights and compile caches, within {p.readiness.engine_check.timeout}")
        return Plan(node_name, create=ann.id, delete=stale, events=events + (started,),
                    counters=counters + ((STARTED, ""),))
    if isinstance(ann, contract.Outcome):
        answered = tuple(x for x in live if x.request_id == ann.id)
        stale = tuple(x for x in live if x.request_id != ann.id)
        events = superseded(stale, f"the node has the outcome of request {ann.id}")
        counters = ((SUPERSEDED, ""),) * len(stale)
        timings: tuple[tuple[str, float], ...] = ()
        if answered:
            ok = ann.state == contract.State.PASSED
            events += (_node_event(node, EventReason.ENGINE_CHECK_PASSED if ok else EventReason.ENGINE_CHECK_FAILED,
                                   outcome_message(ann, answered[0].name), "Normal" if ok else "Warning"),)
            counters += ((PASSED if ok else FAILED, _reason_label(ann.reason)),)
            if ok:
                timings = tuple((k, float(s)) for k, s in (("boot", ann.boot_s), ("first_token", ann.first_token_s))
                                if isinstance(s, (int, float)) and s >= 0)
        return Plan(node_name, delete=answered + stale, events=events, counters=counters, timings=timings)
    why = (f"{taint_key} is off the node" if isinstance(ann, contract.Request)
           else f"the node no longer asks for a check ({contract.REQUEST_ANNOTATION} absent or unreadable)")
    return Plan(node_name, delete=live, events=superseded(live, why), counters=((SUPERSEDED, ""),) * len(live))


def bound_pod(template: dict, p: WarmProfile, node: NodeView, request_id: str) -> dict:
    """The check pod for ``request_id`` on ``node``, from the live PodTemplate: its name and the annotations the
    plan finds it by, owned by the Node (the garbage collector deletes it with the node), and bound to the node by
    required node affinity on metadata.name, as DaemonSet pods are: the scheduler still places it, so the node's
    GPUs and its taints are accounted."""
    tmpl = copy.deepcopy(template.get("template") or {})
    md = tmpl.get("metadata") or {}
    spec = tmpl.get("spec") or {}
    affinity = spec.setdefault("affinity", {})
    affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node.name]}]}]}}
    labels = {**(md.get("labels") or {}), **contract.labels(p.name)}
    annotations = {**(md.get("annotations") or {}), contract.REQUEST_ID_ANNOTATION: request_id,
                   contract.NODE_ANNOTATION: node.name}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": contract.pod_name(p.name, node.name, request_id), "namespace": p.serving.namespace,
                         "labels": labels, "annotations": annotations,
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node.name,
                                              "uid": node.uid}]},
            "spec": spec}
