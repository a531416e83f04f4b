"""The kube-apiserver's side of the fault proxy (nodewarm_dev/testenv/faultproxy.py): the faults a controller must survive,
each armed for the next matching request and recorded in ``injected`` as (kind, request target) when it fires.

* ``drop_watch(part, after_events)``: the next watch on a matching target is cut after N events (a connection
  closed mid-stream, as when an API server restarts or an LB idles out);
* ``gone_watch(part)``: the next watch on a matching target gets the API server's real answer to a compacted
  resourceVersion: HTTP 200 and one ERROR event with a 410 Status;
* ``conflict_patch(part)``: the next PATCH on a matching target gets 409 Conflict;
* ``gone_continue(part)``: the next list page on a matching target (a ``continue`` token) gets 410 Gone, as when
  the snapshot behind the token was compacted;
* ``stall(True)``: every request from now on hangs (no answer) until ``stall(False)``, then its connection is
  closed: a partition between this client and the API server.
Everything else is forwarded byte for byte.
"""

from __future__ import annotations

import json
import threading

from nodewarm_dev.testenv.faultproxy import FaultProxy, Hang, Request, Respond, Truncate

_JSON = {"Content-Type": "application/json"}


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code,
            "message": message}


def _body(code: int, reason: str, message: str) -> bytes:
    return json.dumps(_status(code, reason, message)).encode()


class KubeFaults:
    def __init__(self, upstream: str, ca_file: str):
        self._lock = threading.Lock()
        self._faults: list[tuple[str, str, int]] = []     # (kind, target part, arg)
        self.injected: list[tuple[str, str]] = []
        self._unstalled = threading.Event()
        self._unstalled.set()
        self._proxy = FaultProxy(upstream, ca_file, rule=self._rule)
        self.endpoint = self._proxy.endpoint

    def stop(self) -> None:
        self.stall(False)
        self._proxy.stop()

    def drop_watch(self, part: str, after_events: int = 1) -> None:
        self._arm("drop", part, after_events)

    def gone_watch(self, part: str) -> None:
        self._arm("gone", part)

    def conflict_patch(self, part: str) -> None:
        self._arm("conflict", part)

    def gone_continue(self, part: str) -> None:
        self._arm("gone_continue", part)

    def stall(self, on: bool) -> None:
        if on:
            self._unstalled.clear()
        else:
            self._unstalled.set()

    def _arm(self, kind: str, part: str, arg: int = 0) -> None:
        with self._lock:
            self._faults.append((kind, part, arg))

    def _rule(self, req: Request):
        if not self._unstalled.is_set():
            return Hang(self._unstalled)
        fault = self._take(req)
        if fault is None:
            return None
        kind, arg = fault
        if kind == "drop":
            return Truncate(lines=arg)      # no terminating chunk: a truncated stream
        if kind == "gone":
            event = {"type": "ERROR", "object": _status(410, "Expired", "too old resource version: 1 (2)")}
            return Respond(200, json.dumps(event).encode() + b"\n", _JSON)
        if kind == "conflict":
            return Respond(409, _body(409, "Conflict",
                                      "Operation cannot be fulfilled: the object has been modified (injected)"), _JSON)
        return Respond(410, _body(410, "Expired", "The provided continue parameter is too old (injected)"), _JSON)

    def _take(self, req: Request) -> tuple[str, int] | None:
        target, is_watch = req.target, "watch=true" in req.target
        with self._lock:
            for i, (kind, part, arg) in enumerate(self._faults):
                if part not in target:
                    continue
                page = kind == "gone_continue" and req.method == "GET" and "continue=" in target and not is_watch
                if (kind in ("drop", "gone") and is_watch) or (kind == "conflict" and req.method == "PATCH") or page:
                    del self._faults[i]
                    self.injected.append((kind, target))
                    return kind, arg
        return None
