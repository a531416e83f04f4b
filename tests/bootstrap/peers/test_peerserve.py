"""The peer server against real sockets on loopback: what a signed request gets, what anything else gets, the caps.

A temp DEST holds one verified file and one file still being pulled (its temp file and journal as s3pull.py writes
them); the client is http.client, signing as peers/fetch.py does.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import time

import pytest

from nodewarm.bootstrap.weights.manifest import RemoteObject
from nodewarm.bootstrap.peers.auth import PeerKeys, object_path, sign
from nodewarm.bootstrap.peers.holdings import Holdings
from nodewarm.bootstrap.peers.serve import PeerServer
from nodewarm.bootstrap.weights.throttle import TokenBucket
from nodewarm.bootstrap.weights.partial import partial_paths

KEYS = PeerKeys(os.urandom(32))
PART = 1024
DONE = RemoteObject("models/m/shard-1.safetensors", "shard-1.safetensors", 5000, "etag-done")
PULLING = RemoteObject("models/m/sub/shard-2.safetensors", "sub/shard-2.safetensors", 4 * PART + 100, "etag-pull-2")
DONE_BYTES = os.urandom(DONE.size)
PULLING_BYTES = os.urandom(PULLING.size)


def journal(dest, obj, parts, etag=None, torn=""):
    """The partial of ``obj`` as s3pull.py leaves it mid-pull: the whole temp file, the journal of ``parts``."""
    temp, jpath = partial_paths(dest, obj.rel_path)
    temp.parent.mkdir(parents=True, exist_ok=True)
    temp.write_bytes(PULLING_BYTES)
    header = {"key": obj.key, "etag": etag or obj.etag, "version_id": None, "size": obj.size, "part_size": PART,
              "part_digest": "sha256"}
    lines = [json.dumps(header) + "\n"] + [f"{i} {hashlib.sha256(b'x').hexdigest()}\n" for i in parts]
    jpath.write_text("".join(lines) + torn)


@pytest.fixture
def dest(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / DONE.rel_path).write_bytes(DONE_BYTES)
    journal(dest, PULLING, [0, 2])
    (dest / "secret.txt").write_text("not a model file")
    (dest / ".nodewarm").mkdir(exist_ok=True)
    (dest / ".nodewarm" / "state.json").write_text("{}")
    return dest


def serve(dest, keys=lambda: KEYS, max_connections=4, rate=1e9, host="127.0.0.1"):
    holdings = Holdings(dest)
    holdings.set_objects([DONE, PULLING])
    holdings.mark_verified(DONE.rel_path)
    return PeerServer(host, 0, holdings, keys, max_connections, rate).start()


@pytest.fixture
def server(dest):
    server = serve(dest)
    yield server
    server.stop()


def get(server, target, rng, keys=KEYS, conn=None):
    conn = conn or http.client.HTTPConnection(*server.address, timeout=5)
    headers = {"Range": rng} if rng is not None else {}
    headers["Authorization"] = sign(keys, "node-b", "GET", target, rng or "")
    conn.request("GET", target, headers=headers)
    resp = conn.getresponse()
    return resp, resp.read()


def test_a_verified_range_is_served_with_its_exact_bytes_over_one_kept_connection(server):
    conn = http.client.HTTPConnection(*server.address, timeout=5)
    for first, last in ((0, 0), (100, 4095), (4999 - 9, 4999)):
        resp, body = get(server, object_path(DONE.rel_path, DONE.etag), f"bytes={first}-{last}", conn=conn)
        assert resp.status == 206 and body == DONE_BYTES[first:last + 1]
        assert resp.getheader("Content-Range") == f"bytes {first}-{last}/{DONE.size}"
    assert server.stats()["requests"] == 3 and server.stats()["bytes_served"] == 1 + 3996 + 10
    resp, _ = get(server, object_path(DONE.rel_path, DONE.etag), "bytes=10-5000", conn=conn)
    assert resp.status == 416  # past the end


@pytest.mark.parametrize("case", ["none", "bad", "expired", "other_range"])
def test_an_unsigned_or_wrongly_signed_request_gets_401_and_learns_nothing(server, case):
    bodies = set()
    for obj in (DONE, RemoteObject("k", "no-such-file", 1, "e")):
        target, rng = object_path(obj.rel_path, obj.etag), "bytes=0-0"
        conn = http.client.HTTPConnection(*server.address, timeout=5)
        headers = {"Range": rng}
        if case == "bad":
            headers["Authorization"] = sign(PeerKeys(os.urandom(32)), "node-b", "GET", target, rng)
        elif case == "expired":
            headers["Authorization"] = sign(KEYS, "node-b", "GET", target, rng, now=time.time() - 600)
        elif case == "other_range":
            headers["Authorization"] = sign(KEYS, "node-b", "GET", target, "bytes=0-9")
        conn.request("GET", target, headers=headers)
        resp = conn.getresponse()
        assert resp.status == 401
        bodies.add((resp.read(), tuple(sorted((k, v) for k, v in resp.getheaders() if k != "Date"))))
    assert len(bodies) == 1  # an existing and a missing file look the same
    assert server.stats()["refused_auth"] == 2 and server.stats()["bytes_served"] == 0


def test_the_previous_key_is_accepted_and_no_key_refuses_everything(dest):
    old = PeerKeys(os.urandom(32))
    keys = {"now": PeerKeys(os.urandom(32), previous=old.current)}
    server = serve(dest, keys=lambda: keys["now"])
    try:
        target = object_path(DONE.rel_path, DONE.etag)
        assert get(server, target, "bytes=0-9", keys=old)[0].status == 206
        assert get(server, target, "bytes=0-9", keys=keys["now"])[0].status == 206
        assert get(server, target, "bytes=0-9", keys=PeerKeys(os.urandom(32)))[0].status == 401
        keys["now"] = None  # the agent has not read the Secret (yet)
        assert get(server, target, "bytes=0-9", keys=old)[0].status == 401
    finally:
        server.stop()


@pytest.mark.parametrize("target", [
    "/v1/objects/../secret.txt?etag=x",
    "/v1/objects/%2e%2e/secret.txt?etag=x",
    "/v1/objects/sub/%2e%2e/%2e%2e/secret.txt?etag=x",
    "/v1/objects//etc/passwd?etag=x",
    "/v1/objects/%2Fetc%2Fpasswd?etag=x",
    "/v1/objects/secret.txt?etag=x",
    "/v1/objects/.nodewarm/state.json?etag=x",
    "/v1/objects/.nodewarm/partial/sub/shard-2.safetensors.part?etag=etag-pull-2",
    "/v1/objects/sub/shard-2.safetensors.part?etag=etag-pull-2",
    "/v1/objects/sub/../shard-1.safetensors?etag=etag-done",
    "/v1/objects/shard-1.safetensors",
    "/v1/objects/shard-1.safetensors?etag=etag-done&etag=etag-done",
    "/other/shard-1.safetensors?etag=etag-done",
])
def test_anything_but_a_manifest_object_is_404(server, target):
    resp, body = get(server, target, "bytes=0-0")
    assert resp.status == 404 and body == b"not found\n"


def test_an_etag_other_than_the_manifests_is_404(server):
    assert get(server, object_path(DONE.rel_path, "etag-older"), "bytes=0-9")[0].status == 404
    assert get(server, object_path(PULLING.rel_path, "etag-older"), "bytes=0-9")[0].status == 404
    assert server.stats()["not_found"] == 2


def test_a_symlink_at_a_manifest_path_is_not_followed(dest, server, tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(b"o" * DONE.size)
    (dest / DONE.rel_path).unlink()
    (dest / DONE.rel_path).symlink_to(outside)
    resp, body = get(server, object_path(DONE.rel_path, DONE.etag), "bytes=0-9")
    assert resp.status == 404 and body == b"not found\n"


def test_a_symlinked_folder_on_the_way_to_a_partial_is_not_followed(dest, server, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    journal(elsewhere, PULLING, [0, 1, 2, 3, 4])
    (dest / ".nodewarm" / "partial" / "sub").rename(tmp_path / "gone")
    (dest / ".nodewarm" / "partial" / "sub").symlink_to(elsewhere / ".nodewarm" / "partial" / "sub")
    assert get(server, object_path(PULLING.rel_path, PULLING.etag), "bytes=0-9")[0].status == 404


def test_a_verified_file_of_another_size_is_not_served(dest, server):
    (dest / DONE.rel_path).write_bytes(DONE_BYTES[:-1])
    assert get(server, object_path(DONE.rel_path, DONE.etag), "bytes=0-9")[0].status == 404


def test_a_partial_serves_its_journaled_parts_only(dest, server):
    target = object_path(PULLING.rel_path, PULLING.etag)
    resp, body = get(server, target, f"bytes=10-{PART - 1}")
    assert resp.status == 206 and body == PULLING_BYTES[10:PART]
    resp, body = get(server, target, f"bytes={2 * PART}-{3 * PART - 1}")
    assert resp.status == 206 and body == PULLING_BYTES[2 * PART:3 * PART]
    assert get(server, target, f"bytes={PART}-{PART}")[0].status == 416  # part 1 is not journaled
    assert get(server, target, f"bytes=0-{2 * PART}")[0].status == 416  # spans part 1
    assert server.stats()["not_held"] == 2
    journal(dest, PULLING, [0, 1, 2], torn=f"4 {hashlib.sha256(b'x').hexdigest()}")  # the pull goes on
    assert get(server, target, f"bytes=0-{2 * PART}")[0].status == 206
    assert get(server, target, f"bytes={4 * PART}-{4 * PART}")[0].status == 416  # a torn line lists nothing


def test_a_partial_of_another_object_version_is_not_served(dest, server):
    journal(dest, PULLING, [0, 1, 2, 3, 4], etag="etag-pull-1")
    resp, _ = get(server, object_path(PULLING.rel_path, PULLING.etag), "bytes=0-9")
    assert resp.status in (404, 416)


def test_a_partial_renamed_into_place_is_served_from_there(dest, server):
    temp, jpath = partial_paths(dest, PULLING.rel_path)
    (dest / PULLING.rel_path).parent.mkdir()
    temp.rename(dest / PULLING.rel_path)
    jpath.unlink()
    target = object_path(PULLING.rel_path, PULLING.etag)
    assert get(server, target, f"bytes={PART}-{PART + 9}")[0].status == 404  # in place, not yet marked
    server.holdings.mark_verified(PULLING.rel_path)
    resp, body = get(server, target, f"bytes={PART}-{PART + 9}")
    assert resp.status == 206 and body == PULLING_BYTES[PART:PART + 10]


def test_the_range_header_must_be_one_closed_range(server):
    target = object_path(DONE.rel_path, DONE.etag)
    for rng in (None, "bytes=0-", "bytes=-10", "bytes=0-1,5-9", "bytes=9-0", "items=0-9"):
        assert get(server, target, rng)[0].status == 416, rng


def test_holdings_summary_counts_verified_files_of_the_manifest(dest):
    holdings = Holdings(dest)
    holdings.set_objects([DONE, PULLING])
    holdings.mark_verified(DONE.rel_path)
    holdings.mark_verified("not/in/manifest")
    assert holdings.summary() == {"files": 1, "bytes": DONE.size}
    holdings.mark_verified(PULLING.rel_path)
    assert holdings.summary() == {"files": 2, "bytes": DONE.size + PULLING.size}
    holdings.set_objects([DONE])
    assert holdings.summary() == {"files": 0, "bytes": 0}


def test_one_connection_over_the_cap_gets_503_at_once(dest):
    server = serve(dest, max_connections=2, rate=1.0)  # one byte a second: every response stays open
    target = object_path(DONE.rel_path, DONE.etag)
    held = []
    try:
        for _ in range(2):
            conn = http.client.HTTPConnection(*server.address, timeout=5)
            conn.request("GET", target, headers={"Range": "bytes=0-1023",
                                                 "Authorization": sign(KEYS, "b", "GET", target, "bytes=0-1023")})
            resp = conn.getresponse()
            assert resp.status == 206
            held.append(resp)
        resp, body = get(server, target, "bytes=0-9")
        assert resp.status == 503 and resp.getheader("Retry-After") == "1"
        assert server.stats()["refused_busy"] == 1
    finally:
        server.stop()
    for resp in held:  # stop ends the responses mid-way rather than leaving them open
        with pytest.raises(http.client.IncompleteRead):
            resp.read()


def test_token_bucket_shares_one_rate_between_all_callers():
    now, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        return False

    bucket = TokenBucket(100, lambda: now[0], sleep)
    assert bucket.take(100) and slept == []  # one second's worth may go at once
    assert bucket.take(50) and bucket.take(50)
    assert slept == [0.5, 1.0]  # the second caller waits behind the first
    now[0] = 1000.0
    assert bucket.take(150) and slept == [0.5, 1.0, 0.5]  # idle time saves up at most one second's worth


def test_token_bucket_reports_a_wait_cut_short():
    bucket = TokenBucket(10, lambda: 0.0, lambda s: True)
    assert bucket.take(10) and not bucket.take(1)


def test_stop_refuses_new_connections_and_ends_kept_ones(dest):
    server = serve(dest)
    conn = http.client.HTTPConnection(*server.address, timeout=5)
    assert get(server, object_path(DONE.rel_path, DONE.etag), "bytes=0-9", conn=conn)[0].status == 206
    server.stop()
    server.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(server.address, timeout=5)
    assert conn.sock.recv(1) == b""  # the kept connection was closed by the server, not left waiting


def test_it_listens_on_its_own_address_only(dest):
    server = serve(dest, host="127.0.0.2")
    try:
        host, port = server.address
        assert host == "127.0.0.2"
        assert get(server, object_path(DONE.rel_path, DONE.etag), "bytes=0-9")[0].status == 206
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
    finally:
        server.stop()


@pytest.mark.parametrize("host", ["", "0.0.0.0", "::", "0:0:0:0:0:0:0:0", "node.example"])
def test_a_wildcard_or_name_is_refused(dest, host):
    with pytest.raises(ValueError, match="wildcard|not an IP address"):
        PeerServer(host, 0, Holdings(dest), lambda: KEYS, 4, 1e9)
