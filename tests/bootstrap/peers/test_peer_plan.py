"""Peers before S3, the pure parts: who owns a part, where a part comes from, what a Node offers, request signing."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from nodewarm.api.names import PEER_ANNOTATION
from nodewarm.bootstrap.peers import auth as peerauth, directory as peerdirectory
from nodewarm.bootstrap.peers.fetch import Peer, choose, owner

KEY = peerauth.PeerKeys(b"k" * 32)


def pulling(*names: str) -> list[Peer]:
    return [Peer(n, "10.0.0.1", 7480, "pulling") for n in names]


def test_owners_split_the_parts_about_evenly_and_a_leaver_moves_only_its_own():
    members = ["a", "b", "c", "d"]
    parts = [("model.safetensors", i * 8 << 20) for i in range(2000)]
    owners = {p: owner(members, *p) for p in parts}
    counts = Counter(owners.values())
    assert set(counts) == set(members) and min(counts.values()) > 2000 / 4 * 0.8
    after = {p: owner(["a", "b", "c"], *p) for p in parts}
    moved = [p for p in parts if after[p] != owners[p]]
    assert moved and all(owners[p] == "d" for p in moved)  # rendezvous hashing: only d's share moves


def test_the_owner_fetches_from_s3_and_the_others_wait_for_it():
    rel, off = "m.safetensors", 0
    who = owner(["a", "b"], rel, off)
    other = "b" if who == "a" else "a"
    assert choose(who, pulling(other), rel, off, 0, 60, Counter()).source == "s3"
    got = choose(other, pulling(who), rel, off, 0, 60, Counter())
    assert got.source == "peer" and got.peer.node == who
    # The owner said it does not hold the part yet: wait, until the patience runs out, then S3.
    assert choose(other, pulling(who), rel, off, 1, 60, Counter(), frozenset({who})).source == "wait"
    assert choose(other, pulling(who), rel, off, 61, 60, Counter(), frozenset({who})).source == "s3"


def test_warm_peers_are_asked_first_least_busy_first():
    peers = [Peer("w1", "10.0.0.1", 7480, "warm"), Peer("w2", "10.0.0.2", 7480, "warm")]
    for off in range(0, 50):
        got = choose("me", peers, "f", off, 0, 60, Counter({"w1": 3, "w2": 1}))
        assert got.peer.node == "w2"
    assert choose("me", peers, "f", 0, 0, 60, Counter(), frozenset({"w1", "w2"})).source == "s3"


def test_no_peers_means_s3():
    assert choose("me", [], "f", 0, 0, 60, Counter()).source == "s3"


def node(name: str, value: dict | str | None, unschedulable: bool = False, taints=()) -> dict:
    ann = {} if value is None else {PEER_ANNOTATION: value if isinstance(value, str) else json.dumps(value)}
    return {"metadata": {"name": name, "annotations": ann},
            "spec": {"unschedulable": unschedulable, "taints": list(taints)}}


def test_a_node_offers_a_peer_only_for_its_profile_and_model_while_it_stays():
    good = json.loads(peerdirectory.annotation("chat", "10.1.2.3", 7480, "pulling", "abc", {"files": 1}))
    assert peerdirectory.peer_of(node("n1", good), "chat", "abc") == Peer("n1", "10.1.2.3", 7480, "pulling")
    assert peerdirectory.peer_of(node("n1", good), "other", "abc") is None
    assert peerdirectory.peer_of(node("n1", good), "chat", "def") is None
    assert peerdirectory.peer_of(node("n1", good, unschedulable=True), "chat", "abc") is None
    assert peerdirectory.peer_of(node("n1", good, taints=[{"key": "karpenter.sh/disrupted"}]), "chat", "abc") is None
    for bad in ("not json", {**good, "endpoint": "evil.example:80"}, {**good, "endpoint": "10.0.0.1:0"},
                {**good, "state": "serving"}, {**good, "endpoint": 5}):
        assert peerdirectory.peer_of(node("n1", bad), "chat", "abc") is None
    assert peerdirectory.peer_of(node("n1", None), "chat", "abc") is None


def test_leaving_names_the_reason():
    assert peerdirectory.leaving(node("n", None, unschedulable=True)) == "cordoned"
    assert "drain" in peerdirectory.leaving(node("n", None, taints=[{"key": "karpenter.sh/disrupted"}]))
    assert peerdirectory.leaving(node("n", None)) is None


def test_a_signature_covers_the_request_and_expires():
    h = peerauth.sign(KEY, "n1", "GET", "/v1/objects/a?etag=x", "bytes=0-9", now=1000)
    assert peerauth.verify(KEY, h, "GET", "/v1/objects/a?etag=x", "bytes=0-9", now=1030) == "n1"
    for args in (("GET", "/v1/objects/b?etag=x", "bytes=0-9"), ("GET", "/v1/objects/a?etag=x", "bytes=0-99")):
        with pytest.raises(peerauth.PeerAuthFailed):
            peerauth.verify(KEY, h, *args, now=1000)
    with pytest.raises(peerauth.PeerAuthFailed, match="away"):
        peerauth.verify(KEY, h, "GET", "/v1/objects/a?etag=x", "bytes=0-9", now=1000 + peerauth.MAX_SKEW_S + 1)
    rotated = peerauth.PeerKeys(b"n" * 32, previous=KEY.current)
    assert peerauth.verify(rotated, h, "GET", "/v1/objects/a?etag=x", "bytes=0-9", now=1000) == "n1"
    with pytest.raises(peerauth.PeerAuthFailed, match="bad signature"):
        peerauth.verify(peerauth.PeerKeys(b"n" * 32), h, "GET", "/v1/objects/a?etag=x", "bytes=0-9", now=1000)
    with pytest.raises(peerauth.PeerAuthFailed):
        peerauth.PeerKeys(b"short")
