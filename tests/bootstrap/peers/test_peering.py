"""Peers before S3 end to end: two real agents with their nodes' own kubelet identities on the real API server, the
key minted and bound by the controller's code, the model in the real S3 server behind the fault proxy.

A warm node feeds a new one (S3 sends it no byte of the model), each finds the other from the Node annotations with
a watch, and a cordoned node stops serving and withdraws its annotation. With spec.models, every model of the profile
comes from the warm node, the required ones and those pulled in the background alike.
"""

from __future__ import annotations

import json
import socket

import pytest

from support.bootstrap_fixtures import RunningAgent, model_files, put_model, visible_files
from support.builders import NO_CACHE, v
from support.controller_fixtures import wait_for
from support.modelviews import folder, view
from nodewarm import profile
from nodewarm.api import generation, models
from nodewarm.api.names import MODELS_ANNOTATION, NODEPOOL_LABEL, PEER_ANNOTATION, PROFILE_LABEL, WARM_CONDITION
from nodewarm.controller.kube import NODES
from nodewarm_dev.testenv import ports

pytestmark = [pytest.mark.kube, pytest.mark.s3]
NAME, POOL = "peers-e2e", "peers-pool"


def peer_node(k, fresh_node, name: str, ip: str, profile_name: str = NAME, pool: str = POOL) -> None:
    """A node of the profile's pool, Ready, with its GPUs and its InternalIP, as the kubelet reports them."""
    fresh_node(name, [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
               labels={NODEPOOL_LABEL: pool, PROFILE_LABEL: profile_name})
    res = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "1"}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test"}
    k.request("PATCH", NODES.path(name, sub="status"),
              body={"status": {"conditions": [ready], "capacity": res, "allocatable": res,
                               "addresses": [{"type": "InternalIP", "address": ip}]}},
              content_type="application/strategic-merge-patch+json")
    k.merge_patch(NODES, name, {"spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}})


def annotation(k, node: str) -> dict | None:
    raw = (k.get(NODES, node)["metadata"].get("annotations") or {}).get(PEER_ANNOTATION)
    return json.loads(raw) if raw else None


def warm(k, node: str) -> bool:
    return any(c["type"] == WARM_CONDITION and c["status"] == "True"
               for c in k.get(NODES, node)["status"].get("conditions") or ())


def refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return False
    except OSError:
        return True


def test_a_warm_node_feeds_a_new_one_and_stops_serving_when_cordoned(
        kube, k, s3, proxy, fresh_node, warmprofile, kubelet_pulls, grant_peer_key, tmp_path):
    files = model_files(shards=2, mib_per_shard=2)
    port = ports.free_port()
    doc = v(metadata__name=NAME, spec__model={"uri": put_model(s3, files)},
            spec__compileCache__uri=NO_CACHE, spec__bootstrap__allowNonNvme=True, spec__nodes__nodePool=POOL,
            spec__serving__tensorParallelSize=1, spec__weights={"peers": {"enabled": True, "port": port}})
    p = profile.from_dict(doc)
    model = generation.model_key(p)
    peer_node(k, fresh_node, "node-5", "127.0.0.5")
    peer_node(k, fresh_node, "node-6", "127.0.0.6")
    warmprofile(doc)
    for node in ("node-5", "node-6"):
        kubelet_pulls(doc, node)

    first = RunningAgent(kube, tmp_path, "node-5", NAME)
    second = None
    try:
        # Before the controller bound it the key, a node warms from S3 and says nothing: every peer's request to it
        # would be refused.
        wait_for(lambda: warm(k, "node-5"), 60, what="node-5 Warm without a key")
        assert annotation(k, "node-5") is None
        grant_peer_key(p, ["node-5", "node-6"])
        wait_for(lambda: (annotation(k, "node-5") or {}).get("state") == "warm", 30, what="node-5 announced once keyed")
        a = annotation(k, "node-5")
        assert a["endpoint"] == f"127.0.0.5:{port}" and a["profile"] == NAME and a["model"] == model
        assert a["files"] == len(files)
        # It binds its own address only.
        assert refused("127.0.0.1", port) and not refused("127.0.0.5", port)

        proxy.reset_counters()
        second = RunningAgent(kube, tmp_path, "node-6", NAME)
        wait_for(lambda: warm(k, "node-6"), 60, what="node-6 Warm")
        # The condition is written before the agent hands its result back: wait for the hand-over too.
        wait_for(lambda: second.follower.last is not None, 30, what="node-6's result")
        result = second.follower.last
        assert result.warm and result.weights.peers["bytesFromPeers"] == sum(map(len, files.values()))
        assert result.weights.peers["byPeer"] == {"node-5": sum(map(len, files.values()))}
        assert proxy.body_bytes == 0  # S3 listed and HEADed (the checksums are S3's), and sent no model byte
        model_dir = second.mount / "nodewarm" / "models" / NAME / model
        assert visible_files(model_dir) == files
        wait_for(lambda: (annotation(k, "node-6") or {}).get("state") == "warm", 30, what="node-6 serving too")

        k.merge_patch(NODES, "node-5", {"spec": {"unschedulable": True}})  # kubectl cordon
        wait_for(lambda: annotation(k, "node-5") is None, 30, what="node-5's annotation withdrawn")
        assert refused("127.0.0.5", port)
        assert not refused("127.0.0.6", port)
    finally:
        first.close()
        if second is not None:
            second.close()


def test_a_taken_port_leaves_the_node_reading_and_its_pull_going(tmp_path):
    from nodewarm.bootstrap.peers.peering import Peering

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        p = profile.from_dict(v(metadata__name=NAME, spec__weights={"peers": {"enabled": True,
                                                                              "port": taken.getsockname()[1]}}))
        peering = Peering(None, "node-7", p)
        peering.host = "127.0.0.1"
        peering.begin(tmp_path, "m")  # raises nothing: the pull goes on
        assert peering.server is None and peering.holdings is not None
    finally:
        taken.close()


def held(k, node: str) -> dict[str, models.HeldModel]:
    return models.decode((k.get(NODES, node)["metadata"].get("annotations") or {}).get(MODELS_ANNOTATION))


def test_a_warm_node_feeds_every_model_of_the_profile_not_only_the_first(
        kube, k, s3, proxy, fresh_node, warmprofile, kubelet_pulls, grant_peer_key, tmp_path):
    """A required further model (warmed before Warm) and one that is not (warmed in the background once the node
    serves) come from the warm node as the first model does: S3 sends the new node no byte of any of them."""
    name, pool = "peers-models", "peers-models-pool"
    files = {m: model_files(shards=2, mib_per_shard=1, seed=seed) for m, seed in (("first", 31), ("b", 32), ("c", 33))}
    port = ports.free_port()
    doc = v(metadata__name=name, spec__model={"uri": put_model(s3, files["first"], prefix="models/first/")},
            spec__models=[{"name": "b", "uri": put_model(s3, files["b"], prefix="models/b/"), "sizeGB": 0.003,
                           "required": True},
                          {"name": "c", "uri": put_model(s3, files["c"], prefix="models/c/"), "sizeGB": 0.003}],
            spec__compileCache__uri=NO_CACHE, spec__bootstrap__allowNonNvme=True, spec__nodes__nodePool=pool,
            spec__serving__tensorParallelSize=1, spec__weights={"peers": {"enabled": True, "port": port}})
    p = profile.from_dict(doc)
    b, c = view(doc, "b"), view(doc, "c")
    keys = {"first": generation.model_key(p), "b": generation.model_key(b), "c": generation.model_key(c)}
    peer_node(k, fresh_node, "node-5", "127.0.0.5", name, pool)
    peer_node(k, fresh_node, "node-6", "127.0.0.6", name, pool)
    warmprofile(doc)
    for node in ("node-5", "node-6"):
        kubelet_pulls(doc, node)
    grant_peer_key(p, ["node-5", "node-6"])

    def offers_all(node: str) -> bool:
        a = annotation(k, node) or {}
        return (a.get("model"), a.get("state")) == (keys["first"], "warm") and \
            a.get("also") == {keys["b"]: "warm", keys["c"]: "warm"}

    first = RunningAgent(kube, tmp_path, "node-5", name)
    second = None
    try:
        wait_for(lambda: offers_all("node-5"), 90, what="node-5 offering all three models")
        proxy.reset_counters()
        second = RunningAgent(kube, tmp_path, "node-6", name)
        wait_for(lambda: (m := held(k, "node-6").get(c.name)) is not None and m.state == models.WARM, 90,
                 what="node-6 warm for the background model too")
        result = second.follower.last
        size = {m: sum(map(len, f.values())) for m, f in files.items()}
        # The small files all three models share (the tokenizer's) are linked from the model held, not fetched.
        linked = {"b": result.extras[b.name].linked_bytes, "c": second.follower.models.results[c.name]["linkedBytes"]}
        assert result.warm and result.weights.peers["byPeer"] == {"node-5": size["first"]}
        assert result.extras[b.name].peers["byPeer"] == {"node-5": size["b"] - linked["b"]}
        assert proxy.body_bytes == 0  # nor for the background model: S3 listed and HEADed, and sent no model byte
        assert first.follower.peering.server.stats()["bytes_served"] == sum(size.values()) - sum(linked.values())
        for m, v_name in (("b", b.name), ("c", c.name)):
            assert visible_files(folder(doc, second.mount, v_name)) == files[m]
        wait_for(lambda: offers_all("node-6"), 30, what="node-6 offering all three models in turn")
    finally:
        first.close()
        if second is not None:
            second.close()
