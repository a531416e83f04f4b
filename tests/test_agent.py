"""`nodewarm bootstrap run`: weights -> compile caches -> the node's Warm condition, as the node itself,
against the real S3 server and the real API server (NodeRestriction on)."""

from __future__ import annotations

import json

import pytest

from bootstrap_fixtures import model_files, put_model
from nodewarm.bootstrap.compilecache import signing
from nodewarm.cli import main
from nodewarm.controller.kube import NODES

pytestmark = [pytest.mark.kube, pytest.mark.s3]

NODE = "node-5"
TAINT = {"key": "nodewarm.io/warming", "effect": "NoSchedule"}


@pytest.fixture
def node(k, fresh_node):
    fresh_node(NODE, [TAINT])
    return k


def run_agent(kube, tmp_path, uri, *extra):
    kcfg = kube.write_kubeconfig(tmp_path / "kubeconfig-node", kube.node_token(NODE), f"system:node:{NODE}")
    mount = tmp_path / "nvme"
    mount.mkdir(exist_ok=True)
    return main(["bootstrap", "run", "--profile", "m", "--model-uri", uri, "--dest", str(mount / "models" / "m"),
                 "--mount", str(mount), "--node-name", NODE, "--kubeconfig", str(kcfg), "--skip-load-check", *extra])


def warm_condition(k):
    return next(c for c in k.get(NODES, NODE)["status"]["conditions"] if c["type"] == "nodewarm.io/Warm")


def test_warm_node_reports_weights_and_a_cold_cache_with_its_reason(kube, aws_env, node, tmp_path, capsys):
    files = model_files(shards=2, mib_per_shard=1)
    uri = put_model(aws_env, files)
    key = signing.generate(tmp_path / "signing.key").public
    rc = run_agent(kube, tmp_path, uri, "--allow-non-nvme", "--compile-cache-uri", "s3://nocache-bucket/cc/",
                   "--verify-key", key, "--json")
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["warm"] is True
    assert out["weights"]["files"] == len(files) and out["weights"]["ok"]
    cond = warm_condition(node)
    assert (cond["status"], cond["reason"]) == ("True", "WeightsVerified")
    assert "compile will be cold" in cond["message"]
    ann = node.get(NODES, NODE)["metadata"]["annotations"]
    assert ann["nodewarm.io/compile-cache"] == "cold" and ann["nodewarm.io/compile-cache-reason"]
    assert set(json.loads(ann["nodewarm.io/timeline"])) >= {"agent_started", "weights_done", "warm_reported"}
    # The node reported; it did not (and could not) lift its own taint.
    assert TAINT in node.get(NODES, NODE)["spec"]["taints"]


def test_non_nvme_destination_reports_warm_false_with_the_reason(kube, aws_env, node, tmp_path, capsys):
    uri = put_model(aws_env, model_files(shards=1, mib_per_shard=1))
    rc = run_agent(kube, tmp_path, uri)
    assert rc == 1
    assert "NotInstanceStore" in capsys.readouterr().err
    cond = warm_condition(node)
    assert (cond["status"], cond["reason"]) == ("False", "NotInstanceStore")
    assert not list((tmp_path / "nvme").rglob("*.safetensors"))


def test_dest_outside_the_mount_is_refused_before_any_work(kube, aws_env, node, tmp_path, capsys):
    kcfg = kube.write_kubeconfig(tmp_path / "k", kube.node_token(NODE), f"system:node:{NODE}")
    rc = main(["bootstrap", "run", "--profile", "m", "--model-uri", "s3://b/p/", "--dest", str(tmp_path / "else"),
               "--mount", str(tmp_path / "nvme"), "--node-name", NODE, "--kubeconfig", str(kcfg)])
    assert rc != 0 and "not inside --mount" in capsys.readouterr().err
