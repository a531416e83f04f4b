"""Peers before S3, the serving side: byte ranges of this node's model files for the other nodes of its profile.

A peer asks ``GET /v1/objects/<rel path>?etag=<etag>`` with one closed ``Range`` and a signed ``Authorization``
(auth.py). The signature is checked before anything else, so a request without it learns nothing, not even
which files exist. What may be served is exactly the manifests' objects (a ``Holdings`` per model folder, a ``Shelf``
of them for every model the node serves), by path and ETag: a traversal, nodewarm's own ``.nodewarm/`` files or
anything else under DEST is simply not one of them (404). A
verified file serves any range; a file still being pulled serves only the parts its journal lists (s3pull.py writes
a journal line after the part's bytes are in the page cache), anything else there is 416. Every file is opened
under DEST without following a link (confined.py): DEST's subfolders are not ours alone to trust.

The bytes are not vouched for: the asking node verifies them against S3's checksums like S3's own (fetch.py),
so a part lost in a host crash and still journaled costs that node a refetch, never a wrong file.

The server listens on one address only (the node's InternalIP, never a wildcard), serves at most
``max_connections`` connections at once (one more gets 503 at once rather than a queue: the asking node tries
another source) and sends at most ``max_bytes_per_s`` over all of them, so serving peers never starves this node's
own pull or vLLM of the network.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import socket
import socketserver
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable
from urllib.parse import parse_qs, unquote, urlsplit

from nodewarm import logs

from .. import confined
from ..confined import UnsafePath
from ..weights.manifest import RemoteObject, local_rel_path
from ..weights.partial import JOURNAL_SUFFIX, PART_SUFFIX, PARTIAL_DIR, parse_journal
from ..weights.throttle import TokenBucket
from . import auth
from .auth import PREFIX, PeerAuthFailed, PeerKeys

log = logs.get("bootstrap.weights.peers")

MiB = 1024**2
# The most one write sends: small enough that the shared bandwidth is split fairly between connections.
SEND_CHUNK = 1 * MiB
# A keep-alive connection with no request for this long is closed, so an idle client cannot hold a slot forever.
IDLE_TIMEOUT_S = 30.0
# How long a refused connection may take to send us the rest of its request before it is closed; reading it first
# lets the 503 reach the client instead of a reset.
REFUSE_DRAIN_S = 1.0
_RANGE = re.compile(r"bytes=(\d{1,19})-(\d{1,19})")



class Holdings:
    """What this node may serve: the manifest's objects, which of them are verified at dest/<rel>, thread-safe."""

    def __init__(self, dest: Path):
        self.dest = Path(dest)
        self._lock = threading.Lock()
        self._objects: dict[str, RemoteObject] = {}
        self._verified: set[str] = set()

    def set_objects(self, objects: Iterable[RemoteObject]) -> None:
        """The manifest (replaces the previous one). Nothing of it counts as verified yet: the pull marks each file
        again as it keeps or lands it, and a file of an earlier manifest may be another version."""
        objects = {local_rel_path(o.rel_path): o for o in objects}
        with self._lock:
            self._objects, self._verified = objects, set()

    def mark_verified(self, rel_path: str) -> None:
        """``dest/rel_path`` is in place and verified (called as each file is renamed into place or kept)."""
        with self._lock:
            if rel_path in self._objects:
                self._verified.add(rel_path)

    def lookup(self, rel_path: str, etag: str) -> tuple[RemoteObject, bool] | None:
        """The manifest's object at ``rel_path`` when its ETag is ``etag``, and whether it is verified here."""
        with self._lock:
            obj = self._objects.get(rel_path)
            if obj is None or obj.etag != etag:
                return None
            return obj, rel_path in self._verified

    def find(self, rel_path: str, etag: str) -> tuple[Holdings, RemoteObject, bool] | None:
        """``lookup``, with where: what the server asks of a Holdings or a Shelf alike."""
        found = self.lookup(rel_path, etag)
        return None if found is None else (self, *found)

    def summary(self) -> dict:
        with self._lock:
            return {"files": len(self._verified), "bytes": sum(self._objects[r].size for r in self._verified)}


class Shelf:
    """Every model this node serves, one Holdings per model key. A request names an object by its path and ETag only:
    whichever model holds it serves it, a verified copy first (a roll links a file into two folders)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._models: dict[str, Holdings] = {}

    def put(self, model: str, holdings: Holdings) -> None:
        with self._lock:
            self._models[model] = holdings

    def drop(self, model: str) -> None:
        with self._lock:
            self._models.pop(model, None)

    def get(self, model: str) -> Holdings | None:
        with self._lock:
            return self._models.get(model)

    def find(self, rel_path: str, etag: str) -> tuple[Holdings, RemoteObject, bool] | None:
        with self._lock:
            models = list(self._models.values())
        found = None
        for holdings in models:
            hit = holdings.find(rel_path, etag)
            if hit is not None and hit[2]:
                return hit
            found = found or hit
        return found


class _NotHeld(Exception):
    """The request names nothing this node may serve (404), or a range of it not here yet (416)."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


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
            fd, first, last, size = self._open(rng)
        except _NotHeld as e:
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

    def _open(self, rng: str) -> tuple[int, int, int, int]:
        """An fd of the file that holds the requested range, and the range and object size; else _NotHeld."""
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True, strict_parsing=False)
        if not url.path.startswith(PREFIX) or list(query) != ["etag"] or len(query["etag"]) != 1:
            raise _NotHeld(404, "not an object request")
        rel = unquote(url.path[len(PREFIX):])
        found = self.server.holdings.find(rel, query["etag"][0])
        if found is None:
            raise _NotHeld(404, "not one of the models' objects at that ETag")
        holdings, obj, verified = found
        m = _RANGE.fullmatch(rng)
        if m is None:
            raise _NotHeld(416, "one closed range 'bytes=a-b' is required")
        first, last = int(m[1]), int(m[2])
        if first > last or last >= obj.size:
            raise _NotHeld(416, f"range {first}-{last} is not inside the object's {obj.size} bytes")
        dest = holdings.dest
        if not verified:
            fd = self._open_partial(dest, obj, first, last)
            if fd is not None:
                return fd, first, last, obj.size
            # The pull may have renamed it into place since we looked.
            held = holdings.lookup(rel, obj.etag)
            if held is None or not held[1]:
                raise _NotHeld(404, "neither verified nor being pulled here")
        fd = _open_file(dest, PurePosixPath(obj.rel_path), obj.size)
        if fd is None:
            raise _NotHeld(404, "the verified file is not in place")
        return fd, first, last, obj.size

    def _open_partial(self, dest: Path, obj: RemoteObject, first: int, last: int) -> int | None:
        """An fd of the temp file when its journal lists every part of [first, last]; None when there is no temp
        file; _NotHeld(404) when it is another object version's, _NotHeld(416) when some part is not there yet."""

        rel = PurePosixPath(PARTIAL_DIR) / obj.rel_path
        fd = _open_file(dest, rel.with_name(rel.name + PART_SUFFIX), obj.size)
        if fd is None:
            return None
        try:
            # Read after opening the data: every part the journal lists is in the file this fd reads.
            parts = _journaled_parts(dest, rel.with_name(rel.name + JOURNAL_SUFFIX), obj)
            if parts is None:
                raise _NotHeld(404, "no partial of this object version")
            part_size, done = parts
            need = range(first // part_size, last // part_size + 1)
            # More parts than the journal lists cannot all be there: no walk over a huge range for nothing.
            if len(need) > len(done) or any(i not in done for i in need):
                raise _NotHeld(416, f"parts {need.start}-{need.stop - 1} are not all here yet")
        except BaseException:
            os.close(fd)
            raise
        return fd


def _open_regular(dest: Path, rel: PurePosixPath) -> int | None:
    """An fd of the regular file ``dest/rel``, reached without following a link; else None."""
    try:
        dfd = confined.open_dir(dest, rel.parts[:-1])
    except FileNotFoundError:
        return None
    except UnsafePath as e:
        log.warning("peers.unsafe_path", path=str(rel), why=str(e))
        return None
    try:
        fd = os.open(rel.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            log.warning("peers.unsafe_path", path=str(rel), why="a symlink: not following it")
        return None
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _open_file(dest: Path, rel: PurePosixPath, size: int) -> int | None:
    """``_open_regular`` when the file has the object's size (anything else is not that object's bytes)."""
    fd = _open_regular(dest, rel)
    if fd is not None and os.fstat(fd).st_size != size:
        os.close(fd)
        return None
    return fd


def _journaled_parts(dest: Path, rel: PurePosixPath, obj: RemoteObject) -> tuple[int, set[int]] | None:
    """The journal's part size and listed parts when its header is for ``obj``'s ETag and size; else None."""
    fd = _open_regular(dest, rel)
    if fd is None:
        return None
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace", newline="") as f:
        parsed = parse_journal(f.readlines())
    if parsed is None:
        return None
    header, parts = parsed
    if header.get("etag") != obj.etag or header.get("size") != obj.size:
        return None
    try:
        part_size = int(header["part_size"])
    except (ValueError, TypeError, KeyError):
        return None
    if part_size < 1:
        return None
    return part_size, set(parts)



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
