"""Peers before S3, the serving side: byte ranges of this node's model files for the other nodes of its profile.

A peer asks ``GET /v1/objects/<rel path>?etag=<etag>`` with one closed ``Range`` and a signed ``Authorization``
(auth.py). The signature is checked before anything else, so a request without it learns nothing, not even
which files exist. What may be served is exactly the holdings' objects (holdings.py), and of a file still being
pulled only the parts its journal lists (openrange.py).

The bytes are not vouched for: the asking node verifies them against S3's checksums like S3's own (fetch.py),
so a part lost in a host crash and still journaled costs that node a refetch, never a wrong file.

The server listens on one address only (the node's InternalIP, never a wildcard), serves at most
``max_connections`` connections at once (one more gets 503 at once rather than a queue: the asking node tries
another source) and sends at most ``max_bytes_per_s`` over all of them, so serving peers never starves this node's
own pull or vLLM of the network.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Callable

from nodewarm import logs

from ..weights.throttle import TokenBucket
from . import auth
from .auth import PeerAuthFailed, PeerKeys
from .holdings import Holdings, Shelf
from .openrange import NotHeld, open_range

log = logs.get("bootstrap.weights.peers")

MiB = 1024**2
# The most one write sends: small enough that the shared bandwidth is split fairly between connections.
SEND_CHUNK = 1 * MiB
# A keep-alive connection with no request for this long is closed, so an idle client cannot hold a slot forever.
IDLE_TIMEOUT_S = 30.0
# How long a refused connection may take to send us the rest of its request before it is closed; reading it first
# lets the 503 reach the client instead of a reset.
REFUSE_DRAIN_S = 1.0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client reads many ranges over one connection
    timeout = IDLE_TIMEOUT_S
    server_version, sys_version = "nodewarm-peer", ""  # not which Python serves: nothing for a scanner
    server: "_Server"

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass  # the request line and headers are not logged (they carry the signature); _Server logs what matters

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        # The CPU this request's thread spends, for the cost of serving per GB (bench/peers.py): a node that
        # serves peers must leave its cores to the vLLM pod.
        started = time.thread_time()
        try:
            self._get()
        finally:
            self.server.count("cpu_s", time.thread_time() - started)

    def _get(self) -> None:
        srv = self.server
        srv.count("requests")
        rng = self.headers.get("Range", "")
        keys = srv.keys()
        try:
            if keys is None:
                raise PeerAuthFailed("this node has no peer key yet")
            node = auth.verify(keys, self.headers.get("Authorization"), "GET", self.path, rng)
        except PeerAuthFailed as e:
            srv.count("refused_auth")
            log.info("peers.refused_auth", client=self.client_address[0], why=str(e))
            self._reply(401, b"unauthorized\n", {"WWW-Authenticate": auth.SCHEME})
            return
        try:
            fd, first, last, size = open_range(srv.holdings, self.path, rng)
        except NotHeld as e:
            srv.count("not_found" if e.status == 404 else "not_held")
            log.debug("peers.not_served", peer=node, status=e.status, why=str(e))
            self._reply(e.status, b"not found\n" if e.status == 404 else b"range not held\n")
            return
        try:
            self.send_response(206)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.send_header("Content-Length", str(last - first + 1))
            self.end_headers()
            self._send_body(fd, first, last + 1)
        finally:
            os.close(fd)

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_body(self, fd: int, start: int, end: int) -> None:
        off = start
        while off < end:
            n = min(SEND_CHUNK, end - off)
            if not self.server.bucket.take(n):
                self.close_connection = True  # stopping: the client sees a short body and asks elsewhere
                return
            data = os.pread(fd, n, off)
            if len(data) < n:
                # The file shrank under us (a partial restarted): end the response short rather than lie.
                self.close_connection = True
                log.warning("peers.file_shrank", offset=off)
                return
            self.wfile.write(data)
            off += n
            self.server.count("bytes_served", n)


class _Server(socketserver.ThreadingTCPServer):
    """One thread per connection, at most ``max_connections`` of them; the ones open are kept to end them on stop."""

    daemon_threads = True
    block_on_close = False  # stop never waits for a connection; it shuts their sockets instead
    allow_reuse_address = True  # a restarted pull serves again on the profile's port at once

    def __init__(self, address: tuple[str, int], family: int, owner: "PeerServer"):
        self.address_family = family
        self.owner = owner
        self.holdings, self.keys, self.bucket = owner.holdings, owner.keys, owner.bucket
        self.max_connections = owner.max_connections
        self.open: set[socket.socket] = set()
        super().__init__(address, _Handler)

    def count(self, name: str, n: float = 1) -> None:
        self.owner.count(name, n)

    def process_request(self, request, client_address) -> None:
        with self.owner.lock:
            busy = self.owner.stopping.is_set() or len(self.open) >= self.max_connections
            if not busy:
                self.open.add(request)
        if not busy:
            super().process_request(request, client_address)
            return
        self.count("refused_busy")
        log.debug("peers.refused_busy", client=client_address[0], open=self.max_connections)
        threading.Thread(target=_refuse, args=(request,), name="peers-refuse", daemon=True).start()

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.owner.lock:
                self.open.discard(request)

    def handle_error(self, request, client_address) -> None:
        # A client that went away, or a socket stop() shut: the connection ends, the server goes on.
        log.debug("peers.connection_ended", client=client_address[0])

    def close_connections(self) -> None:
        with self.owner.lock:
            conns = list(self.open)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed by its own thread meanwhile


def _refuse(conn: socket.socket) -> None:
    """503 to a connection over the cap: the client asks another source now instead of queueing here."""
    try:
        conn.settimeout(REFUSE_DRAIN_S)
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
                     b"Connection: close\r\n\r\n")
        conn.shutdown(socket.SHUT_WR)
        # Read what the client sent before closing: closing with unread bytes would reset the connection and the
        # client might never see the 503.
        deadline = time.monotonic() + REFUSE_DRAIN_S
        while time.monotonic() < deadline and conn.recv(65536):
            pass
    except OSError:
        pass  # the client is gone already
    finally:
        conn.close()


class PeerServer:
    """Serves ``holdings`` (one model's Holdings, or a Shelf of them) to signed peer requests on ``host:port`` (port 0:
    an ephemeral one, for tests)."""

    def __init__(self, host: str, port: int, holdings: Holdings | Shelf, keys: Callable[[], PeerKeys | None],
                 max_connections: int, max_bytes_per_s: float):
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"peer server host {host!r} is not an IP address: it serves on the node's own "
                             "address only") from None
        if ip.is_unspecified:
            raise ValueError(f"peer server host {host!r} is a wildcard address: it would serve on every interface "
                             "of the node, not only its own address on the node network")
        if max_connections < 1:
            raise ValueError(f"max_connections {max_connections} would refuse every peer")
        self.host, self.port, self.family = host, port, socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        self.holdings, self.keys, self.max_connections = holdings, keys, max_connections
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.bucket = TokenBucket(max_bytes_per_s, time.monotonic, self.stopping.wait)
        self._stats: dict[str, float] = dict.fromkeys(
            ("bytes_served", "requests", "refused_busy", "refused_auth", "not_found", "not_held", "cpu_s"), 0)
        self._server: _Server | None = None

    def start(self) -> "PeerServer":
        self._server = _Server((self.host, self.port), self.family, self)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="peers-serve",
                         daemon=True).start()
        log.info("peers.serving", address=f"{self.address[0]}:{self.address[1]}",
                 max_connections=self.max_connections, max_bytes_per_s=self.bucket.rate)
        return self

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None:
            return self.host, self.port
        return self._server.server_address[0], self._server.server_address[1]

    def count(self, name: str, n: float = 1) -> None:
        with self.lock:
            self._stats[name] += n

    def stats(self) -> dict[str, float]:
        with self.lock:
            return dict(self._stats)

    def stop(self) -> None:
        """Close the listening socket and end every open connection, a response mid-way included. Idempotent."""
        with self.lock:
            if self.stopping.is_set():
                return
            self.stopping.set()  # wakes responses waiting for bandwidth
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server.close_connections()
        log.info("peers.stopped", **self.stats())
