"""Ranged GETs whose bodies go from the socket straight into a reused buffer: the pull's transport.

(Over 300 lines, barely: one transport. The connection's setup, its proxy tunnel, the head's parsing and the
bounded body reads share one socket and its deadlines.)

Why not boto3's ``get_object`` for the bytes: every chunk read through botocore/urllib3 allocates a new
``bytes`` and passes several Python layers, and with a dozen threads sharing one GIL that cost more CPU
than the transfer itself (bench/weights.py: ~4 CPU-s per GB against ~1 for curl). On a node the client's
CPU competes with nothing much, but on a shared host, or at hundreds of Gbit/s, CPU per byte is the speed.

What is kept from botocore: everything that decides *where* and *as whom* a request goes. Each request is
a SigV4 presigned URL from the boto3 client (endpoint, addressing style, region, session token, clock
skew all botocore's); ``Range`` and ``If-Match`` travel as ordinary headers, which S3 accepts beside a
presigned signature. Connection setup (TLS with botocore's CA bundle, an HTTP(S) proxy by CONNECT) is
http.client's. Only the response is read here: status line and headers, then the body with
``recv_into`` into the caller's buffer.

Every read of a response is bounded by the caller's low-speed window, not only by the socket timeout: a server
that trickles bytes (one a second) never lets a single read wait out the stall timeout, and would otherwise hold
the connection as long as it likes. The body must keep up a rate over each window (``read_body``); the head, and
an error's body, are too few bytes for a rate, so each must arrive whole within one window.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Callable
from urllib.parse import unquote, urlsplit

from botocore.exceptions import ClientError

from ..s3client import Cancelled, Retryable

_MAX_HEAD = 64 * 1024
_MAX_ERROR_BODY = 64 * 1024
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})")


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    netloc: str  # what the signature covers as Host


_DEFAULT_PORTS = {"http": 80, "https": 443}


def host_header(url: str) -> str:
    """The Host a presigned ``url`` was signed for. botocore signs the host without the scheme's default port, and
    keeps it in the URL when the endpoint names it (``http://minio.svc:80``, ``https://s3.example:443``): sending
    the URL's netloc as is would make every request a 403 SignatureDoesNotMatch."""
    u = urlsplit(url)
    netloc = u.netloc.rpartition("@")[2]
    if u.port is not None and u.port == _DEFAULT_PORTS.get(u.scheme):
        netloc = netloc[:netloc.rindex(":")]
    return netloc


def endpoint_of(url: str) -> Endpoint:
    u = urlsplit(url)
    port = u.port or _DEFAULT_PORTS.get(u.scheme, 80)
    return Endpoint(u.scheme, u.hostname or "", port, host_header(url))


def error_from(status: int, body: bytes, operation: str = "GetObject") -> ClientError:
    """The botocore ClientError this response would have raised, so s3client.classify() applies as is."""
    code = re.search(rb"<Code>([^<]*)</Code>", body)
    message = re.search(rb"<Message>([^<]*)</Message>", body)
    return ClientError({"Error": {"Code": code[1].decode() if code else str(status),
                                  "Message": message[1].decode(errors="replace") if message else ""},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, operation)


class Response:
    """A 2xx response with a Content-Length body, read with ``fill``."""

    def __init__(self, conn: "Connection", status: int, headers: dict[str, str], body_start: bytes):
        self.conn, self.status, self.headers = conn, status, headers
        self.remaining = int(headers["content-length"])
        self._pending = memoryview(body_start)

    def fill(self, buf: memoryview, deadline: float) -> int:
        """Read ``len(buf)`` bytes, or what is left of the body if less; returns how many.

        One call fills a whole chunk (a TLS socket hands out 16 KiB per recv) so the caller's per-chunk
        work (pwrite, checksum) runs per MiB, not per record. ``deadline`` (monotonic) bounds the call:
        a connection trickling bytes never stalls long enough for the socket timeout, so it is cut here.
        """
        want = min(len(buf), self.remaining)
        got = 0
        if self._pending:
            got = min(want, len(self._pending))
            buf[:got] = self._pending[:got]
            self._pending = self._pending[got:]
        sock = self.conn.sock
        while got < want:
            n = sock.recv_into(buf[got:want])
            if not n:
                self.conn.close()
                raise Retryable(f"connection closed with {self.remaining - got} body bytes still to come")
            got += n
            if got < want and time.monotonic() > deadline:
                break
        self.remaining -= got
        if not self.remaining:
            self.conn.response_done(self.headers)
        return got


def read_body(resp: Response, buf: memoryview, length: int, on_chunk: Callable[[memoryview, int], None],
              cancelled: threading.Event, low_speed: tuple[float, float], limit_s: float | None = None) -> None:
    """Hand ``length`` body bytes to ``on_chunk(chunk, bytes_before_it)`` a buffer at a time.

    Raises Retryable when the body comes slower than ``low_speed`` = (bytes/s, over seconds), like the streamer's
    S3_LOW_SPEED_LIMIT, or takes longer than ``limit_s`` in all, time spent in ``on_chunk`` not counted;
    Cancelled as soon as ``cancelled`` is set."""
    bps, window_s = low_speed
    got = 0
    start = mark_t = time.monotonic()
    mark_bytes = 0
    while got < length:
        if cancelled.is_set():
            raise Cancelled()
        deadline = mark_t + window_s if limit_s is None else min(start + limit_s, mark_t + window_s)
        n = resp.fill(buf, deadline)
        handed = time.monotonic()
        on_chunk(buf[:n], got)
        got += n
        now = time.monotonic()
        # Time in on_chunk (our disk write, the pull's own bandwidth cap) is not the server being slow.
        start, mark_t = start + now - handed, mark_t + now - handed
        if limit_s is not None and now - start > limit_s:
            raise Retryable(f"part took longer than {limit_s}s")
        if now - mark_t >= window_s:
            if (got - mark_bytes) / (now - mark_t) < bps:
                raise Retryable(f"slower than {bps / 1e6:g} MB/s for {window_s:g}s")
            mark_t, mark_bytes = now, got


class Connection:
    """One persistent HTTP/1.1 connection (one per pull thread); reconnects after any failure."""

    def __init__(self, endpoint: Endpoint, connect_timeout_s: float, stall_timeout_s: float,
                 ssl_context: ssl.SSLContext | None = None, direct: bool = False):
        self.endpoint, self.connect_timeout_s, self.stall_timeout_s = endpoint, connect_timeout_s, stall_timeout_s
        self.ssl_context = ssl_context
        self.direct = direct  # never through the environment's proxy (a peer on the node network)
        self.sock: socket.socket | None = None

    def _connect(self) -> None:
        ep = self.endpoint
        proxy = None if self.direct else _proxy_for(ep)
        kw = {"timeout": self.connect_timeout_s}
        if ep.scheme == "https":
            cls, kw["context"] = http.client.HTTPSConnection, self.ssl_context or ssl.create_default_context()
        else:
            cls = http.client.HTTPConnection
        if proxy is None:
            conn = cls(ep.host, ep.port, **kw)
        else:
            p = urlsplit(proxy)
            conn = cls(p.hostname, p.port or 80, **kw)
            headers = {}
            if p.username:
                import base64

                creds = f"{unquote(p.username)}:{unquote(p.password or '')}".encode()
                headers["Proxy-Authorization"] = "Basic " + base64.b64encode(creds).decode()
            conn.set_tunnel(ep.host, ep.port, headers)
        conn.connect()
        conn.sock.settimeout(self.stall_timeout_s)  # silence on an open connection: a stall, retried
        self.sock = conn.sock

    def _send(self, method: str, url: str, headers: dict[str, str],
              low_speed_time_s: float) -> tuple[int, dict[str, str], bytes]:
        u = urlsplit(url)
        target = u.path + ("?" + u.query if u.query else "")
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header(url)}", "Accept-Encoding: identity",
                 *(f"{k}: {v}" for k, v in headers.items())]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if self.sock is None:
            self._connect()
        try:
            self.sock.sendall(request)
            return self._read_head(low_speed_time_s)
        except OSError:
            if self.sock is None:
                raise
            # A kept-alive connection the server had already closed: one fresh try, then it is an error.
            self.close()
            self._connect()
            self.sock.sendall(request)
            return self._read_head(low_speed_time_s)

    def head(self, url: str, headers: dict[str, str], low_speed_time_s: float) -> dict[str, str]:
        """Send a HEAD for the presigned ``url``; return the 2xx response's headers (lower-case names), raise
        ClientError otherwise (a HEAD error has no body: the code is the status, as botocore reports it).

        ``low_speed_time_s``: the response must arrive within it, as in ``get``."""
        status, head, _ = self._send("HEAD", url, headers, low_speed_time_s)
        if 200 <= status < 300:
            self.response_done(head)
            return head
        self.close()  # whatever an error reply carries after its head is not ours to parse
        raise error_from(status, b"", "HeadObject")

    def get(self, url: str, headers: dict[str, str], low_speed_time_s: float) -> Response:
        """Send a GET for the presigned ``url``; return the 2xx response, raise ClientError otherwise.

        ``low_speed_time_s`` is the window of the low-speed limit its body will be read under (``read_body``):
        the head, and an error's body, must each arrive within it, else Retryable, as for a body too slow."""
        status, head, rest = self._send("GET", url, headers, low_speed_time_s)
        if 200 <= status < 300:
            if "content-length" not in head:
                self.close()
                raise Retryable(f"HTTP {status} without Content-Length")
            return Response(self, status, head, rest)
        body = self._read_error_body(head, rest, low_speed_time_s)
        raise error_from(status, body)

    def _read_head(self, low_speed_time_s: float) -> tuple[int, dict[str, str], bytes]:
        deadline = time.monotonic() + low_speed_time_s
        data = bytearray()
        while (end := data.find(b"\r\n\r\n")) < 0:
            self._by(deadline, "response head", low_speed_time_s)
            chunk = self.sock.recv(65536)
            if not chunk:
                self.close()
                raise ConnectionResetError("the server closed the connection before a response")
            data += chunk
            if len(data) > _MAX_HEAD:
                self.close()
                raise Retryable("response headers larger than 64 KiB")
        first, *rest_lines = bytes(data[:end]).split(b"\r\n")
        m = _STATUS.match(first)
        if not m:
            self.close()
            raise Retryable(f"not an HTTP/1.1 response: {first[:80]!r}")
        headers = {}
        for line in rest_lines:
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(m[1]), headers, bytes(data[end + 4:])

    def _read_error_body(self, headers: dict[str, str], rest: bytes, low_speed_time_s: float) -> bytes:
        """Up to 64 KiB of an error response's body (S3's XML); the connection is kept only when the
        body was read whole."""
        try:
            length = int(headers.get("content-length", -1))
        except ValueError:
            length = -1
        body = bytearray(rest)
        if 0 <= length <= _MAX_ERROR_BODY:
            deadline = time.monotonic() + low_speed_time_s
            try:
                while len(body) < length:
                    self._by(deadline, "error body", low_speed_time_s)
                    chunk = self.sock.recv(length - len(body))
                    if not chunk:
                        break
                    body += chunk
            except OSError:
                self.close()
                return bytes(body)
            if len(body) == length:
                self.response_done(headers)
                return bytes(body)
        self.close()
        return bytes(body)

    def _by(self, deadline: float, what: str, window_s: float) -> None:
        """Before each further read of ``what``: past ``deadline`` the server is too slow (Retryable)."""
        if time.monotonic() > deadline:
            self.close()
            raise Retryable(f"slower than the low-speed limit: {what} not complete within {window_s:g}s")

    def response_done(self, headers: dict[str, str]) -> None:
        if headers.get("connection", "").lower() == "close":
            self.close()

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None


def _proxy_for(ep: Endpoint) -> str | None:
    """The proxy the standard environment (HTTPS_PROXY / HTTP_PROXY / NO_PROXY) names for this endpoint,
    as botocore would use it."""
    proxies = urllib.request.getproxies()
    proxy = proxies.get(ep.scheme)
    if not proxy or urllib.request.proxy_bypass(ep.host):
        return None
    return proxy if "://" in proxy else "http://" + proxy


def ssl_context_for(client) -> ssl.SSLContext | None:
    """TLS as the boto3 client verifies it (its CA bundle; AWS_CA_BUNDLE; verify=False)."""
    from botocore.httpsession import get_cert_path

    # botocore keeps the resolved setting (True, False, or a CA bundle path) on its HTTP session.
    verify = getattr(client._endpoint.http_session, "_verify", True)  # noqa: SLF001
    if verify is False:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        return ctx
    return ssl.create_default_context(cafile=get_cert_path(verify))
