"""The plan for the profile's models on this node (pure; modelset.py carries it out): which models the node should
hold and in what order, which folders the pods on the node use, and which folders may not make room for a model.

"A pod on the node uses it" counts the users of the models, never the agent itself: on the DaemonSet path (Auto
Mode, Bottlerocket) the agent's own pod mounts the whole NVMe root, and so does, for a moment during a rolling update,
the DaemonSet's older pod. Those are recognised exactly (``AgentPods``), never by a label a user's pod could copy;
any other pod that mounts the root, or a folder holding a model, keeps that model.

When a model does not fit, only models that matter less may make room: folders no current model of the profile
uses (an old generation, a model taken out of the profile), then models of lower priority, least recently used
first (store.plan_eviction); never a required model, one a pod mounts, or one of equal or higher priority (which
would only be pulled back, evicting this one in turn).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from nodewarm.api import models as api_models
from nodewarm.api.agentpod import PodRef, daemonset_name
from nodewarm.api.generation import generation
from nodewarm.api.servingspec import serving_spec
from nodewarm.api.warmprofile import WarmProfile

from .. import profilesource
from . import store
from .warmer import Model


@dataclass(frozen=True)
class Target:
    """One model the node should hold: a view of the profile (api.models), where its weights go, how it ranks."""

    view: WarmProfile
    dest: Path
    generation: str
    required: bool
    priority: int

    @property
    def name(self) -> str:
        return self.view.name

    @property
    def model(self) -> Model:
        return Model(self.name, self.view.model.uri, self.dest, self.generation, serving_spec(self.view), self.required,
                     self.priority)


def targets(p: WarmProfile, mount: Path) -> tuple[Target, ...]:
    """Every model of profile ``p`` in the order the node warms them (api.models.views), the first model first."""
    return tuple(Target(v, profilesource.on_mount(v, mount), generation(v), api_models.required(p, v),
                        api_models.priority(p, v))
                 for v in api_models.views(p))


@dataclass(frozen=True)
class AgentPods:
    """What makes a pod on this node the node agent's own, not a user of the models (api.agentpod): the pod this
    agent runs in (the downward API's namespace, name and uid), and the pods the agent's DaemonSet controls, in the
    namespace it is rendered in (an older agent pod during the DaemonSet's rolling update). A pod's controller
    reference names an owner in the pod's own namespace, so only who may create pods in that namespace could make
    one look owned by the DaemonSet; labels prove nothing (any pod may copy them). Neither is known on AL2023, where
    the agent is a host service: then no pod is the agent's."""

    own: PodRef | None = None
    daemonset: tuple[str, str] | None = None      # (namespace, name)

    def recognise(self, pod: dict) -> bool:
        md = pod.get("metadata") or {}
        if self.own is not None and (md.get("namespace"), md.get("name"), md.get("uid")) == (
                self.own.namespace, self.own.name, self.own.uid):
            return True
        if self.daemonset is None or md.get("namespace") != self.daemonset[0]:
            return False
        return any(ref.get("controller") is True and ref.get("kind") == "DaemonSet"
                   and (ref.get("apiVersion") or "").split("/")[0] == "apps" and ref.get("name") == self.daemonset[1]
                   for ref in md.get("ownerReferences") or ())


def agent_pods(p: WarmProfile, own: PodRef | None) -> AgentPods:
    """The agent's pods on this node for profile ``p``: ``own`` (None on AL2023) and the DaemonSet that
    userdata.daemonset renders for the profile's NodePool, in its bootstrap namespace."""
    return AgentPods(own, (p.bootstrap.namespace, daemonset_name(p.nodes.node_pool)))


def used_folders(pods: list[dict], cache_mount: str, mount: Path, agent: AgentPods = AgentPods()) -> set[Path]:
    """The folders on this node's NVMe (``mount``, the host's ``cache_mount``) that a pod not finished mounts by
    hostPath, the node agent's own pods (``agent``) left out: a model folder is in use when one of these is it,
    inside it, or holds it."""
    out = set()
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or agent.recognise(pod):
            continue
        for vol in (pod.get("spec") or {}).get("volumes") or ():
            path = ((vol or {}).get("hostPath") or {}).get("path")
            if not path:
                continue
            try:
                rel = PurePosixPath(path).relative_to(cache_mount)
            except ValueError:
                continue
            out.add(Path(mount) / rel)
    return out


def in_use(folder: Path, used: set[Path]) -> bool:
    return any(u == folder or folder in u.parents or u in folder.parents for u in used)


def protected(target: Target, wanted: tuple[Target, ...], used: set[Path],
              held: list[store.Held]) -> dict[Path, str]:
    """Folders that may not make room for ``target``, each with why (pure)."""
    keep: dict[Path, str] = {target.dest: "being pulled"}
    for t in wanted:
        if t.required:
            keep.setdefault(t.dest, "required")
        elif t.priority >= target.priority and t.name != target.name:
            keep.setdefault(t.dest, f"priority {t.priority} >= {target.priority}")
    for h in held:
        if in_use(h.path, used):
            keep.setdefault(h.path, "in use by a pod on this node")
    return keep
