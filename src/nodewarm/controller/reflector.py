"""List + watch one resource into a local cache, client-go reflector style.

* list in pages (``limit``/``continue``, one consistent snapshot), then watch from the list's
  resourceVersion (with bookmarks, so the resume point stays fresh). A page of 250 realistic Nodes
  (~30 KB each, mostly their image lists) is ~7 MB of JSON; one unpaginated list of 5,000 was ~150 MB
  of JSON and several times that parsed, all alive at once;
* each object is projected (``view_fn``) as it arrives and the raw dict dropped: the store and the
  handlers only ever see the trimmed views;
* an expired ``continue`` token (410 mid-list) restarts the list;
* a dropped or timed-out watch resumes from the last resourceVersion seen — no re-list, no lost event;
* 410 Gone (the resume point fell out of the server's watch window) re-lists, and objects that vanished
  in between are reported as deleted, so handlers see every deletion;
* a resource the cluster does not serve (404: e.g. no Auto Mode NodeClass CRD) counts as synced and
  empty, and is retried slowly.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from nodewarm import logs

from .kube import Kube, Resource

Handler = Callable[[str, Any, Any], None]     # (event type, old view | None, new view | None)


class Reflector:
    def __init__(self, kube: Kube, res: Resource, view_fn: Callable[[dict], Any], handler: Handler,
                 watch_timeout_s: int = 300, absent_retry_s: float = 30.0, page_size: int = 250,
                 key_fn: Callable[[dict], str] | None = None):
        self.kube, self.res, self.view_fn, self.handler = kube, res, view_fn, handler
        # The store's key: the name (cluster-scoped kinds); namespace/name for a namespaced kind listed cluster-wide.
        self.key_fn = key_fn or (lambda o: o["metadata"]["name"])
        self.page_size = page_size
        self.pages = 0              # list requests sent, all pages of all (re)lists
        self.watch_timeout_s, self.absent_retry_s = watch_timeout_s, absent_retry_s
        self.store: dict[str, Any] = {}
        self.synced = threading.Event()
        self.resource_version = ""
        self.lists = 0              # how often we (re)listed; tests read it to prove a 410 re-listed
        self.watch_starts = 0
        self.served = True
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None
        self.log = logs.get("controller.reflector")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"reflector-{self.res.plural}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()

    def join(self, timeout_s: float = 5) -> None:
        if self._thread:
            self._thread.join(timeout_s)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        backoff = 0.2
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                self._watch_once()
                backoff = 0.2
            except ApiException as e:
                if e.status == 410:
                    self.log.info("watch.expired", resource=self.res.plural, rv=self.resource_version)
                    need_list = True
                    continue
                if e.status == 404:
                    self._absent()
                    need_list = True
                    self._stop.wait(self.absent_retry_s)
                    continue
                self.log.warning("watch.error", resource=self.res.plural, status=e.status, reason=e.reason)
                need_list = need_list or e.status in (401, 403, 500)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10)
            except Exception as e:   # connection refused/reset, truncated stream: resume from last rv
                if self._stop.is_set():
                    break
                self.log.warning("watch.dropped", resource=self.res.plural, error=type(e).__name__, rv=self.resource_version)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10)

    def _absent(self) -> None:
        if self.served:
            self.log.warning("resource.not_served", resource=f"{self.res.plural}.{self.res.group}")
        self.served = False
        for name, old in list(self.store.items()):
            del self.store[name]
            self.handler("DELETED", old, None)
        self.synced.set()

    def _list(self) -> None:
        seen: set[str] = set()
        token, rv = None, ""
        while True:
            try:
                doc = self.kube.list(self.res, limit=self.page_size, **{"continue": token})
            except ApiException as e:
                if e.status == 410 and token:
                    # The snapshot behind the continue token was compacted: start the list over.
                    self.log.info("list.restarted", resource=self.res.plural)
                    seen.clear()
                    token = None
                    continue
                raise
            self.pages += 1
            for obj in doc.pop("items", None) or ():
                name = self.key_fn(obj)
                seen.add(name)
                self._apply("MODIFIED" if name in self.store else "ADDED", obj)
            meta = doc.get("metadata") or {}
            rv = meta.get("resourceVersion", rv)
            token = meta.get("continue")
            if not token:
                break
        self.lists += 1
        self.served = True
        for name in [n for n in self.store if n not in seen]:
            old = self.store.pop(name)
            self.handler("DELETED", old, None)
        self.resource_version = rv
        self.synced.set()

    def _apply(self, kind: str, obj: dict) -> None:
        name = self.key_fn(obj)
        old = self.store.get(name)
        if kind == "DELETED":
            self.store.pop(name, None)
            self.handler("DELETED", old, self.view_fn(obj))
            return
        new = self.view_fn(obj)
        self.store[name] = new
        if old != new:
            self.handler(kind if old is not None else "ADDED", old, new)

    def _watch_once(self) -> None:
        w = watch.Watch()
        self._watch = w
        self.watch_starts += 1
        try:
            # watch_fn has no return annotation, so Watch yields plain dicts (no model deserialisation) and
            # still turns an ERROR event into ApiException (410 included); deserialize=False would skip that.
            for ev in w.stream(self.kube.watch_fn(self.res), resource_version=self.resource_version,
                               timeout_seconds=self.watch_timeout_s, allow_watch_bookmarks=True):
                if self._stop.is_set():
                    return
                obj = ev.get("object") or {}
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if ev["type"] != "BOOKMARK":
                    self._apply(ev["type"], obj)
                if rv:
                    self.resource_version = rv
        finally:
            self._watch = None


def wait_synced(reflectors: list[Reflector], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    for r in reflectors:
        if not r.synced.wait(max(0.0, deadline - time.monotonic())):
            return False
    return True

