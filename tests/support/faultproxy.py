"""A small HTTP-aware TCP proxy in front of the local S3 server that injects faults, for tests.

Point AWS_ENDPOINT_URL at ``proxy.endpoint``. Each request is parsed (method, path, query, headers),
recorded, and handed to ``proxy.rule(request) -> Action | None``; None forwards it untouched. SigV4 still
verifies: the server checks the signature against the Host header the client signed (the proxy's).

Actions: ``Reply(status, code, headers)`` answers with an S3 error without asking the server; ``Reset(after)``,
``Truncate(after)`` and ``Stall(after, seconds)`` forward the request and then, ``after`` bytes into the
response body, send a TCP RST, close cleanly, or go silent. ``Trickle(rate)`` relays at a crawl and
``Corrupt(at)`` flips one body byte.
``Hook(fn)`` runs ``fn(request)`` (e.g. delete the object) and then forwards. ``Headers(set, drop)``
forwards and rewrites the response's headers (e.g. what an SSE-KMS object's HEAD says).
"""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import parse_qs, urlsplit


@dataclass
class Request:
    method: str
    path: str
    query: dict
    headers: dict  # lower-case names

    @property
    def is_get(self) -> bool:
        # A ranged GET of object bytes (not a listing, which is also a GET)
        return self.method == "GET" and "range" in self.headers

    def key(self) -> str:
        return self.path.split("/", 2)[2] if self.path.count("/") >= 2 else ""


@dataclass
class Reply:
    status: int
    code: str
    message: str = "injected by faultproxy"
    headers: dict = field(default_factory=dict)


@dataclass
class Reset:
    after: int = 0


@dataclass
class Truncate:
    after: int = 0


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


_REASONS = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 500: "Internal Server Error",
            503: "Service Unavailable"}


@dataclass
class FaultProxy:
    upstream: str  # http://127.0.0.1:PORT
    rule: Callable[[Request], object] = lambda req: None
    requests: list[Request] = field(default_factory=list)
    body_bytes: int = 0  # response body bytes relayed for ranged GETs

    def __post_init__(self):
        u = urlsplit(self.upstream)
        self._up = (u.hostname, u.port)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.endpoint = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._lock = threading.Lock()
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
                u = urlsplit(target)
                req = Request(method, u.path, parse_qs(u.query, keep_blank_values=True), headers)
                with self._lock:
                    self.requests.append(req)
                action = self.rule(req)
                if isinstance(action, Reply):
                    xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{action.code}</Code>'
                           f"<Message>{action.message}</Message></Error>").encode()
                    extra = "".join(f"{k}: {v}\r\n" for k, v in action.headers.items())
                    conn.sendall(f"HTTP/1.1 {action.status} {_REASONS.get(action.status, 'Error')}\r\n"
                                 f"Content-Type: application/xml\r\nContent-Length: {len(xml)}\r\n{extra}\r\n"
                                 .encode() + xml)
                    continue
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

    def _forward(self, conn: socket.socket, head: bytes, body: bytes, req: Request, action) -> bool:
        """Relay one exchange; False when the client connection must end (fault or server close)."""
        up = socket.create_connection(self._up)
        try:
            # One upstream connection per request, closed by the server: the response ends at EOF, so
            # no need to parse chunked framing.
            up.sendall(head + b"\r\nConnection: close\r\n\r\n" + body)
            resp = b""
            while b"\r\n\r\n" not in resp:
                chunk = up.recv(65536)
                if not chunk:
                    return False
                resp += chunk
            rhead, rest = resp.split(b"\r\n\r\n", 1)
            # Keep the client's connection alive: drop the server's "Connection: close".
            rlines = [l for l in rhead.split(b"\r\n") if not l.lower().startswith(b"connection:")]
            if isinstance(action, Headers):
                gone = {n.lower().encode() for n in (*action.drop, *action.set)}
                rlines = [rlines[0]] + [l for l in rlines[1:] if l.split(b":", 1)[0].strip().lower() not in gone]
                rlines += [f"{k}: {v}".encode() for k, v in action.set.items()]
            conn.sendall(b"\r\n".join(rlines) + b"\r\n\r\n")
            sent = 0
            data = rest
            while True:
                if data:
                    data = self._apply(conn, data, sent, action, req)
                    if data is None:
                        return False
                    conn.sendall(data)
                    sent += len(data)
                    if req.is_get:
                        with self._lock:
                            self.body_bytes += len(data)
                data = up.recv(262144)
                if not data:
                    return True
        finally:
            up.close()

    def _apply(self, conn: socket.socket, data: bytes, sent: int, action, req: Request) -> bytes | None:
        if isinstance(action, Corrupt) and sent <= action.at < sent + len(data):
            i = action.at - sent
            return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        if isinstance(action, Trickle):
            # Slow but never silent: only a low-speed limit catches this, not a read timeout.
            for i in range(0, len(data), 4096):
                if self._stop.wait(4096 / action.bytes_per_s):
                    return None
                conn.sendall(data[i:i + 4096])
            return b""
        if isinstance(action, (Reset, Truncate, Stall)) and sent + len(data) > action.after:
            keep = data[:max(0, action.after - sent)]
            if keep:
                conn.sendall(keep)
            if isinstance(action, Reset):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            elif isinstance(action, Stall):
                self._stop.wait(action.seconds)
            return None
        return data


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
