"""`nodewarm bootstrap run`: weights -> compile caches -> the node's Warm condition, as the node itself,
against the real S3 server and the real API server (NodeRestriction on)."""

from __future__ import annotations

import json

import pytest

from bootstrap_fixtures import model_files, proxy, put_model  # noqa: F401
from test_userdata_launch import BUCKET, aws_path, bucket, run_launch  # noqa: F401
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
                 "--mount", str(mount), "--node-name", NODE, "--kubeconfig", str(kcfg), "--skip-load-check",
                 "--state-dir", str(tmp_path / "state"), *extra])


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
    cond = warm_condition(node)  # said on the node too: it would otherwise sit tainted with no reason
    assert (cond["status"], cond["reason"]) == ("False", "InvalidArgument") and "not inside --mount" in cond["message"]


def test_an_unreadable_runtime_file_is_reported_not_raised(kube, aws_env, node, tmp_path, capsys):
    (tmp_path / "runtime.json").write_text("{not json")
    rc = run_agent(kube, tmp_path, "s3://b/p/", "--runtime", str(tmp_path / "runtime.json"))
    assert rc == 1 and "InvalidArgument" in capsys.readouterr().err
    cond = warm_condition(node)
    assert (cond["status"], cond["reason"]) == ("False", "InvalidArgument") and "--runtime" in cond["message"]


def test_an_unexpected_exception_is_reported_as_internal_error_naming_its_type(kube, s3, proxy, node, tmp_path,
                                                                              capsys):
    from faultproxy import Headers

    uri = put_model(s3, model_files(shards=1, mib_per_shard=1))
    # A HEAD answer without Content-Length: nothing nodewarm has a reason for (a KeyError deep inside).
    proxy.rule = lambda r: Headers(drop=("content-length",)) if r.method == "HEAD" else None
    rc = run_agent(kube, tmp_path, uri, "--allow-non-nvme", "--json")
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and (out["warm"], out["reason"]) == (False, "InternalError")
    cond = warm_condition(node)
    assert (cond["status"], cond["reason"]) == ("False", "InternalError") and "KeyError" in cond["message"]
    written = json.loads((tmp_path / "state" / "agent-result.json").read_text())
    assert written["reason"] == "InternalError" and "KeyError" in written["message"]


@pytest.mark.s3
def test_a_launcher_failure_is_reported_when_the_agent_next_starts(kube, aws_env, node, tmp_path, capsys,
                                                                  bucket, aws_path):
    # The real launcher fails to fetch its artifact (the unit will retry) and leaves its record ...
    failed = run_launch(tmp_path, aws_env, aws_path, f"s3://{BUCKET}/absent/artifact.tar.gz", "0" * 64)
    assert failed.returncode == 1 and (tmp_path / "state" / "launch-failure").exists()
    # ... which the agent, started by a later attempt, reports on the node before warming.
    uri = put_model(aws_env, model_files(shards=1, mib_per_shard=1))
    assert run_agent(kube, tmp_path, uri, "--allow-non-nvme", "--json") == 0
    timeline = json.loads(capsys.readouterr().out)["timeline"]
    ann = node.get(NODES, NODE)["metadata"]["annotations"]
    launch = json.loads(ann["nodewarm.io/launch-failure"])
    assert launch["reason"] == "ArtifactFetchFailed" and "absent/artifact.tar.gz" in launch["message"]
    assert timeline["launch_failed"] == launch["time"]
    assert not (tmp_path / "state" / "launch-failure").exists()  # reported once
    assert warm_condition(node)["status"] == "True"
