"""The one fault-injecting HTTP/1.1 proxy the tests put in front of a real server: the local S3 server
(support.s3faults: S3 error answers) or the local kube-apiserver (support.kubefaults: broken watches, 410
Gone, 409 Conflict, a partition).

Point the client at ``proxy.endpoint``. Each request is parsed (method, target, headers), recorded, and handed to
``proxy.rule(request) -> action | None``; None forwards it untouched. The upstream may be TLS (``ca_file``); the
client side is plain HTTP with keep-alive. SigV4 still verifies: the request goes upstream with the Host header the
client signed (the proxy's).

Actions: an ``Answer`` (``Reply``, ``Respond``) answers without asking the server; ``Hang(release)`` answers
nothing until ``release`` is set, then closes; ``Hook(fn)`` runs ``fn(request)`` (e.g. delete the object) and then
forwards; ``Headers(set, drop)`` forwards and rewrites the response's headers. The rest forward the request and
act on the response body (its bytes after any chunked framing, as the client reads them): ``Reset(after)``,
``Truncate(after)`` and ``Stall(after, seconds)`` send a TCP RST, close cleanly, or go silent ``after`` bytes in
(``Truncate(lines=n)``: after the n-th line, a watch cut after n events); ``Trickle(rate)`` relays at a crawl and
``Corrupt(at)`` flips one byte.
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import parse_qs, urlsplit


@dataclass
class Request:
    method: str
    target: str    # as sent: path and query
    headers: dict  # lower-case names

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict:
        return parse_qs(urlsplit(self.target).query, keep_blank_values=True)

    @property
    def is_get(self) -> bool:
        # A ranged GET of object bytes (not a listing, which is also a GET)
        return self.method == "GET" and "range" in self.headers

    def key(self) -> str:
        """The object key of a path-style S3 request (/bucket/key)."""
        return self.path.split("/", 2)[2] if self.path.count("/") >= 2 else ""


_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 409: "Conflict", 410: "Gone",
            500: "Internal Server Error", 503: "Service Unavailable"}


class Answer:
    """An action that answers the request itself; the server never sees it."""

    def response(self) -> tuple[int, dict, bytes]:
        raise NotImplementedError


@dataclass
class Respond(Answer):
    status: int
    body: bytes = b""
    headers: dict = field(default_factory=dict)

    def response(self) -> tuple[int, dict, bytes]:
        return self.status, self.headers, self.body


@dataclass
class Hang:
    release: threading.Event
    timeout_s: float = 120.0


@dataclass
class Reset:
    after: int = 0


@dataclass
class Truncate:
    after: int = 0
    lines: int | None = None    # instead of ``after``: end after this many complete lines


@dataclass
class Stall:
    after: int = 0
    seconds: float = 30.0


@dataclass
class Trickle:
    bytes_per_s: int = 100_000


@dataclass
class Corrupt:
    at: int = 0


@dataclass
class Hook:
    fn: Callable[[Request], None]


@dataclass
class Headers:
    set: dict = field(default_factory=dict)    # name -> value, added or replacing
    drop: tuple = ()                           # lower-case names removed


# Hop-by-hop headers of the client's connection: upstream, every request gets its own connection, closed after.
_HOP = (b"connection", b"keep-alive", b"proxy-connection")


@dataclass
class FaultProxy:
    upstream: str  # http(s)://HOST:PORT
    ca_file: str | None = None
    rule: Callable[[Request], object] = lambda req: None
    requests: list[Request] = field(default_factory=list)
    body_bytes: int = 0  # response body bytes relayed for ranged GETs
    # All responses together relay at most this many bytes per second (None: as fast as they come): an S3
    # prefix's or a VPC endpoint's limit, shared by every node behind it (bench/peers.py).
    cap_bps: float | None = None

    def __post_init__(self):
        u = urlsplit(self.upstream)
        self._up = (u.hostname, u.port)
        self._tls = ssl.create_default_context(cafile=self.ca_file) if u.scheme == "https" else None
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.endpoint = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._cap_lock, self._cap_next = threading.Lock(), 0.0
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()

    def gets(self) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.is_get]

    def reset_counters(self) -> None:
        with self._lock:
            self.requests.clear()
            self.body_bytes = 0

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_head(conn: socket.socket, buf: bytes) -> tuple[bytes, bytes] | None:
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            buf += chunk
        head, rest = buf.split(b"\r\n\r\n", 1)
        return head, rest

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while not self._stop.is_set():
                got = self._read_head(conn, buf)
                if got is None:
                    return
                head, buf = got
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:] if ":" in l)}
                length = int(headers.get("content-length", "0"))
                while len(buf) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                body, buf = buf[:length], buf[length:]
                req = Request(method, target, headers)
                with self._lock:
                    self.requests.append(req)
                action = self.rule(req)
                if isinstance(action, Answer):
                    status, extra, data = action.response()
                    hdrs = "".join(f"{k}: {v}\r\n" for k, v in {**extra, "Content-Length": len(data)}.items())
                    conn.sendall(f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n{hdrs}\r\n".encode() + data)
                    continue
                if isinstance(action, Hang):
                    action.release.wait(action.timeout_s)
                    return
                if isinstance(action, Hook):
                    action.fn(req)
                    action = None
                if not self._forward(conn, head, body, req, action):
                    return
        except OSError:
            return
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _connect(self) -> socket.socket:
        up = socket.create_connection(self._up)
        return self._tls.wrap_socket(up, server_hostname=self._up[0]) if self._tls else up

    def _forward(self, conn: socket.socket, head: bytes, body: bytes, req: Request, action) -> bool:
        """Relay one exchange; False when the client connection must end (fault or server close)."""
        up = self._connect()
        try:
            # One upstream connection per request, closed by the server after its answer.
            first, *rest = head.split(b"\r\n")
            kept = [l for l in rest if l.split(b":", 1)[0].strip().lower() not in _HOP]
            up.sendall(b"\r\n".join([first, *kept, b"Connection: close"]) + b"\r\n\r\n" + body)
            resp = b""
            while b"\r\n\r\n" not in resp:
                chunk = _recv(up, 65536)
                if not chunk:
                    return False
                resp += chunk
            rhead, rest_ = resp.split(b"\r\n\r\n", 1)
            # Keep the client's connection alive: drop the server's "Connection: close".
            rlines = [l for l in rhead.split(b"\r\n") if l.split(b":", 1)[0].strip().lower() not in _HOP]
            if isinstance(action, Headers):
                gone = {n.lower().encode() for n in (*action.drop, *action.set)}
                rlines = [rlines[0]] + [l for l in rlines[1:] if l.split(b":", 1)[0].strip().lower() not in gone]
                rlines += [f"{k}: {v}".encode() for k, v in action.set.items()]
            chunked = any(l.lower().startswith(b"transfer-encoding:") and b"chunked" in l.lower() for l in rlines[1:])
            conn.sendall(b"\r\n".join(rlines) + b"\r\n\r\n")
            sent, lines_seen = 0, 0
            for data in (_dechunk(up, rest_) if chunked else _until_eof(up, rest_)):
                out = self._apply(data, sent, lines_seen, action)
                piece, ok = out
                if piece:
                    self._send(conn, piece, chunked, action)
                    if req.is_get:
                        with self._lock:
                            self.body_bytes += len(piece)
                if not ok:
                    if isinstance(action, Reset):
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    elif isinstance(action, Stall):
                        self._stop.wait(action.seconds)
                    return False
                sent += len(data)
                lines_seen += data.count(b"\n")
            if chunked:
                conn.sendall(b"0\r\n\r\n")
            return True
        finally:
            up.close()

    def _send(self, conn: socket.socket, piece: bytes, chunked: bool, action) -> None:
        frame = (lambda b: b"%x\r\n%s\r\n" % (len(b), b)) if chunked else (lambda b: b)
        if isinstance(action, Trickle):
            # Slow but never silent: only a low-speed limit catches this, not a read timeout.
            for i in range(0, len(piece), 4096):
                if self._stop.wait(4096 / action.bytes_per_s):
                    raise OSError("proxy stopped")
                conn.sendall(frame(piece[i:i + 4096]))
            return
        if self.cap_bps:
            for i in range(0, len(piece), 64 * 1024):
                chunk = piece[i:i + 64 * 1024]
                self._take(len(chunk))
                conn.sendall(frame(chunk))
            return
        conn.sendall(frame(piece))

    def _take(self, n: int) -> None:
        """Wait for ``n`` bytes' turn under cap_bps: the connections queue for one shared line."""
        with self._cap_lock:
            now = time.monotonic()
            start = max(now, self._cap_next)
            self._cap_next = start + n / self.cap_bps
        if start > now and self._stop.wait(start - now):
            raise OSError("proxy stopped")

    @staticmethod
    def _apply(data: bytes, sent: int, lines_seen: int, action) -> tuple[bytes, bool]:
        """What of ``data`` (body bytes ``sent`` onwards) reaches the client, and whether the exchange goes on."""
        if isinstance(action, Corrupt) and sent <= action.at < sent + len(data):
            i = action.at - sent
            return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:], True
        if isinstance(action, Truncate) and action.lines is not None:
            end = -1
            for _ in range(action.lines - lines_seen):
                end = data.find(b"\n", end + 1)
                if end < 0:
                    return data, True
            return data[:end + 1], False
        if isinstance(action, (Reset, Truncate, Stall)) and sent + len(data) > action.after:
            return data[:max(0, action.after - sent)], False
        return data, True


def _recv(up: socket.socket, n: int) -> bytes:
    try:
        return up.recv(n)
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
        return b""              # a TLS server that closes without close_notify: the end all the same


def _until_eof(up: socket.socket, first: bytes):
    data = first
    while True:
        if data:
            yield data
        data = _recv(up, 262144)
        if not data:
            return


def _dechunk(up: socket.socket, buf: bytes):
    """The body of a chunked response, chunk by chunk as it arrives (a watch stream's events)."""
    def fill(need: bytes | int) -> bool:
        nonlocal buf
        while (need not in buf) if isinstance(need, bytes) else (len(buf) < need):
            more = _recv(up, 65536)
            if not more:
                return False
            buf += more
        return True

    while True:
        if not fill(b"\r\n"):
            return
        line, buf = buf.split(b"\r\n", 1)
        size = int(line.split(b";", 1)[0], 16)
        if size == 0:
            return
        if not fill(size + 2):
            return
        data, buf = buf[:size], buf[size + 2:]
        yield data


def first_n(n: int, action, match: Callable[[Request], bool] = lambda r: r.is_get):
    """A rule applying ``action`` to the first ``n`` matching requests, then passing everything."""
    lock = threading.Lock()
    left = [n]

    def rule(req: Request):
        if not match(req):
            return None
        with lock:
            if left[0] <= 0:
                return None
            left[0] -= 1
        return action

    return rule
