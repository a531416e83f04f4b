"""Many models on one profile's nodes (docs/models.md): each model's *view*, its Node label, and the agent's report.

A profile's first model is ``spec.model``; ``spec.models`` adds more. Each further model is served exactly as a
profile of its own would be (its Deployment, Service, folder on the NVMe, compile-cache key, generation), so this
module gives it a *view*: the profile with that model in place of ``spec.model`` and ``<profile>-<name>`` as its name.
Everything that already derives from a profile (api.generation, api.podlayout, api.servingspec, the vLLM render,
the agent's pull) then derives from the view and cannot disagree with the rest.

What differs is readiness. The first model keeps ``nodewarm.io/generation`` (the agent reports it, the controller
sets it as it lifts the taint), so a profile with one model renders and behaves exactly as before. A further model's
label is ``models.nodewarm.io/<view name>=<generation>``, set and removed by the controller only, from what the agent
reports in ``names.MODELS_ANNOTATION`` (the agent's identity stays as narrow as before: nodes/status only).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from .names import GENERATION_LABEL, MODEL_LABEL_PREFIX
from .warmprofile import WarmProfile

# What a model's entry in the agent's report may say (HeldModel.state).
PULLING, WARM, EVICTING, FAILED = "pulling", "warm", "evicting", "failed"
STATES = (PULLING, WARM, EVICTING, FAILED)
# The reason a model the node should hold reports when it does not fit even after eviction.
NO_CAPACITY = "NoCapacity"


def view_name(profile: str, model: str) -> str:
    return f"{profile}-{model}"


def views(p: WarmProfile) -> tuple[WarmProfile, ...]:
    """The profile's models in the order a node warms them: the first model, then the other required ones, then the
    rest; by priority (higher first), then name, within each. The first element is ``p`` itself."""
    extra = sorted(p.models, key=lambda e: (not e.required, -e.priority, e.name))
    return (p,) + tuple(
        replace(p, name=view_name(p.name, e.name), model=e.model, models=(), parent=p.name,
                serving=replace(p.serving, replicas=e.replicas))
        for e in extra)


def is_extra(v: WarmProfile) -> bool:
    """A view of one of ``spec.models`` (not the profile's first model)."""
    return v.parent is not None


def required(p: WarmProfile, v: WarmProfile) -> bool:
    """Whether the startup taint waits for view ``v`` of profile ``p`` (and it is never evicted)."""
    if not is_extra(v):
        return True
    return next(e.required for e in p.models if view_name(p.name, e.name) == v.name)


# The first model's rank: above any spec.models[*].priority (the schema's maximum is 1000).
FIRST_MODEL_PRIORITY = 1 << 30


def priority(p: WarmProfile, v: WarmProfile) -> int:
    """View ``v``'s rank when room is short: a model may only evict models of a lower one
    (bootstrap/modelcache/plan.py)."""
    if not is_extra(v):
        return FIRST_MODEL_PRIORITY
    return next(e.priority for e in p.models if view_name(p.name, e.name) == v.name)


def label_key(v: WarmProfile) -> str:
    """The Node label that says the node holds view ``v`` verified; its value is ``generation(v)``, and the view's
    Deployment requires it."""
    return held_label_key(v.parent or v.name, v.name)


def held_label_key(profile: str, name: str) -> str:
    """label_key by names: what a reader of a node's report has (`nodewarm status`), not the profile's views."""
    return GENERATION_LABEL if name == profile else f"{MODEL_LABEL_PREFIX}{name}"


@dataclass(frozen=True)
class HeldModel:
    """One model in the agent's report on its Node (names.MODELS_ANNOTATION, a JSON list of these).

    ``generation`` is what the node holds verified and may be labelled with: it is set only while ``state`` is
    ``warm`` (or ``evicting``: the label goes first, then the files). ``pending`` is a generation being pulled beside
    it or that failed (a roll), with ``reason``/``message`` saying why when it failed."""

    name: str                   # the view's name
    state: str                  # one of STATES
    generation: str = ""
    key: str = ""               # api.generation.model_key: the weights' folder on the NVMe
    bytes: int = 0
    required: bool = False
    priority: int = 0
    last_used: str = ""         # RFC 3339: the last time a pod on the node was seen using it (else when it warmed)
    pending: str = ""
    reason: str = ""
    message: str = ""


def encode(models: list[HeldModel] | tuple[HeldModel, ...]) -> str:
    return json.dumps([{k: v for k, v in asdict(m).items() if v not in ("", 0, False) or k in ("name", "state")}
                       for m in models], separators=(",", ":"))


def decode(text: str | None) -> dict[str, HeldModel]:
    """The report by view name; entries that are not well formed are left out (an annotation is free text)."""
    try:
        doc = json.loads(text or "[]")
    except ValueError:
        return {}
    out = {}
    for e in doc if isinstance(doc, list) else ():
        try:
            m = HeldModel(**{k: e[k] for k in HeldModel.__dataclass_fields__ if k in e})
        except (TypeError, KeyError):
            continue
        if isinstance(m.name, str) and m.state in STATES:
            out[m.name] = m
    return out


def wanted_labels(p: WarmProfile, report: dict[str, HeldModel], labels: dict[str, str]) -> dict[str, str | None]:
    """The label changes (key -> value, None: remove) that make a node of profile ``p`` say what its agent reports:
    each further model of the profile reported warm is labelled with the generation it holds verified (during a roll
    the old one, until the agent has verified the new one and reports it); a model evicting, gone, failed, or no
    longer in the profile loses its label. Only ``models.nodewarm.io/<p>-*`` keys are touched."""
    want: dict[str, str] = {}
    for v in views(p)[1:]:
        m = report.get(v.name)
        if m is not None and m.state == WARM and m.generation:
            want[label_key(v)] = m.generation
    mine = f"{MODEL_LABEL_PREFIX}{p.name}-"
    changes: dict[str, str | None] = {k: None for k in labels if k.startswith(mine) and k not in want}
    changes.update({k: val for k, val in want.items() if labels.get(k) != val})
    return changes
