"""Helpers shared by the controller tests: profiles installed on the real API server, a running
controller, polling waits with short timeouts, and a fault-injecting HTTP proxy in front of the
API server (drops watches mid-stream, answers 410 Gone, answers 409 to one PATCH)."""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodewarm import instancetypes, profile
from nodewarm.controller.controller import Controller, ControllerOptions
from nodewarm.controller.kube import (
    AUTOMODE_NODECLASSES, EC2NODECLASSES, EVENTS, NODECLAIMS, NODEPOOLS, NODES, WARMPROFILES, Kube,
)
from nodewarm.nodeclasses import automode, ec2nodeclass, nodepool, render
from support.builders import USER_MIME, v

TAINT = "nodewarm.io/warming"


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def wait_for(check, timeout_s: float = 10.0, what: str = "condition", interval_s: float = 0.03):
    """Poll ``check`` until it returns a truthy value (returned); fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except ApiException as e:
            last = e
        else:
            if last:
                return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def taint_keys(k: Kube, node: str) -> list[str]:
    return [t["key"] for t in k.get(NODES, node)["spec"].get("taints") or ()]


def events_for(k: Kube, kind: str, name: str) -> list[dict]:
    items = k.list(EVENTS, "default", fieldSelector=f"involvedObject.name={name}")["items"]
    return [e for e in items if e["involvedObject"]["kind"] == kind]


class Installed:
    """A WarmProfile with its NodeClass and NodePool, as a user would have them before the controller runs."""

    def __init__(self, k: Kube, mode: str = "karpenter", user_data: str | None = USER_MIME, deadline: str = "20m",
                 on_deadline: str = "untaint", inject_ready: bool = False, create_profile_object: bool = True,
                 user_startup_taints: tuple[dict, ...] = ({"key": "example.com/agent", "effect": "NoExecute"},),
                 manager: str | None = None, **spec):
        """``manager``: the user's objects are server-side applied by that field manager (a GitOps tool)
        instead of created; ``spec``: more profile fields, as for profiles.v (``spec__injection__onLive=...``)."""
        self.k = k
        name = uniq(f"wp{mode[:2]}")
        self.doc = v(mode, metadata__name=name, spec__nodes__nodePool=f"{name}-pool",
                     spec__nodes__nodeClass=f"{name}-class", spec__readiness__deadline=deadline,
                     spec__readiness__onDeadline=on_deadline, **spec)
        self.profile = profile.from_dict(self.doc)
        types = instancetypes.lookup(list(self.profile.nodes.instance_types))
        # The same renderers `nodewarm render` uses (not the whole render: no DaemonSet/vLLM needed here).
        if mode == "automode":
            self.nodeclass = automode.render(self.profile, types)
        else:
            self.nodeclass = ec2nodeclass.render(self.profile, render.node_user_data(self.profile, None)[0])
        self.nodepool = nodepool.render(self.profile)
        self.nc_res = AUTOMODE_NODECLASSES if mode == "automode" else EC2NODECLASSES
        if not inject_ready:
            # What the user had before nodewarm: their own user data, no RAID0 / sizes, their startup taints.
            spec = self.nodeclass["spec"]
            if mode == "automode":
                spec.pop("ephemeralStorage", None)
            else:
                spec.pop("instanceStorePolicy", None)
                spec["userData"] = user_data
                if user_data is None:
                    spec.pop("userData")
            tspec = self.nodepool["spec"]["template"]["spec"]
            tspec["startupTaints"] = [dict(t) for t in user_startup_taints]
            if not user_startup_taints:
                del tspec["startupTaints"]      # unset, not an empty list someone owns
        self.manager = manager
        if manager:
            from nodewarm.kubeapply import apply

            apply(k.api, [self.nodeclass, self.nodepool], field_manager=manager)
        else:
            k.create(self.nc_res, self.nodeclass)
            k.create(NODEPOOLS, self.nodepool)
        self.profile_object = None
        if create_profile_object:
            self.profile_object = k.create(WARMPROFILES, render.warmprofile_document(self.profile))

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def pool(self) -> str:
        return self.profile.nodes.node_pool

    @property
    def node_class(self) -> str:
        return self.profile.nodes.node_class

    def cleanup(self) -> None:
        for c in self.k.list(NODECLAIMS)["items"]:
            if c["metadata"].get("labels", {}).get("karpenter.sh/nodepool") == self.pool:
                _delete(self.k, NODECLAIMS, c["metadata"]["name"], finalized=True)
        for n in self.k.list(NODES)["items"]:
            if n["metadata"].get("labels", {}).get("karpenter.sh/nodepool") == self.pool:
                _delete(self.k, NODES, n["metadata"]["name"], finalized=True)
        if self.profile_object is not None:
            # No controller may be running any more to honour its finalizer.
            try:
                self.k.merge_patch(WARMPROFILES, self.name, {"metadata": {"finalizers": None}})
            except ApiException as e:
                if e.status != 404:
                    raise
            _delete(self.k, WARMPROFILES, self.name)
        _delete(self.k, NODEPOOLS, self.pool)
        _delete(self.k, self.nc_res, self.node_class)


def _delete(k: Kube, res, name: str, finalized: bool = False) -> None:
    """Delete; with ``finalized`` also drop the finalizers (the stand-in's Karpenter is not running)."""
    try:
        k.delete(res, name)
        if finalized:
            k.merge_patch(res, name, {"metadata": {"finalizers": None}})
    except ApiException as e:
        if e.status != 404:
            raise


@contextlib.contextmanager
def installed(k: Kube, **kw):
    inst = Installed(k, **kw)
    try:
        yield inst
    finally:
        inst.cleanup()


def options(**kw) -> ControllerOptions:
    base = dict(watch_timeout_s=20, workers=2, retry_period_s=0.3, lease_duration_s=2, renew_deadline_s=1.5)
    base.update(kw)
    return ControllerOptions(**base)


@contextlib.contextmanager
def running(api_client, **kw):
    c = Controller(api_client, options(**kw)).start()
    try:
        assert c.wait_synced(20), "controller caches did not sync"
        yield c
    finally:
        c.stop()


def client_for(server: str, token: str, ca_file: str | None = None) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = server
    if ca_file:
        cfg.ssl_ca_cert = ca_file
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


class FaultProxy:
    """Plain-HTTP loopback proxy to the API server that can inject the faults a controller must survive.

    * ``drop_watch(path_part, after_events)``: the next watch on a matching path is cut after N events
      (a connection reset mid-stream, as when an API server restarts or an LB idles out);
    * ``gone_watch(path_part)``: the next watch on a matching path gets the API server's real answer to a
      compacted resourceVersion: HTTP 200 and one ERROR event with a 410 Status;
    * ``conflict_patch(path_part)``: the next PATCH on a matching path gets 409 Conflict;
    * ``gone_continue(path_part)``: the next list page on a matching path (a ``continue`` token) gets
      410 Gone, as when the snapshot behind the token was compacted;
    * ``stall(True)``: every request from now on hangs (no answer) until ``stall(False)``, then its
      connection is closed: a partition between this client and the API server.
    Everything else is forwarded byte for byte.
    """

    def __init__(self, upstream: str, ca_file: str):
        u = urlparse(upstream)
        self.host, self.port = u.hostname, u.port
        self.ctx = ssl.create_default_context(cafile=ca_file)
        self._lock = threading.Lock()
        self.faults: list[tuple[str, str, int]] = []     # (kind, path part, arg)
        self.injected: list[tuple[str, str]] = []
        self.watch_requests: list[str] = []
        self._stalled = threading.Event()
        self._unstalled = threading.Event()
        self._unstalled.set()
        self.stalled_requests: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                is_watch = "watch=true" in self.path
                if is_watch:
                    with proxy._lock:
                        proxy.watch_requests.append(self.path)
                if proxy._stalled.is_set():
                    with proxy._lock:
                        proxy.stalled_requests.append(f"{self.command} {self.path}")
                    proxy._unstalled.wait(120)
                    self.close_connection = True
                    return
                fault = proxy._take(self.command, self.path, is_watch)
                if fault and fault[0] == "gone_continue":
                    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
                              "message": "The provided continue parameter is too old (injected)"}
                    return self._send(410, json.dumps(status).encode())
                if fault and fault[0] == "gone":
                    status = {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                          "message": "too old resource version: 1 (2)",
                                                          "reason": "Expired", "code": 410}}
                    return self._send(200, json.dumps(status).encode() + b"\n")
                if fault and fault[0] == "conflict":
                    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
                              "message": "Operation cannot be fulfilled: the object has been modified (injected)"}
                    return self._send(409, json.dumps(status).encode())
                conn = http.client.HTTPSConnection(proxy.host, proxy.port, context=proxy.ctx, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                if not is_watch:
                    data = resp.read()
                    conn.close()
                    return self._send(resp.status, data, resp.getheader("Content-Type", "application/json"))
                self.send_response(resp.status)
                self.send_header("Content-Type", resp.getheader("Content-Type", "application/json"))
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                sent = 0
                try:
                    while True:
                        line = resp.readline()
                        if not line:
                            break
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                        sent += 1
                        if fault and fault[0] == "drop" and sent >= fault[2]:
                            # Cut the connection without the terminating chunk: a truncated stream.
                            self.close_connection = True
                            self.connection.shutdown(2)
                            return
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError, OSError):
                    self.close_connection = True
                finally:
                    conn.close()

            def _send(self, status: int, data: bytes, ctype: str = "application/json"):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _take(self, method: str, path: str, is_watch: bool):
        with self._lock:
            for i, (kind, part, arg) in enumerate(self.faults):
                want_watch = kind in ("drop", "gone")
                page = kind == "gone_continue" and method == "GET" and "continue=" in path and not is_watch
                if part in path and ((want_watch and is_watch) or (kind == "conflict" and method == "PATCH") or page):
                    del self.faults[i]
                    self.injected.append((kind, path))
                    return kind, part, arg
        return None

    def drop_watch(self, path_part: str, after_events: int = 1) -> None:
        with self._lock:
            self.faults.append(("drop", path_part, after_events))

    def gone_watch(self, path_part: str) -> None:
        with self._lock:
            self.faults.append(("gone", path_part, 0))

    def conflict_patch(self, path_part: str) -> None:
        with self._lock:
            self.faults.append(("conflict", path_part, 0))

    def gone_continue(self, path_part: str) -> None:
        with self._lock:
            self.faults.append(("gone_continue", path_part, 0))

    def stall(self, on: bool) -> None:
        if on:
            self._unstalled.clear()
            self._stalled.set()
        else:
            self._stalled.clear()
            self._unstalled.set()

    def pending(self) -> int:
        with self._lock:
            return len(self.faults)

    def stop(self) -> None:
        self.stall(False)
        self.server.shutdown()
        self.server.server_close()


# The WarmProfile conditions the controller writes, read back.
def condition(k, name):
    conds = (k.get(WARMPROFILES, name).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "Injected"), None)


def wait_reason(k, name, reason, timeout_s=15):
    return wait_for(lambda: (c := condition(k, name)) and c["reason"] == reason and c, timeout_s,
                    what=f"Injected reason {reason} (now {condition(k, name)})")


def cleanup_condition(k, name):
    conds = (k.get(WARMPROFILES, name).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "Cleanup"), None)
