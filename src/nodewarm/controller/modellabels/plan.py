"""Model labels: one Node label per further model of a profile (nodewarm/api/models.py), set and removed from what the
node agent reports on its Node in nodewarm.io/models. Pure; the reconciler (controller.py) carries the plan out.

* A model reported warm is labelled ``models.nodewarm.io/<profile>-<name>`` = the generation it holds verified; a roll
  switches the value when the agent reports the new generation verified (models.wanted_labels decides all of it).
* A model reported evicting, failed, pulling or no longer reported, or gone from the profile, loses its label at once:
  the agent deletes an evicting model's files only after its Node has lost the label (and no pod uses the model).
* While the profile's startup taint is on, labels are only removed, never set: a label the model's pods select, set
  while the taint still keeps them off, sends them into the scheduler's back-off (nodewarm/bootstrap/nodestatus.py).
  The write that lifts the taint sets them instead (``lift_changes``, nodeclaim/plan.py), like the generation label.
* A model that failed with NoCapacity is told on the Node once per message: the controller remembers what it told.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nodewarm.api import models
from nodewarm.api.names import MODEL_LABEL_PREFIX, MODELS_ANNOTATION
from nodewarm.api.views import NodeView
from nodewarm.api.warmprofile import WarmProfile

from ..events import EventSpec
from ..nodepatch import identity_guard, remove_map_ops, set_map_ops

# nodewarm_model_labels_total{action}
LABEL, SWITCH, UNLABEL, NO_CAPACITY = "label", "switch", "unlabel", "no_capacity"
# Event reasons, on the Node.
MODEL_LABELED, MODEL_UNLABELED, MODEL_NO_CAPACITY = "ModelLabeled", "ModelUnlabeled", "ModelNoCapacity"


@dataclass(frozen=True)
class Change:
    model: str              # the model's view name, <profile>-<name>
    key: str
    value: str | None       # None: the label goes
    was: str                # "" when the node did not carry it
    why: str

    @property
    def action(self) -> str:
        return UNLABEL if self.value is None else SWITCH if self.was else LABEL


@dataclass(frozen=True)
class Plan:
    node: str
    changes: tuple[Change, ...] = ()        # written now, in ``ops``
    deferred: tuple[Change, ...] = ()       # set by the write that lifts the startup taint
    ops: tuple[dict, ...] = ()              # the JSON patch, conditional on the Node's resourceVersion
    no_capacity: dict[str, str] = field(default_factory=dict)   # model -> its NoCapacity message, all of them now
    told: tuple[str, ...] = ()              # of those, the ones whose message was not told yet


def report(node: NodeView) -> dict[str, models.HeldModel]:
    return models.decode(node.annotations.get(MODELS_ANNOTATION))


def _why(p: WarmProfile, m: models.HeldModel | None, name: str, value: str | None) -> str:
    if value is not None:
        pending = f"; {m.pending} pending beside it" if m.pending else ""
        return f"the node reports it warm, generation {m.generation} verified{pending}"
    if name not in {v.name for v in models.views(p)[1:]}:
        return f"no longer in WarmProfile {p.name}'s spec.models"
    if m is None:
        return "the node no longer reports it"
    if m.state == models.EVICTING:
        return "the node evicts it: its files go once the label is off and no pod uses the model"
    if m.state == models.FAILED:
        return f"the node reports it failed ({m.reason}: {m.message})"
    return f"the node reports it {m.state}, not verified"


def changes(p: WarmProfile, node: NodeView, labels: dict[str, str]) -> tuple[Change, ...]:
    """models.wanted_labels, each change with the model it is about and why."""
    held = report(node)
    out = []
    for key, value in sorted(models.wanted_labels(p, held, labels).items()):
        name = key.removeprefix(MODEL_LABEL_PREFIX)
        out.append(Change(name, key, value, labels.get(key, ""), _why(p, held.get(name), name, value)))
    return tuple(out)


def lift_changes(p: WarmProfile, node: NodeView) -> tuple[Change, ...]:
    """The labels the write that lifts the taint sets: every further model reported warm at that moment (nothing of
    them is set while the taint is on, so each is new)."""
    return changes(p, node, {})


def no_capacity(node: NodeView) -> dict[str, str]:
    return {m.name: m.message for m in report(node).values()
            if m.state == models.FAILED and m.reason == models.NO_CAPACITY}


def plan(p: WarmProfile, node: NodeView, taint_key: str, told: dict[str, str]) -> Plan:
    """The node's label changes (only removals while ``taint_key`` is on) in one patch that applies only to the Node
    as read, and the NoCapacity failures not told yet (``told``: model -> the message told last)."""
    every = changes(p, node, node.model_labels)
    tainted = node.has_taint(taint_key)
    now = tuple(c for c in every if c.value is None or not tainted)
    ops: tuple[dict, ...] = ()
    if now:
        sets = {c.key: c.value for c in now if c.value is not None}
        ops = tuple(identity_guard(node, with_version=True)
                    + (set_map_ops(node.any_labels, "/metadata/labels", sets) if sets else [])
                    + remove_map_ops("/metadata/labels", [c.key for c in now if c.value is None]))
    failing = no_capacity(node)
    return Plan(node.name, now, tuple(c for c in every if c not in now), ops, failing,
                tuple(m for m, msg in sorted(failing.items()) if told.get(m) != msg))


def change_event(node: NodeView, c: Change, how: str = "") -> EventSpec:
    if c.value is None:
        return EventSpec("Node", node.name, node.uid, MODEL_UNLABELED,
                         f"model {c.model} generation {c.was}: removed label {c.key}{how}: {c.why}")
    was = f" (was {c.was})" if c.was else ""
    return EventSpec("Node", node.name, node.uid, MODEL_LABELED,
                     f"model {c.model} generation {c.value}: labelled {c.key}={c.value}{was}{how}: {c.why}")


def no_capacity_event(node: NodeView, model: str, message: str) -> EventSpec:
    m = report(node).get(model)
    gen = (m.pending or m.generation) if m is not None else ""
    return EventSpec("Node", node.name, node.uid, MODEL_NO_CAPACITY,
                     f"model {model}" + (f" generation {gen}" if gen else "") + " does not fit on the node even after "
                     f"evicting what it may ({models.NO_CAPACITY}): {message}", "Warning")
