"""What a reconciler watches, declared by the reconciler, as Karpenter's controllers declare theirs
(controller-runtime's ``Watches(source, handler, predicates)``): the manager keeps the caches and routes each event of
a kind to the watches declared for it, in the order they were declared; it knows no feature.

A ``Watch`` names a kind (the ``kube.Resource`` the manager caches), an optional predicate on the event, what the
event enqueues (``map_to_keys``) and, for what a feature does on the event itself (count a metric, forget what it
kept of a deleted object, a log line), ``on_event``. Every callable takes the reflector's arguments: the event type
(ADDED, MODIFIED, DELETED) and the old and new views, either of which may be None.

A ``Reconciler`` adds the key prefixes it reconciles (``routes``: ``claim`` -> its reconcile) and every key it owns
now (``keys``: what a new leader and each periodic resync enqueue).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from .kube import Resource

Event = Callable[[str, Any, Any], None]


def _no_keys(event: str, old: Any, new: Any) -> Iterable[str]:
    return ()


def deleted(event: str, old: Any, new: Any) -> bool:
    return event == "DELETED"


def not_deleted(event: str, old: Any, new: Any) -> bool:
    return event != "DELETED"


@dataclass(frozen=True)
class Watch:
    kind: Resource
    map_to_keys: Callable[[str, Any, Any], Iterable[str]] = _no_keys
    predicate: Callable[[str, Any, Any], bool] | None = None
    on_event: Event | None = None       # runs before the keys are enqueued


class Reconciler(Protocol):
    def watches(self) -> Sequence[Watch]: ...

    def routes(self) -> Mapping[str, Callable[[str], Any]]: ...

    def keys(self) -> Iterable[str]: ...


class Router:
    """The declared watches by kind, and the key prefixes to the reconciles that own them."""

    def __init__(self, reconcilers: Sequence[Reconciler], add: Callable[[str], None]):
        self._add = add
        self._reconcilers = tuple(reconcilers)
        self._watches: dict[Resource, list[Watch]] = {}
        self.routes: dict[str, Callable[[str], Any]] = {}
        for r in self._reconcilers:
            for w in r.watches():
                self._watches.setdefault(w.kind, []).append(w)
            for prefix, fn in r.routes().items():
                if prefix in self.routes:
                    raise ValueError(f"two reconcilers own the keys {prefix}/...")
                self.routes[prefix] = fn

    def route(self, kind: Resource, event: str, old: Any, new: Any) -> None:
        for w in self._watches.get(kind, ()):
            if w.predicate is not None and not w.predicate(event, old, new):
                continue
            if w.on_event is not None:
                w.on_event(event, old, new)
            for key in w.map_to_keys(event, old, new):
                self._add(key)

    def all_keys(self) -> Iterable[str]:
        for r in self._reconcilers:
            yield from r.keys()
