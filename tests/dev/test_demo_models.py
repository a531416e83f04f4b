"""`nodewarm demo --models 2` with the probe engine (no vLLM boots): two models warmed on each node by the real node
agents, labelled by the real controller, placed by the real kube-scheduler, then the second one rolled. Asserts on
the run's summary and on what the cluster and the nodes' disks hold before the servers stop, never on timings."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from nodewarm.api import models
from nodewarm.api.names import (CONTROLLER_NAME, CONTROLLER_NAMESPACE, GENERATION_LABEL, MODEL_LABEL_PREFIX,
                                 MODELS_ANNOTATION)
from nodewarm_dev.demo import models as demo_models
from nodewarm_dev.demo.run import MODEL_BUCKET, NAMESPACE, DemoOptions


def files_under(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".nodewarm" not in p.relative_to(folder).parts}


@pytest.mark.kube
@pytest.mark.s3
def test_two_models_are_labelled_placed_by_their_labels_and_a_roll_links_all_but_the_changed_shard(tmp_path):
    from kubernetes import client

    out = io.StringIO()
    opts = DemoOptions(nodes=2, model_mb=16, engine="probe", workdir=tmp_path / "work", out_dir=tmp_path / "out")
    with demo_models.session(opts, out) as s:
        summary, srv = s.summary, s.srv
        core = client.CoreV1Api(srv.kube.api_client())
        nodes = {n.metadata.name: n for n in core.list_node().items if n.metadata.name in summary["nodes"]}
        pods = core.list_namespaced_pod(NAMESPACE).items
        changed = srv.s3.client().head_object(Bucket=MODEL_BUCKET,
                                              Key=f"{demo_models.SECOND_PREFIX}/v2/{summary['roll']['changedFile']}")
        roll = summary["roll"]
        new_folders = {n: files_under(Path(r["newFolder"])) for n, r in roll["nodes"].items()}
        old_gone = {n: not Path(r["oldFolder"]).exists() for n, r in roll["nodes"].items()}
    text = out.getvalue()
    second = f"{summary['profile']}-{demo_models.SECOND}"
    second_key = f"{MODEL_LABEL_PREFIX}{second}"

    assert summary["ok"] and len(nodes) == 2
    # The controller that labelled them ran as its ServiceAccount under the RBAC it ships, not as admin.
    assert f"controller running as system:serviceaccount:{CONTROLLER_NAMESPACE}:{CONTROLLER_NAME};" in text
    # Each node is labelled for both models, and its agent reports both warm with those generations.
    for node in nodes.values():
        labels, report = node.metadata.labels, models.decode(node.metadata.annotations[MODELS_ANNOTATION])
        assert labels[second_key] == roll["to"] and report[second].state == models.WARM
        assert report[second].generation == roll["to"]
        first = report[summary["profile"]]
        assert first.state == models.WARM and labels[GENERATION_LABEL] == first.generation
    # Every pod, both models' and the second model's before and after the roll, went to a node labelled for it.
    placed = summary["pods"]
    assert {(x["model"], x["wants"]) for x in placed} >= {(second, roll["from"]), (second, roll["to"])}
    assert all(x["nodeLabel"] == x["wants"] for x in placed), placed
    live = [x for x in pods if not x.metadata.deletion_timestamp]
    assert {x.metadata.labels["app.kubernetes.io/instance"] for x in live} == {summary["profile"], second}
    for pod in live:
        view = pod.metadata.labels["app.kubernetes.io/instance"]
        key = GENERATION_LABEL if view == summary["profile"] else second_key
        assert nodes[pod.spec.node_name].metadata.labels[key] == pod.metadata.labels[GENERATION_LABEL]
    # The roll: every file but the changed shard linked, exactly that shard's bytes pulled, the old folder removed,
    # and the new folder holds v2 as uploaded.
    v2 = files_under(tmp_path / "work" / "second-v2")
    assert roll["changedBytes"] == changed["ContentLength"]
    for name, r in roll["nodes"].items():
        assert r["generation"] == roll["to"] and r["linkedFiles"] == r["files"] - 1 and r["linkedBytes"] > 0
        assert r["downloadedBytes"] == changed["ContentLength"]
        assert f"{second}/{Path(r['oldFolder']).name}" in r["evicted"] and old_gone[name]
        assert new_folders[name] == v2
    assert json.loads((tmp_path / "out" / "models.json").read_text())["roll"] == roll
    # What a person reads: the background warm is said, the probe says it boots no vLLM, plain text.
    assert "required: false" in text and "warms in the background once the node serves" in text
    assert "--engine probe: the pods are pause containers, no vLLM is booted" in text
    assert "\x1b" not in text and f"pulled {changed['ContentLength'] / 1e6:.2f} MB" in text
