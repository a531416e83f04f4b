"""`nodewarm bootstrap run --once`: read the WarmProfile, weights -> compile caches -> the node's Warm
condition and generation label, as the node itself (kubelet token, NodeRestriction on), against the real S3
server and the real API server."""

from __future__ import annotations

import json

import pytest

from support.builders import NO_CACHE, v
from support.bootstrap_fixtures import model_files, node_kubeconfig, put_model
from nodewarm import profile
from nodewarm.api import generation
from nodewarm.api.names import GENERATION_LABEL
from support.launch import BUCKET, run_launch
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


@pytest.fixture(scope="module")
def small_model(s3) -> str:
    """A one-shard model, uploaded once for the tests that only read it."""
    return put_model(s3, model_files(shards=1, mib_per_shard=1))


def run_agent(kube, tmp_path, name, *extra):
    mount = tmp_path / "nvme"
    mount.mkdir(exist_ok=True)
    return main(["bootstrap", "run", "--profile", name, "--mount", str(mount), "--node-name", NODE,
                 "--kubeconfig", str(node_kubeconfig(kube, tmp_path, NODE)), "--skip-load-check", "--once",
                 "--state-dir", str(tmp_path / "state"), *extra])


def warm_condition(k):
    return next(c for c in k.get(NODES, NODE)["status"]["conditions"] if c["type"] == "nodewarm.io/Warm")


def test_warm_node_reads_its_profile_reports_weights_a_cold_cache_and_its_generation(
        kube, aws_env, node, warmprofile, kubelet_pulls, tmp_path, capsys):
    files = model_files(shards=2, mib_per_shard=1)
    uri = put_model(aws_env, files)
    key = signing.generate(tmp_path / "signing.key").public
    doc = v(metadata__name="agent-a", spec__model={"uri": uri}, spec__compileCache__uri=NO_CACHE,
            spec__compileCache__verifyKey=key, spec__bootstrap__allowNonNvme=True)
    warmprofile(doc)
    kubelet_pulls(doc, NODE)
    rc = run_agent(kube, tmp_path, "agent-a", "--json")
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["warm"] is True
    assert out["weights"]["files"] == len(files) and out["weights"]["ok"]
    p = profile.from_dict(doc)
    # The weights went where the rendered Deployment's hostPath points, relative to this node's mount.
    assert out["weights"]["dest"] == str(tmp_path / "nvme" / "nodewarm" / "models" / "agent-a" / generation.model_key(p))
    cond = warm_condition(node)
    assert (cond["status"], cond["reason"]) == ("True", "WeightsVerified")
    assert "compile will be cold" in cond["message"]
    got = node.get(NODES, NODE)["metadata"]
    # Still under the startup taint: the generation is recorded, and labelled by the controller as it lifts the
    # taint (a label now would make the scheduler try the vLLM pods against the taint and back off).
    assert got["annotations"]["nodewarm.io/warm-generation"] == generation.generation(p) == out["generation"]
    assert GENERATION_LABEL not in (got.get("labels") or {})
    assert got["annotations"]["nodewarm.io/compile-cache"] == "cold"
    # The agent keys with the serving image's software, never its own torch: none published yet -> RuntimeUnknown.
    assert got["annotations"]["nodewarm.io/compile-cache-reason"] == "RuntimeUnknown"
    # The baseline the publisher sidecar judges serving against, where the rendered pod mounts it.
    baseline = json.loads((tmp_path / "nvme" / "compile-cache" / "nodewarm-baseline.json").read_text())
    assert (baseline["restored"], baseline["reason"]) == (False, "RuntimeUnknown")
    assert got["annotations"]["nodewarm.io/image-prepull"] == "pulled ImagePulled"
    assert set(json.loads(got["annotations"]["nodewarm.io/timeline"])) >= {
        "agent_started", "weights_started", "weights_done", "compile_cache_started", "compile_cache_cold",
        "image_prepull_started", "image_prepull_done", "warm_reported"}
    # The compile-cache phase waits for the weights' first GET: its client and imports would slow the pull's start.
    from nodewarm.bootstrap.agent import _stamp

    assert out["timeline"]["compile_cache_started"] >= _stamp(out["weights"]["first_request_at"])
    # The node reported; it did not (and could not) lift its own taint.
    assert TAINT in node.get(NODES, NODE)["spec"]["taints"]


@pytest.mark.parametrize("advertised", [False, True])
def test_warm_waits_for_the_gpus_and_says_when_they_never_came(
        kube, k, aws_env, small_model, fresh_node, warmprofile, kubelet_pulls, tmp_path, capsys, advertised):
    """A p5 node (8 GPUs by its instance type), tensorParallelSize 2: Warm says whether the Node advertised the 2
    GPUs the vLLM pod requests. When its device plugin never registers (it does not tolerate the startup taint)
    the node is Warm all the same, with the warning: Warm=False would wait for a lift the plugin waits for."""
    fresh_node(NODE, [TAINT], labels={"node.kubernetes.io/instance-type": "p5.48xlarge"})
    if advertised:      # the kubelet, its device plugin registered (status subresource, as a kubelet writes it)
        k.request("PATCH", NODES.path(NODE, sub="status"),
                  body={"status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}}},
                  content_type="application/strategic-merge-patch+json")
    doc = v(metadata__name="agent-gpu", spec__model={"uri": small_model}, spec__compileCache__uri=NO_CACHE,
            spec__bootstrap__allowNonNvme=True, spec__serving__tensorParallelSize=2)
    warmprofile(doc)
    kubelet_pulls(doc, NODE)
    rc = run_agent(kube, tmp_path, "agent-gpu", "--json", "--gpu-wait-seconds", "1")
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["warm"] is True
    cond = warm_condition(k)
    assert cond["status"] == "True"
    ann = k.get(NODES, NODE)["metadata"]["annotations"]
    timeline = json.loads(ann["nodewarm.io/timeline"])
    if advertised:
        assert ann["nodewarm.io/gpus"] == "advertised GpusAdvertised 8/2" and "WARNING" not in cond["message"]
        assert "gpus_advertised" in timeline
    else:
        assert ann["nodewarm.io/gpus"] == "timeout GpusNotAdvertised 0/2"
        assert "WARNING GpusNotAdvertised" in cond["message"] and "device plugin" in cond["message"]
        assert "gpus_wait_ended" in timeline and "gpus_advertised" not in timeline


def test_non_nvme_destination_reports_warm_false_with_the_reason(kube, aws_env, small_model, node, warmprofile, tmp_path,
                                                                 capsys):
    warmprofile(v(metadata__name="agent-b", spec__model={"uri": small_model}, spec__compileCache__uri=NO_CACHE))
    rc = run_agent(kube, tmp_path, "agent-b")
    assert rc == 1
    assert "NotInstanceStore" in capsys.readouterr().err
    cond = warm_condition(node)
    assert (cond["status"], cond["reason"]) == ("False", "NotInstanceStore")
    assert not list((tmp_path / "nvme").rglob("*.safetensors"))
    assert GENERATION_LABEL not in (node.get(NODES, NODE)["metadata"].get("labels") or {})


def test_a_missing_profile_is_reported_on_the_node(kube, aws_env, node, warmprofile, tmp_path, capsys):
    rc = run_agent(kube, tmp_path, "agent-absent")
    assert rc == 1
    cond = warm_condition(node)
    assert (cond["status"], cond["reason"]) == ("False", "ProfileNotFound")
    assert "agent-absent" in cond["message"]


def test_without_the_rendered_rbac_the_node_cannot_read_profiles(kube, admin, k, node, tmp_path):
    """The binding `nodewarm render` emits is what grants it: without it the kubelet identity is refused."""
    from kubernetes import client

    from nodewarm.bootstrap import profilesource
    from nodewarm.api.errors import NodewarmError

    rbac = client.RbacAuthorizationV1Api(admin)
    saved = rbac.read_cluster_role_binding("nodewarm-agent:nodes")
    rbac.delete_cluster_role_binding("nodewarm-agent:nodes")
    try:
        from kubernetes import config
        api = config.new_client_from_config(config_file=str(node_kubeconfig(kube, tmp_path, NODE)))
        with pytest.raises(NodewarmError) as e:
            for _ in range(50):        # RBAC changes reach the authorizer's cache within a moment
                profilesource.get_profile(api, "anything")
                import time
                time.sleep(0.1)
        assert e.value.reason == "ProfileForbidden"
    finally:
        saved.metadata.resource_version = None
        rbac.create_cluster_role_binding(saved)


def test_an_unreadable_runtime_file_is_reported_not_raised(kube, aws_env, node, tmp_path, capsys):
    (tmp_path / "runtime.json").write_text("{not json")
    rc = run_agent(kube, tmp_path, "agent-rt", "--runtime", str(tmp_path / "runtime.json"))
    assert rc == 1 and "InvalidArgument" in capsys.readouterr().err
    cond = warm_condition(node)  # said on the node too: it would otherwise sit tainted with no reason
    assert (cond["status"], cond["reason"]) == ("False", "InvalidArgument") and "--runtime" in cond["message"]


def test_an_unexpected_exception_is_reported_as_internal_error_naming_its_type(kube, small_model, proxy, node,
                                                                              warmprofile, tmp_path, capsys):
    from nodewarm_dev.testenv.faultproxy import Headers

    warmprofile(v(metadata__name="agent-ie", spec__model={"uri": small_model}, spec__compileCache__uri=NO_CACHE,
                  spec__bootstrap__allowNonNvme=True))
    # A HEAD answer without Content-Length: nothing nodewarm has a reason for (a KeyError deep inside).
    proxy.rule = lambda r: Headers(drop=("content-length",)) if r.method == "HEAD" else None
    rc = run_agent(kube, tmp_path, "agent-ie", "--json")
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and (out["warm"], out["reason"]) == (False, "InternalError")
    cond = warm_condition(node)
    assert (cond["status"], cond["reason"]) == ("False", "InternalError") and "KeyError" in cond["message"]
    written = json.loads((tmp_path / "state" / "agent-result.json").read_text())
    assert written["reason"] == "InternalError" and "KeyError" in written["message"]


@pytest.mark.s3
def test_a_launcher_failure_is_reported_when_the_agent_next_starts(kube, aws_env, small_model, node, warmprofile,
                                                                  kubelet_pulls, tmp_path, capsys, bucket, aws_path):
    # The real launcher fails to fetch its artifact (the unit will retry) and leaves its record ...
    failed = run_launch(tmp_path, aws_env, aws_path, f"s3://{BUCKET}/absent/artifact.tar.gz", "0" * 64)
    assert failed.returncode == 1 and (tmp_path / "state" / "launch-failure").exists()
    # ... which the agent, started by a later attempt, reports on the node before warming.
    doc = v(metadata__name="agent-lf", spec__model={"uri": small_model}, spec__compileCache__uri=NO_CACHE,
            spec__bootstrap__allowNonNvme=True)
    warmprofile(doc)
    kubelet_pulls(doc, NODE)
    assert run_agent(kube, tmp_path, "agent-lf", "--json") == 0
    timeline = json.loads(capsys.readouterr().out)["timeline"]
    ann = node.get(NODES, NODE)["metadata"]["annotations"]
    launch = json.loads(ann["nodewarm.io/launch-failure"])
    assert launch["reason"] == "ArtifactFetchFailed" and "absent/artifact.tar.gz" in launch["message"]
    assert timeline["launch_failed"] == launch["time"]
    assert not (tmp_path / "state" / "launch-failure").exists()  # reported once
    assert warm_condition(node)["status"] == "True"


def test_warm_waits_for_the_serving_image_while_weights_and_cache_run_beside_it(
        kube, admin, aws_env, node, warmprofile, kubelet_pulls, tmp_path, capsys):
    """The three phases start together; the weights finish first, and the node reports Warm only once the
    kubelet says the serving image is on it (the test writes the pod status a kubelet writes: pulling, then
    the imageID)."""
    import threading

    from kubernetes import client

    from nodewarm.controller.kube import Kube

    doc = v(metadata__name="agent-img",
            spec__model={"uri": put_model(aws_env, model_files(shards=1, mib_per_shard=1, seed=11))},
            spec__compileCache__uri=NO_CACHE, spec__bootstrap__allowNonNvme=True)
    warmprofile(doc)
    pod = kubelet_pulls(doc, NODE)
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    core = client.CoreV1Api(admin)
    pulling = {"name": "serving-image", "image": doc["spec"]["serving"]["image"], "imageID": "", "ready": False,
               "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}
    core.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Pending", "initContainerStatuses": [pulling]}})
    rc = []
    t = threading.Thread(target=lambda: rc.append(run_agent(kube, tmp_path, "agent-img", "--json")), daemon=True)
    t.start()
    k = Kube(admin)
    models = tmp_path / "nvme" / "nodewarm" / "models" / "agent-img"
    for _ in range(600):           # the weights land while the image is still being pulled
        if list(models.rglob("*.safetensors")):
            break
        threading.Event().wait(0.1)
    threading.Event().wait(1.0)
    assert t.is_alive(), "the agent reported before the image was on the node"
    conds = k.get(NODES, NODE)["status"].get("conditions") or []
    assert not [c for c in conds if c["type"] == "nodewarm.io/Warm"]
    kubelet_pulls(doc, NODE)      # the kubelet finished the pull: a Running pod whose status has the imageID
    t.join(60)
    assert rc == [0]
    out = json.loads(capsys.readouterr().out)
    tl = out["timeline"]
    assert max(tl["compile_cache_started"], tl["image_prepull_started"]) < tl["weights_done"]
    assert tl["weights_done"] < tl["image_prepull_done"] <= tl["warm_reported"]
    assert out["image"]["status"] == "pulled" and out["image"]["image_id"].startswith("docker.io/vllm/vllm-openai@")
    assert warm_condition(node)["status"] == "True"


def test_on_a_node_without_the_startup_taint_the_agent_labels_its_generation_itself(
        kube, k, aws_env, fresh_node, warmprofile, kubelet_pulls, tmp_path, capsys):
    """No taint to lift (someone lifted it, or the deadline did): no controller write will come, so the agent's."""
    fresh_node(NODE, [])
    doc = v(metadata__name="agent-nt",
            spec__model={"uri": put_model(aws_env, model_files(shards=1, mib_per_shard=1, seed=12))},
            spec__compileCache__uri=NO_CACHE, spec__bootstrap__allowNonNvme=True)
    warmprofile(doc)
    kubelet_pulls(doc, NODE)
    assert run_agent(kube, tmp_path, "agent-nt") == 0
    labels = k.get(NODES, NODE)["metadata"]["labels"]
    assert labels[GENERATION_LABEL] == generation.generation(profile.from_dict(doc))
