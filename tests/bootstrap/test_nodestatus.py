"""The node-side reporter, with the node's own kubelet identity, under real NodeRestriction."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from nodewarm.bootstrap.nodestatus import WARM_CONDITION, report_warm
from nodewarm.controller.kube import NODES, Kube
from nodewarm.api.errors import NodewarmError

pytestmark = pytest.mark.kube

NODE = "node-3"
TAINT = {"key": "nodewarm.io/warming", "effect": "NoSchedule"}


@pytest.fixture
def node(k, fresh_node):
    fresh_node(NODE, [TAINT], labels={"karpenter.sh/nodepool": "x"})
    return k


def _warm(k: Kube) -> dict:
    return next(c for c in k.get(NODES, NODE)["status"]["conditions"] if c["type"] == WARM_CONDITION)


def test_node_identity_sets_its_condition_and_annotations(kube, node):
    me = kube.api_client(kube.node_token(NODE))
    report_warm(me, NODE, False, "WeightsLoading", "streaming 67 GB", {"nodewarm.io/timeline": '{"start":"x"}'})
    first = _warm(node)
    assert (first["status"], first["reason"]) == ("False", "WeightsLoading")

    report_warm(me, NODE, True, "WeightsVerified", "67 GB verified",
                {"nodewarm.io/compile-cache": "hit", "nodewarm.io/compile-cache-reason": "key found"})
    w = _warm(node)
    assert (w["status"], w["reason"], w["message"]) == ("True", "WeightsVerified", "67 GB verified")
    ann = node.get(NODES, NODE)["metadata"]["annotations"]
    assert ann["nodewarm.io/compile-cache"] == "hit" and ann["nodewarm.io/timeline"] == '{"start":"x"}'

    report_warm(me, NODE, True, "WeightsVerified", "still warm", {})
    assert _warm(node)["lastTransitionTime"] == w["lastTransitionTime"]   # no flip, no new transition time


def test_node_identity_cannot_remove_its_own_taint(kube, node):
    me = Kube(kube.api_client(kube.node_token(NODE)))
    with pytest.raises(ApiException) as e:
        me.json_patch(NODES, NODE, [{"op": "remove", "path": "/spec/taints/0"}])
    assert e.value.status == 403 and "not allowed to modify taints" in e.value.body
    assert node.get(NODES, NODE)["spec"]["taints"][0] == TAINT


def test_another_nodes_identity_is_refused(kube, node):
    with pytest.raises(NodewarmError) as e:
        report_warm(kube.api_client(kube.node_token("node-4")), NODE, True, "WeightsVerified", "x", {"a": "b"})
    assert e.value.reason == "NodeStatusForbidden"
    assert not any(c["type"] == WARM_CONDITION for c in node.get(NODES, NODE).get("status", {}).get("conditions") or ())


GEN = {"nodewarm.io/generation": "4f2a9c1e0b7d3a65"}


def test_the_generation_label_waits_for_the_taint_to_go(kube, node):
    """Under the startup taint the label is left to the controller's untaint write; without it, written here."""
    me = kube.api_client(kube.node_token(NODE))
    report_warm(me, NODE, True, "WeightsVerified", "ok", {"nodewarm.io/warm-generation": GEN["nodewarm.io/generation"]},
                GEN, startup_taint=TAINT["key"])
    md = node.get(NODES, NODE)["metadata"]
    assert "nodewarm.io/generation" not in md["labels"] and md["annotations"]["nodewarm.io/warm-generation"]
    node.merge_patch(NODES, NODE, {"spec": {"taints": []}})
    report_warm(me, NODE, True, "WeightsVerified", "ok", {}, GEN, startup_taint=TAINT["key"])
    assert node.get(NODES, NODE)["metadata"]["labels"]["nodewarm.io/generation"] == GEN["nodewarm.io/generation"]


def test_a_taint_lifted_between_read_and_write_is_seen_on_the_retry(kube, node, monkeypatch):
    """The write is conditional on the Node it read: the controller lifting the taint in between makes it a
    409, and the retry (re-read: no taint) writes the label, so a lifted node never stays without it."""
    from nodewarm.bootstrap import nodestatus

    real, lifted = nodestatus._call, []

    def racing(api, method, path, body=None, content_type=None):
        out = real(api, method, path, body, content_type)
        if method == "GET" and not lifted:
            node.merge_patch(NODES, NODE, {"spec": {"taints": []}})      # the controller, just after our read
            lifted.append(True)
        return out

    monkeypatch.setattr(nodestatus, "_call", racing)
    report_warm(kube.api_client(kube.node_token(NODE)), NODE, True, "WeightsVerified", "ok", {}, GEN,
                startup_taint=TAINT["key"])
    assert lifted and node.get(NODES, NODE)["metadata"]["labels"]["nodewarm.io/generation"] == GEN["nodewarm.io/generation"]
