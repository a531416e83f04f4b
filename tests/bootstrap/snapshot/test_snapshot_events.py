"""The handler's decisions as Events (nodewarm/bootstrap/snapshot/events.py): which record becomes which Event, and
the agent posting them as the node itself against the real API server, each record once."""

from __future__ import annotations

import json
import threading

import pytest

from nodewarm.bootstrap.snapshot import events
from nodewarm.bootstrap.snapshot.store import Store

NODE = "node-6"          # one of the API server's kubelet identities (tests/conftest.py KUBE_NODE_NAMES)


def _record(reason: str, result: str = "Booted", pod: str = "serving/tiny-vllm-abc") -> dict:
    return {"result": result, "reason": reason, "message": f"booting instead: {reason} because", "pod": pod,
            "container": "vllm", "containerID": "c1", "seconds": 0.4, "at": 1.8e9}


@pytest.mark.parametrize("reason, kind", [("Restored", "Normal"), ("NoSnapshot", "Normal"),
                                          ("KeyMismatch", "Warning"), ("SnapshotCorrupt", "Warning"),
                                          ("NoCRIU", "Warning"), ("RestoreFailed", "Warning")])
def test_a_snapshot_there_but_not_used_is_a_warning_on_the_pod(reason, kind):
    ev = events.event(_record(reason), NODE)
    assert ev["type"] == kind and ev["reason"] == ("SnapshotCorrupt" if reason == "SnapshotCorrupt"
                                                   else f"Snapshot{reason}")
    assert ev["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "serving",
                                    "name": "tiny-vllm-abc", "fieldPath": "spec.containers{vllm}"}
    assert ev["metadata"]["namespace"] == "serving" and ev["source"] == {"component": "nodewarm-agent", "host": NODE}
    assert ev["message"].startswith("container vllm: booting instead") and ev["firstTimestamp"].startswith("2027-")


def test_a_record_that_names_no_pod_or_another_container_is_no_event():
    assert events.event(_record("NoSnapshot", pod="/"), NODE) is None
    assert events.event({**_record("NoSnapshot"), "container": "start-script"}, NODE) is None


@pytest.mark.kube
def test_the_agent_as_the_node_posts_each_decision_once(kube, k, tmp_path):
    from kubernetes import client as kc

    ns = f"snap-events-{tmp_path.name[-6:].lower().replace('_', '-')}"
    kc.CoreV1Api(kube.api_client()).create_namespace({"metadata": {"name": ns}})
    store = Store(tmp_path / "store").open()
    store.record_outcome("c1", _record("KeyMismatch", pod=f"{ns}/tiny-vllm-1"))
    store.record_outcome("c2", _record("Restored", "Restored", pod=f"{ns}/tiny-vllm-2"))
    (store.root / "outcomes" / "c3.json").write_text("{not json")
    reporter = events.Reporter(kube.api_client(kube.node_token(NODE)), NODE, store.root, threading.Event())

    assert reporter.poll() == 2
    assert reporter.poll() == 0, "each record is posted once"
    assert list((store.root / "outcomes").iterdir()) == []
    got = kc.CoreV1Api(kube.api_client()).list_namespaced_event(ns).items
    said = sorted((e.involved_object.name, e.reason, e.type) for e in got)
    assert said == [("tiny-vllm-1", "SnapshotKeyMismatch", "Warning"), ("tiny-vllm-2", "SnapshotRestored", "Normal")]
    assert all(e.source.host == NODE and json.dumps(e.message).count("container vllm") == 1 for e in got)
