"""Following the pods bound to this node, with the agent's own identity: list once, then watch, until a verdict.

The image pre-pull wait and the engine check both wait on a pod the kubelet runs on this node. The agent may read
pods only as the node (the Node authorizer wants ``spec.nodeName=<node>`` in the field selector) or as the
DaemonSet's ServiceAccount (a Role in that namespace), and a scale-up of 1,000 nodes must not poll the API server:
so one list, then watches of at most ``WATCH_WINDOW_S``, resumed where they ended, relisted on 410.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

from nodewarm import logs

from .profilesource import _request, watch_events

log = logs.get("bootstrap.podwatch")

T = TypeVar("T")
# Longest single watch: ``stop`` is honoured between events and at the latest when a watch ends.
WATCH_WINDOW_S = 15


@dataclass
class Followed(Generic[T]):
    """How a follow ended: ``answer`` when ``look`` gave one; else the pods as last seen and the last transient
    API error, if the time ran out on one."""
    answer: T | None
    pods: dict[str, dict] = field(default_factory=dict)
    last_error: str | None = None
    stopped: bool = False


class _Gone(Exception):
    """The watch's resume point left the server's window (410): list again."""


def name_of(pod: dict) -> str:
    return (pod.get("metadata") or {}).get("name", "")


def _path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


def _watch(api_client, path: str, query: list, resource_version: str, window_s: int):
    """Events (type, object) from ``resource_version`` until the server ends the watch after ``window_s``."""
    q = query + [("watch", "true"), ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(window_s))]
    yield from watch_events(_request(api_client, "GET", path, q, timeout=(5, window_s + 10), stream=True))


def follow(api_client, namespace: str, query: list, look: Callable[[dict[str, dict]], T | None], *,
           left: Callable[[], float], stop: threading.Event, what: str, logger=log, path: str | None = None,
           **fields) -> Followed[T]:
    """Keep the pods matching ``query`` (name -> object) current until ``look(pods)`` answers, ``left()`` reaches 0
    or ``stop`` is set. ``path`` follows another collection the same way (the peers' Nodes: /api/v1/nodes). ``what`` names the caller's log events (``<what>.watch``, ``<what>.api_error``, with
    ``fields``, on the caller's ``logger``). A refusal (401/403/404) is raised as the ApiException for the caller to word; other errors
    (connection, 5xx) are retried with a short back-off until the time is up."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    path = path or _path(namespace)
    pods: dict[str, dict] = {}
    rv = ""                 # resume point of the watch; empty: list first
    last_error: str | None = None
    backoff = 1.0
    while True:
        if stop.is_set():
            return Followed(None, pods, last_error, stopped=True)
        if left() <= 0:
            return Followed(None, pods, last_error)
        try:
            if not rv:
                listed = _request(api_client, "GET", path, query)
                pods = {name_of(p): p for p in listed.get("items") or ()}
                rv = (listed.get("metadata") or {}).get("resourceVersion", "")
                answer = look(pods)
                if answer is not None:
                    return Followed(answer, pods)
            window = max(1, math.ceil(min(left(), WATCH_WINDOW_S)))
            logger.info(f"{what}.watch", **fields, resource_version=rv, window_s=window)
            with contextlib.closing(_watch(api_client, path, query, rv, window)) as events:
                for kind, obj in events:
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise _Gone()
                        raise ApiException(status=obj.get("code", 500), reason=obj.get("message"))
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if kind == "DELETED":
                        pods.pop(name_of(obj), None)
                    elif kind in ("ADDED", "MODIFIED"):
                        pods[name_of(obj)] = obj
                    answer = look(pods)
                    if answer is not None:
                        return Followed(answer, pods)
                    if stop.is_set():
                        break
            last_error, backoff = None, 1.0
            continue
        except _Gone:
            rv = ""
            continue
        except ApiException as e:
            if e.status in (401, 403, 404):
                raise
            last_error = f"{e.status} {' '.join(str(e.reason).split())}"[:300]
        except (OSError, ValueError, urllib3.exceptions.HTTPError) as e:
            last_error = f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]
        logger.warning(f"{what}.api_error", **fields, error=last_error)
        rv = ""
        stop.wait(min(backoff, max(0.0, left())))
        backoff = min(backoff * 2, 5.0)
