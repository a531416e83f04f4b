"""A WarmProfile object as the controller caches it (the profile parsed, or why it could not be, and its status),
and the index of the profiles it knows. The manager, shared.py and every reconciler read them, so they live here,
beside the manager, and no feature package is imported from above."""

from __future__ import annotations

from dataclasses import dataclass

from nodewarm.api import lifecycle
from nodewarm.api.errors import NodewarmError
from nodewarm.api.timeutil import parse_time
from nodewarm.api.warmprofile import WarmProfile
from nodewarm.profile import from_dict

from .reflector import Reflector


@dataclass(frozen=True)
class ProfileView:
    """A WarmProfile object as cached: parsed, or the reason it could not be."""

    name: str
    uid: str
    resource_version: str
    generation: int
    created: float
    deleting: bool
    finalizers: tuple[str, ...]
    profile: WarmProfile | None
    error: str
    conditions: tuple[dict, ...]
    injected: dict                  # status.injected: what this profile last injected (pool, class, taint key)

    @classmethod
    def from_obj(cls, o: dict) -> "ProfileView":
        md = o["metadata"]
        doc = {"apiVersion": o.get("apiVersion"), "kind": o.get("kind"), "spec": o.get("spec"),
               "metadata": {k: v for k, v in md.items() if k in ("name", "labels", "annotations")}}
        try:
            p, err = from_dict(doc), ""
        except NodewarmError as e:
            p, err = None, e.one_line()
        status = o.get("status") or {}
        return cls(md["name"], md.get("uid", ""), md.get("resourceVersion", ""), md.get("generation", 0),
                   parse_time(md.get("creationTimestamp")) or 0.0, bool(md.get("deletionTimestamp")),
                   tuple(md.get("finalizers") or ()), p, err, tuple(status.get("conditions") or ()),
                   dict(status.get("injected") or {}))


class ProfileIndex:
    """The profiles the controller knows, in the order they bind a NodePool or NodeClass: the --profile files first,
    then WarmProfile objects oldest first (nodewarm.api.lifecycle), then the deleted ones their clean-up still holds."""

    def __init__(self, static: tuple[WarmProfile, ...], cache: Reflector | None):
        self._static, self._cache = static, cache

    def view(self, name: str) -> ProfileView | None:
        return self._cache.store.get(name) if self._cache is not None else None

    def remember(self, view: ProfileView) -> None:
        """Our own write, into the cache, so the next write of this reconcile carries its resourceVersion."""
        if self._cache is not None:
            self._cache.store[view.name] = view

    def static(self, name: str) -> WarmProfile | None:
        return {p.name: p for p in self._static}.get(name)

    def live(self) -> list[WarmProfile]:
        out = list(self._static)
        if self._cache is not None:
            out += [v.profile for v in lifecycle.live(self._cache.store.values()) if v.profile is not None]
        return out

    def held(self) -> list[WarmProfile]:
        """Deleted WarmProfiles whose clean-up waits (finalizer still on, see cleanup.py): until it finishes they
        keep gating their pool's new nodes, so none is left under a taint nobody lifts."""
        if self._cache is None:
            return []
        return [v.profile for v in lifecycle.held(self._cache.store.values()) if v.profile is not None]

    def for_pool(self, pool: str) -> WarmProfile | None:
        """The live profile bound to ``pool``, else a deleted one still holding its taint there."""
        return next((p for p in self.live() + self.held() if p.nodes.node_pool == pool), None)


def pools_of(*views: ProfileView | None) -> set[str]:
    """The NodePools the given versions of a WarmProfile bind (before and after a change: both pools' nodes)."""
    return {v.profile.nodes.node_pool for v in views if v is not None and v.profile is not None}
