"""A WarmProfile's models as tests read them back: one of its model views by short name, where a node holds it, and
the model labels the controller put on a Node (nodewarm.api.models names them)."""

from __future__ import annotations

from pathlib import Path

from nodewarm import profile
from nodewarm.api import models
from nodewarm.api.names import MODEL_LABEL_PREFIX
from nodewarm.bootstrap.modelcache import plan
from nodewarm.controller.kube import NODES


def model_labels(k, node: str) -> dict[str, str]:
    return {key: val for key, val in (k.get(NODES, node)["metadata"].get("labels") or {}).items()
            if key.startswith(MODEL_LABEL_PREFIX)}


def view(doc: dict, name: str):
    """The model ``name`` of profile ``doc`` (``spec.models[].name``) as a model view."""
    p = profile.from_dict(doc)
    return next(x for x in models.views(p) if x.name == f"{p.name}-{name}")


def folder(doc: dict, mount: Path, view_name: str) -> Path:
    """Where the node holds the model ``view_name`` of profile ``doc`` at its generation in ``doc``."""
    return {t.name: t.dest for t in plan.targets(profile.from_dict(doc), mount)}[view_name]
