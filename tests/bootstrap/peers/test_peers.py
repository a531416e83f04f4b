"""Peers before S3 against the real local S3 server and real peer servers on loopback: every byte verified either way.

Each test pulls a model into a second node's folder with a directory of peers, and counts what S3 itself sent (the
fault proxy's relayed GET bodies) beside what came from peers (the pull's own summary).
"""

from __future__ import annotations

import os
import threading

import pytest

from nodewarm_dev.testenv.faultproxy import FaultProxy, Reset, Trickle
from support.bootstrap_fixtures import model_files, put_model, visible_files, warm
from nodewarm.bootstrap.peers.auth import PeerKeys
from nodewarm.bootstrap.peers.fetch import Peer, PeerSource
from nodewarm.bootstrap.peers.holdings import Holdings
from nodewarm.bootstrap.peers.serve import PeerServer

pytestmark = pytest.mark.s3

KEYS = PeerKeys(os.urandom(32))


def serve(dest, host="127.0.0.1"):
    holdings = Holdings(dest)
    return holdings, PeerServer(host, 0, holdings, lambda: KEYS, 16, 1e9).start()


def peer(name: str, server: PeerServer, state: str = "warm") -> Peer:
    host, port = server.address
    return Peer(name, host, port, state)


@pytest.fixture
def model(s3):
    files = model_files(shards=3, mib_per_shard=2)
    return files, put_model(s3, files)


@pytest.fixture
def warm_a(model, proxy, tmp_path):
    """Node a: pulled from S3 and serving everything it holds."""
    files, uri = model
    holdings, server = serve(tmp_path / "a")
    assert warm(uri, tmp_path / "a", holdings=holdings).ok
    yield server, tmp_path / "a"
    server.stop()


def test_a_warm_peer_feeds_the_whole_pull_and_s3_sends_no_body(model, warm_a, proxy, tmp_path):
    files, uri = model
    server, _ = warm_a
    proxy.reset_counters()
    source = PeerSource("b", lambda: [peer("a", server)], lambda: KEYS)
    summary = warm(uri, tmp_path / "b", peers=source)
    assert summary.ok and visible_files(tmp_path / "b") == files
    assert proxy.body_bytes == 0  # S3 still lists and HEADs (the checksums come from it), but sends no bytes
    assert summary.peers["bytesFromPeers"] == sum(map(len, files.values()))
    assert summary.peers["dropped"] == {}
    assert server.stats()["bytes_served"] == sum(map(len, files.values()))


def test_with_no_peer_reachable_the_pull_is_s3s(model, proxy, tmp_path):
    files, uri = model
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = s.getsockname()[1]
    s.close()  # nobody listens there now
    source = PeerSource("b", lambda: [Peer("gone", "127.0.0.1", dead, "warm")], lambda: KEYS)
    summary = warm(uri, tmp_path / "b", peers=source)
    assert summary.ok and visible_files(tmp_path / "b") == files
    assert proxy.body_bytes == sum(map(len, files.values()))
    assert "gone" in summary.peers["dropped"] and summary.peers["bytesFromPeers"] == 0


def test_a_peer_serving_wrong_bytes_is_dropped_and_its_file_comes_from_s3(model, warm_a, proxy, tmp_path):
    files, uri = model
    server, a = warm_a
    shard = next(n for n in files if n.endswith(".safetensors"))
    with open(a / shard, "r+b") as f:  # a poisoned (or rotted) copy on the peer
        f.seek(100_000)
        byte = f.read(1)
        f.seek(100_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    proxy.reset_counters()
    source = PeerSource("b", lambda: [peer("a", server)], lambda: KEYS)
    summary = warm(uri, tmp_path / "b", peers=source)
    assert summary.ok and visible_files(tmp_path / "b") == files  # the poison never got a final name
    assert "verification" in summary.peers["dropped"]["a"]
    assert proxy.body_bytes >= len(files[shard])
    assert summary.peers["bytesDiscarded"] > 0


def pull_through_fault(uri, dest, server: PeerServer, action, **source) -> object:
    """Pull into ``dest`` from peer ``a`` behind a fault proxy that applies ``action`` to every GET."""
    host, port = server.address
    fault = FaultProxy(f"http://{host}:{port}", rule=lambda req: action if req.is_get else None)
    try:
        port = int(fault.endpoint.rsplit(":", 1)[1])
        return warm(uri, dest, peers=PeerSource("b", lambda: [Peer("a", "127.0.0.1", port, "warm")], lambda: KEYS,
                                                **source))
    finally:
        fault.stop()


def test_a_peer_that_dies_mid_range_is_dropped_and_the_pull_ends_verified(model, warm_a, proxy, tmp_path):
    files, uri = model
    proxy.reset_counters()
    summary = pull_through_fault(uri, tmp_path / "b", warm_a[0], Reset(after=100_000))
    assert summary.ok and visible_files(tmp_path / "b") == files
    assert "a" in summary.peers["dropped"]
    assert proxy.body_bytes + summary.peers["bytesFromPeers"] == sum(map(len, files.values()))


def test_a_slow_peer_is_dropped_for_s3(model, warm_a, proxy, tmp_path):
    files, uri = model
    summary = pull_through_fault(uri, tmp_path / "b", warm_a[0], Trickle(bytes_per_s=50_000), low_speed=(1e6, 0.5))
    assert summary.ok and visible_files(tmp_path / "b") == files
    assert "slower than" in summary.peers["dropped"]["a"]


def test_a_peer_gone_from_the_api_is_not_asked_again(model, warm_a, proxy, tmp_path):
    files, uri = model
    server, _ = warm_a
    listed = [peer("a", server)]
    source = PeerSource("b", lambda: list(listed), lambda: KEYS)
    asked_at_vanish: list[int] = []
    original = source.fetch

    def fetch_then_vanish(*args, **kw):
        original(*args, **kw)
        if not asked_at_vanish:
            asked_at_vanish.append(server.stats()["requests"])
            listed.clear()  # the watch saw its Node go
    source.fetch = fetch_then_vanish
    proxy.reset_counters()
    summary = warm(uri, tmp_path / "b", peers=source)
    assert summary.ok and visible_files(tmp_path / "b") == files
    assert asked_at_vanish and summary.peers["bytesFromPeers"] > 0
    # Only the requests already under way when it left (one per other pull worker) reached it afterwards.
    assert server.stats()["requests"] - asked_at_vanish[0] <= 3
    assert proxy.body_bytes < sum(map(len, files.values()))


def test_nodes_pulling_together_read_each_byte_from_s3_about_once(model, proxy, tmp_path):
    """Three nodes scale up at once: each fetches its share from S3 and the rest from the others' partial files."""
    files, uri = model
    names = ["n1", "n2", "n3"]
    served = {n: serve(tmp_path / n) for n in names}
    results: dict = {}

    def pull(n: str) -> None:
        others = [peer(o, served[o][1], "pulling") for o in names if o != n]
        source = PeerSource(n, lambda: others, lambda: KEYS, wait_s=60)
        results[n] = warm(uri, tmp_path / n, peers=source, holdings=served[n][0])

    proxy.reset_counters()
    threads = [threading.Thread(target=pull, args=(n,)) for n in names]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for _, server in served.values():
            server.stop()
    total = sum(map(len, files.values()))
    assert all(results[n].ok and visible_files(tmp_path / n) == files for n in names)
    assert all(results[n].peers["dropped"] == {} for n in names)
    # Each part has one owner that fetches it from S3; the others read it from the owner's partial file.
    assert proxy.body_bytes <= 1.2 * total, (proxy.body_bytes, total)
    assert sum(results[n].peers["bytesFromPeers"] for n in names) >= 1.6 * total


def test_two_warm_peers_share_the_load(model, warm_a, proxy, tmp_path):
    files, uri = model
    server_a, _ = warm_a
    holdings_c, server_c = serve(tmp_path / "c")
    try:
        assert warm(uri, tmp_path / "c", holdings=holdings_c).ok
        proxy.reset_counters()
        source = PeerSource("b", lambda: [peer("a", server_a), peer("c", server_c)], lambda: KEYS)
        summary = warm(uri, tmp_path / "b", peers=source)
    finally:
        server_c.stop()
    assert summary.ok and visible_files(tmp_path / "b") == files and proxy.body_bytes == 0
    by_peer = summary.peers["byPeer"]
    # The least busy warm peer is asked, ties drawn at random: neither one carries it all. How the bytes split
    # follows timing and the draw (a 92/8 split was seen in CI), so no share is asserted.
    assert set(by_peer) == {"a", "c"} and min(by_peer.values()) > 0, by_peer


def test_a_peer_that_refuses_this_nodes_key_is_dropped_and_s3_serves(model, warm_a, proxy, tmp_path):
    files, uri = model
    proxy.reset_counters()
    source = PeerSource("b", lambda: [peer("a", warm_a[0])], lambda: PeerKeys(os.urandom(32)))
    summary = warm(uri, tmp_path / "b", peers=source)
    assert summary.ok and visible_files(tmp_path / "b") == files
    assert summary.peers["dropped"] == {"a": "HTTP 401"} and summary.peers["bytesFromPeers"] == 0
    assert proxy.body_bytes == sum(map(len, files.values()))
    assert warm_a[0].stats()["bytes_served"] == 0 and warm_a[0].stats()["refused_auth"] >= 1
