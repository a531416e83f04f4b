"""NodeClaims, Nodes and WarmProfiles as small typed views, and the record the controller keeps on a Node.

The controller caches these views and plans on them; `nodewarm status` builds the same views from what it lists, so
both read an object one way (nodewarm.api.lifecycle derives where a node stands from them).

Where per-NodeClaim state lives, and why: NodeClaim ``status`` belongs to Karpenter (its status writer
would overwrite our conditions), so the controller records its state in one annotation on the *Node*,
``nodewarm.io/state`` (JSON: times, decision, conditions). The annotation is written in the same JSON
patch that removes the taint, so the decision and its record are atomic: a controller killed at any
point either sees the taint still there (and no record: nothing was done) or the record (done; do
nothing again). Before a decision nothing needs persisting: launched/registered come from the
NodeClaim's own conditions and warm from the Node's condition, so a restarted controller re-derives
them from the cluster. The ``replace`` decision needs no record: the NodeClaim's deletionTimestamp is it.

Views keep only the fields the controller or `status` reads (a realistic Node is ~30 KB of JSON, mostly its image
list; its view is a few hundred bytes), so the informer caches of a 5,000-node cluster stay small.
``resource_version`` rides along for guarded writes but is left out of equality: a change the
controller does not read (a heartbeat, someone's label) must not look like a change.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

from . import defaults
from .decisions import Decision
from .names import CLEANUP_CONDITION, CLEANUP_FINALIZER, MODEL_LABEL_PREFIX, NODEPOOL_LABEL, PROFILE_LABEL, STATE_ANNOTATION, \
    TIMELINE_ANNOTATION, WARM_CONDITION, WARM_GENERATION_ANNOTATION
from .timeutil import fmt_time, parse_time

# Karpenter's NodeClaim lifecycle conditions (kubernetes-sigs/karpenter pkg/apis/v1 nodeclaim_status.go).
LAUNCHED = "Launched"
REGISTERED = "Registered"
INITIALIZED = "Initialized"
# The taint a Karpenter node registers with (AL2023 registerWithTaints, Bottlerocket node-taints). Karpenter's
# registration (pkg/controllers/nodeclaim/lifecycle/registration.go) merges the NodeClaim's taints and startupTaints
# into the Node and only then removes this one, in one write, before it sets Registered=True.
UNREGISTERED_TAINT = "karpenter.sh/unregistered"

# What the agent records as the generation it warmed (nodewarm.api.generation: 16 hex digits).
_GENERATION = re.compile(r"^[0-9a-f]{16}$")


def warm_generation(annotations: dict[str, str]) -> str | None:
    """The generation a node warmed (its agent's annotation) when it is one; an odd value labels nothing."""
    v = annotations.get(WARM_GENERATION_ANNOTATION, "")
    return v if _GENERATION.match(v) else None


@dataclass(frozen=True)
class Condition:
    type: str
    status: str                     # "True" | "False" | "Unknown"
    reason: str
    message: str = ""
    last_transition: float | None = None

    def to_dict(self) -> dict:
        return {"type": self.type, "status": self.status, "reason": self.reason, "message": self.message,
                "lastTransitionTime": fmt_time(self.last_transition)}

    @classmethod
    def from_dict(cls, d: dict) -> "Condition":
        return cls(d.get("type", ""), d.get("status", "Unknown"), d.get("reason", ""), d.get("message", ""),
                   parse_time(d.get("lastTransitionTime")))


def condition(obj: dict, ctype: str) -> Condition | None:
    """The object's ``status.conditions`` entry of that type."""
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == ctype:
            return Condition.from_dict(c)
    return None


def true_at(obj: dict, ctype: str) -> float | None:
    """When the condition turned True, if it is True."""
    c = condition(obj, ctype)
    return c.last_transition if c and c.status == "True" else None


@dataclass(frozen=True)
class ClaimView:
    name: str
    uid: str
    nodepool: str
    provider_id: str
    created: float
    deleting: bool
    launched: float | None          # Launched=True lastTransitionTime
    registered: float | None        # Registered=True lastTransitionTime
    resource_version: str = field(default="", compare=False)
    disrupting: str = ""            # why Karpenter is already taking it down (karpenter_disruption), or ""
    registering: str = ""           # while Registered is not True: its reason and message (RegistrationHookPending..)

    @classmethod
    def from_obj(cls, o: dict) -> "ClaimView":
        md, status = o["metadata"], o.get("status") or {}
        reg = condition(o, REGISTERED)
        return cls(
            name=md["name"], uid=md.get("uid", ""), nodepool=(md.get("labels") or {}).get(NODEPOOL_LABEL, ""),
            provider_id=status.get("providerID", ""), created=parse_time(md.get("creationTimestamp")) or 0.0,
            deleting=bool(md.get("deletionTimestamp")), launched=true_at(o, LAUNCHED),
            registered=true_at(o, REGISTERED), resource_version=md.get("resourceVersion", ""),
            disrupting=karpenter_disruption(o),
            registering="" if reg is None or reg.status == "True" else f"{reg.reason}: {reg.message}".strip(": "),
        )


# How Karpenter marks a NodeClaim it is taking down before the deletion itself (kubernetes-sigs/karpenter):
# the disruption queue (drift, consolidation and, from v1.15, repair as reason Unhealthy) sets the status
# condition DisruptionReason=True with the reason (``pkg/controllers/disruption/queue.go`` markDisrupted) and
# taints the Node karpenter.sh/disrupted:NoSchedule; node repair (``pkg/controllers/node/health``) stamps
# karpenter.sh/nodeclaim-termination-timestamp just before it deletes the NodeClaim.
DISRUPTION_CONDITION = "DisruptionReason"
DISRUPTED_TAINT = "karpenter.sh/disrupted"
TERMINATION_TIMESTAMP_ANNOTATION = "karpenter.sh/nodeclaim-termination-timestamp"


def karpenter_disruption(o: dict) -> str:
    """Why Karpenter is already disrupting this NodeClaim (its DisruptionReason, or repair's termination stamp)."""
    c = condition(o, DISRUPTION_CONDITION)
    if c is not None and c.status == "True":
        return c.reason or DISRUPTION_CONDITION
    if TERMINATION_TIMESTAMP_ANNOTATION in (o["metadata"].get("annotations") or {}):
        return "TerminationScheduled"
    return ""


@dataclass(frozen=True)
class NodeView:
    name: str
    uid: str
    provider_id: str
    created: float
    deleting: bool
    any_labels: bool                # whether metadata.labels exists (JSON-patch paths need it); never read
    nodepool: str                   # karpenter.sh/nodepool: a deleted profile lifts its taint from its pool's nodes
    annotations: dict[str, str]     # only nodewarm.io/* (the rest is not ours to read)
    any_annotations: bool           # whether metadata.annotations exists at all (JSON-patch paths need it)
    taints: tuple[dict, ...]        # exactly as stored: the guarded patch tests them byte for byte
    warm: Condition | None
    resource_version: str = field(default="", compare=False)
    profile: str = ""               # nodewarm.io/profile (the NodePool template's): whose peer key it may read
    # models.nodewarm.io/* (the further models' labels, api/models.py): what is set, so a label changed by anyone
    # else brings the node back to the controller's model-label reconciler
    model_labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_obj(cls, o: dict) -> "NodeView":
        md, spec = o["metadata"], o.get("spec") or {}
        ann = {k: v for k, v in (md.get("annotations") or {}).items() if k.startswith("nodewarm.io/")}
        return cls(
            name=md["name"], uid=md.get("uid", ""), provider_id=spec.get("providerID", ""),
            created=parse_time(md.get("creationTimestamp")) or 0.0, deleting=bool(md.get("deletionTimestamp")),
            any_labels=bool(md.get("labels")), nodepool=(md.get("labels") or {}).get(NODEPOOL_LABEL, ""),
            annotations=ann, any_annotations=bool(md.get("annotations")),
            taints=tuple(spec.get("taints") or ()), warm=condition(o, WARM_CONDITION),
            resource_version=md.get("resourceVersion", ""), profile=(md.get("labels") or {}).get(PROFILE_LABEL, ""),
            model_labels={k: v for k, v in (md.get("labels") or {}).items() if k.startswith(MODEL_LABEL_PREFIX)},
        )

    def has_taint(self, key: str) -> bool:
        return any(t.get("key") == key for t in self.taints)

    @property
    def state(self) -> "WarmState | None":
        raw = self.annotations.get(STATE_ANNOTATION)
        return WarmState.from_json(raw) if raw else None

    @property
    def timeline(self) -> dict[str, str]:
        return self.json_annotation(TIMELINE_ANNOTATION)

    def json_annotation(self, key: str) -> dict:
        """A nodewarm.io/* annotation holding a JSON object; {} when it is missing or anything else."""
        try:
            v = json.loads(self.annotations.get(key, "{}"))
        except ValueError:
            return {}
        return v if isinstance(v, dict) else {}


@dataclass(frozen=True)
class WarmState:
    """The record on the Node (annotation ``nodewarm.io/state``) of what the controller decided."""

    profile: str
    node_claim: str
    decision: Decision              # only DeadlineKeep is not final (a late Warm still lifts the taint)
    launched: str | None = None
    registered: str | None = None
    warm: str | None = None
    decided: str | None = None
    conditions: tuple[Condition, ...] = field(default=())

    def to_json(self) -> str:
        d = asdict(self)
        d["nodeClaim"] = d.pop("node_claim")
        d["conditions"] = [c.to_dict() for c in self.conditions]
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, s: str) -> "WarmState | None":
        try:
            d = json.loads(s)
            return cls(profile=d["profile"], node_claim=d["nodeClaim"], decision=Decision(d["decision"]),
                       launched=d.get("launched"), registered=d.get("registered"), warm=d.get("warm"),
                       decided=d.get("decided"),
                       conditions=tuple(Condition.from_dict(c) for c in d.get("conditions") or ()))
        except (ValueError, KeyError, TypeError):
            # A hand-edited or foreign value (a decision nodewarm never writes included) is not a record of ours:
            # treat the node as undecided.
            return None


@dataclass(frozen=True)
class ProfileMeta:
    """What of a WarmProfile object decides which NodePool it gates and how: readable without the profile's loader
    (nodewarm.profile, which `status` must not import), so even a profile the loader refuses shows its nodes."""

    name: str
    created: float
    deleting: bool
    finalizers: tuple[str, ...]
    node_pool: str
    taint_key: str
    deadline: str
    on_deadline: str
    retired_taint_keys: tuple[str, ...]     # status.injected: keys an earlier spec put on the pool's nodes
    cleanup: Condition | None               # the controller's Cleanup condition on a deleted profile

    @property
    def held(self) -> bool:
        """Deleted, its clean-up still holding it (finalizer on): it keeps gating its pool (lifecycle.binding_order)."""
        return self.deleting and CLEANUP_FINALIZER in self.finalizers

    @classmethod
    def from_obj(cls, o: dict) -> "ProfileMeta":
        md, spec = o["metadata"], o.get("spec") or {}
        r = spec.get("readiness") or {}
        return cls(name=md["name"], created=parse_time(md.get("creationTimestamp")) or 0.0,
                   deleting=bool(md.get("deletionTimestamp")), finalizers=tuple(md.get("finalizers") or ()),
                   node_pool=(spec.get("nodes") or {}).get("nodePool", ""),
                   taint_key=r.get("taintKey", defaults.TAINT_KEY), deadline=r.get("deadline", defaults.DEADLINE),
                   on_deadline=r.get("onDeadline", defaults.ON_DEADLINE),
                   retired_taint_keys=tuple(((o.get("status") or {}).get("injected") or {}).get("retiredTaintKeys")
                                            or ()),
                   cleanup=condition(o, CLEANUP_CONDITION))
