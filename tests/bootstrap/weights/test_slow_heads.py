"""A server that trickles what comes before a body (status line, headers, an error's body) is as slow as one that
trickles the body: cut within the low-speed window, the peer dropped for S3.

The trickling server is a real socket server on loopback sending one byte a second: never silent long enough for a
read timeout, so only the low-speed window can catch it. It gives up after TRICKLE_FOR_S, which bounds how long a
client without that window waits (and a test of one fails rather than hangs).
"""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from support.bootstrap_fixtures import model_files, put_model, visible_files, warm
from nodewarm.bootstrap.s3client import Retryable
from nodewarm.bootstrap.weights import rangeget
from nodewarm.bootstrap.peers.auth import PeerKeys
from nodewarm.bootstrap.peers.fetch import Peer, PeerSource

TRICKLE_FOR_S = 20.0
WINDOW_S = 1.0
# A head that never ends: the trickle gives up long before its last byte.
ENDLESS_HEAD = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"." * 10_000


class Trickler:
    """Answers each request with ``at_once`` and then ``trickled`` one byte a second, then closes."""

    def __init__(self, at_once: bytes, trickled: bytes):
        self.at_once, self.trickled = at_once, trickled
        self.stopped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self.listener.getsockname()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # stopped
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        until = time.monotonic() + TRICKLE_FOR_S
        with conn:
            try:
                conn.recv(65536)  # the request, whatever it asks
                conn.sendall(self.at_once)
                for i in range(len(self.trickled)):
                    conn.sendall(self.trickled[i:i + 1])
                    if self.stopped.wait(1.0) or time.monotonic() > until:
                        return
            except OSError:
                return  # the client gave up on us

    def __enter__(self) -> "Trickler":
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.listener.close()


@pytest.mark.parametrize("at_once, trickled", [
    (b"", ENDLESS_HEAD),
    (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 1000\r\n\r\n", b"<" * 1000),
], ids=["status-line-and-headers", "error-body"])
def test_a_trickled_response_fails_as_too_slow_within_the_low_speed_window(at_once, trickled):
    with Trickler(at_once, trickled) as server:
        host, port = server.address
        conn = rangeget.Connection(rangeget.Endpoint("http", host, port, f"{host}:{port}"), 2.0, 5.0, direct=True)
        start = time.monotonic()
        with pytest.raises(Retryable, match="slower than the low-speed limit"):
            conn.get(f"http://{host}:{port}/model.safetensors", {"Range": "bytes=0-1023"}, WINDOW_S)
        took = time.monotonic() - start
    # Not before the window; well before the trickle ends (one byte a second never trips the 5 s read timeout).
    assert WINDOW_S <= took < TRICKLE_FOR_S / 2, took
    assert conn.sock is None  # where the stream stands is unknown: the connection is not reused


def test_a_trickled_head_response_fails_within_the_window_too():
    """The listing's HEADs (one per object) are bounded alike."""
    with Trickler(b"", ENDLESS_HEAD) as server:
        host, port = server.address
        conn = rangeget.Connection(rangeget.Endpoint("http", host, port, f"{host}:{port}"), 2.0, 5.0, direct=True)
        start = time.monotonic()
        with pytest.raises(Retryable, match="response head not complete"):
            conn.head(f"http://{host}:{port}/model.safetensors", {}, WINDOW_S)
        assert WINDOW_S <= time.monotonic() - start < TRICKLE_FOR_S / 2


@pytest.mark.s3
def test_a_peer_trickling_its_response_head_is_dropped_and_the_pull_ends_from_s3(s3, proxy, tmp_path):
    """The issue's case: the only peer is warm, so every worker asks it first (least in flight)."""
    files = model_files(shards=3, mib_per_shard=2)
    uri = put_model(s3, files)
    keys = PeerKeys(os.urandom(32))
    with Trickler(b"", ENDLESS_HEAD) as slow:
        source = PeerSource("b", lambda: [Peer("slow", *slow.address, "warm")], lambda: keys,
                            low_speed=(5e6, WINDOW_S))
        start = time.monotonic()
        summary = warm(uri, tmp_path / "b", peers=source)
        took = time.monotonic() - start
    assert summary.ok and visible_files(tmp_path / "b") == files
    assert sum(summary.verified.values()) == len(files)
    assert "response head not complete" in summary.peers["dropped"]["slow"], summary.peers
    assert summary.peers["bytesFromPeers"] == 0 and proxy.body_bytes == sum(map(len, files.values()))
    assert took < TRICKLE_FOR_S / 2, took  # dropped at the window, not when the peer gave up
