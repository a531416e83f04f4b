"""The node agent's side of the engine check, as the node itself (kubelet token, NodeRestriction on) against the real
API server and S3: it asks on its own Node, reads the check pod's answer from the pod's status, and reports Warm by it
(the test plays the controller's create and the kubelet's status write; the controller's own part is in
tests/controller/test_engine_check.py, vLLM's in tests/engine/test_engine_check.py). Without engineCheck the agent
never asks. And the pure reading of a check pod, whatever the kubelet left in it."""

from __future__ import annotations

import json
import threading

import pytest

from nodewarm import profile
from nodewarm.api import enginecheck
from nodewarm.api.enginecheck import Reason, Result
from nodewarm.bootstrap.enginecheck import request
from nodewarm.controller.kube import NODES, PODS
from support import checkpod
from support.bootstrap_fixtures import model_files, put_model
from support.builders import NO_CACHE, v

NODE = "node-6"          # one of the API server's kubelet identities (tests/conftest.py KUBE_NODE_NAMES)
TAINT = {"key": "nodewarm.io/warming", "effect": "NoSchedule"}
IMAGE = "registry.example/vllm-nodewarm:0.32.0"


def _pod(name: str, request_id: str, state: dict | None = None, **status) -> dict:
    st = {"containerStatuses": [{"name": enginecheck.CONTAINER, "state": state}]} if state else {}
    return {"metadata": {"name": name, "annotations": {enginecheck.REQUEST_ID_ANNOTATION: request_id}},
            "status": {**st, **status}}


def test_a_terminated_check_is_read_from_its_termination_message():
    r = Result(True, Reason.ENGINE_SERVED, "served", compile_cache="hit", started_at=1.0, ready_at=3.5,
               first_token_at=3.75)
    pods = {"a": _pod("a", "old", {"terminated": {"exitCode": 1, "message": "{}"}}),
            "b": _pod("b", "id1", {"terminated": {"exitCode": 0, "message": r.to_json()}})}
    got = request.verdict(pods, "id1")
    assert got == r and (got.boot_s, got.first_token_s) == (2.5, 0.25)


@pytest.mark.parametrize("pod, reason", [
    (_pod("p", "id1", {"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": ""}}),
     Reason.ENGINE_BOOT_FAILED),
    (_pod("p", "id1", phase="Failed", reason="DeadlineExceeded", message="Pod was active too long"),
     Reason.ENGINE_CHECK_TIMED_OUT),
])
def test_what_the_kubelet_says_when_the_runner_could_not_is_a_result(pod, reason):
    assert request.verdict({"p": pod}, "id1").reason == reason


def test_in_snapshot_mode_a_vllm_container_that_ended_before_the_answer_is_a_boot_failure():
    # The observing runner cannot see it end; without this the agent would wait out the runner's timeout.
    from nodewarm.api.snapshot import CONTAINER as VLLM

    def pod(runner: dict, vllm: dict) -> dict:
        meta = {"name": "p", "namespace": "llm", "annotations": {enginecheck.REQUEST_ID_ANNOTATION: "id1"}}
        return {"metadata": meta,
                "status": {"containerStatuses": [{"name": VLLM, "state": vllm},
                                                 {"name": enginecheck.CONTAINER, "state": runner}]}}

    crashed = {"terminated": {"exitCode": 1, "reason": "Error"}}
    r = request.verdict({"p": pod({"running": {}}, crashed)}, "id1")
    assert (r.passed, r.reason) == (False, Reason.ENGINE_BOOT_FAILED)
    assert "exit code 1" in r.message and r.message.endswith("kubectl logs -n llm p -c vllm")
    # Still booting: no answer yet. Answered, then checkpointed (which ends vLLM): the runner's answer stands.
    assert request.verdict({"p": pod({"running": {}}, {"running": {}})}, "id1") is None
    ok = Result(True, Reason.ENGINE_SERVED, "served")
    answered = {"terminated": {"exitCode": 0, "message": ok.to_json()}}
    assert request.verdict({"p": pod(answered, {"terminated": {"exitCode": 137, "reason": "Error"}})}, "id1") == ok


def test_a_running_or_absent_pod_is_no_answer_yet_and_at_the_end_says_why():
    assert request.verdict({}, "id1") is None
    running = {"p": _pod("p", "id1", {"running": {}})}
    assert request.verdict(running, "id1") is None
    assert request.not_run(running, "id1", 720, "serving", "tiny").reason == Reason.ENGINE_CHECK_TIMED_OUT
    pulling = {"p": _pod("p", "id1", {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}})}
    r = request.not_run(pulling, "id1", 720, "serving", "tiny")
    assert r.reason == Reason.ENGINE_CHECK_NOT_RUN and "ImagePullBackOff" in r.message
    none = request.not_run({}, "id1", 720, "serving", "tiny")
    assert none.reason == Reason.ENGINE_CHECK_NOT_RUN and "tiny-engine-check" in none.message


# -- the agent, as the node ------------------------------------------------------------------------------------


@pytest.fixture
def node(k, fresh_node):
    fresh_node(NODE, [TAINT])
    return k


def _doc(name: str, uri: str, check: bool) -> dict:
    extra = {"spec__readiness__engineCheck": {"enabled": True, "timeout": "2m", "image": IMAGE}} if check else {}
    return v(metadata__name=name, spec__model={"uri": uri}, spec__compileCache__uri=NO_CACHE,
             spec__bootstrap__allowNonNvme=True, **extra)


def _answer(k, kube, p, result: Result, seen: list):
    """The controller's and the kubelet's part: the check pod, its container terminated with ``result`` as its
    termination message."""
    st = {"name": enginecheck.CONTAINER, "image": IMAGE, "imageID": "", "ready": False, "restartCount": 0,
          "state": {"terminated": {"exitCode": 0 if result.passed else 1, "message": result.to_json()}}}
    checkpod.answer(k, kube, p, NODE, [{"name": enginecheck.CONTAINER, "image": IMAGE}], [st],
                    "Succeeded" if result.passed else "Failed", seen)


def _run(kube, k, tmp_path, doc, result: Result | None):
    p = profile.from_dict(doc)
    seen: list = []
    answer = (lambda: _answer(k, kube, p, result, seen)) if result is not None else None
    rc = checkpod.run_agent(kube, tmp_path, p.name, NODE, answer, ("--json",))
    return rc, seen


def _ns(k, p):
    from nodewarm.controller.kube import Resource

    try:
        k.create(Resource("", "v1", "namespaces", "Namespace"), {"metadata": {"name": p.serving.namespace}})
    except Exception:  # noqa: BLE001 - already there
        pass


@pytest.mark.kube
@pytest.mark.s3
def test_a_passed_check_makes_the_node_warm_with_the_engines_times(kube, aws_env, node, warmprofile, kubelet_pulls,
                                                                   tmp_path, capsys):
    doc = _doc("ec-pass", put_model(aws_env, model_files(shards=1, mib_per_shard=1, seed=21)), check=True)
    _ns(node, profile.from_dict(doc))
    warmprofile(doc)
    kubelet_pulls(doc, NODE)
    served = Result(True, Reason.ENGINE_SERVED, "vLLM booted", compile_cache="cold", started_at=1e9,
                    ready_at=1e9 + 42.0, first_token_at=1e9 + 42.5)
    rc, seen = _run(kube, node, tmp_path, doc, served)
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["warm"] is True, out["message"]
    cond = next(c for c in node.get(NODES, NODE)["status"]["conditions"] if c["type"] == "nodewarm.io/Warm")
    assert (cond["status"], cond["reason"]) == ("True", Reason.ENGINE_SERVED)
    outcome = enginecheck.read_annotation(node.get(NODES, NODE)["metadata"]["annotations"][enginecheck.REQUEST_ANNOTATION])
    assert isinstance(outcome, enginecheck.Outcome)
    assert (outcome.id, outcome.state, outcome.boot_s, outcome.first_token_s) == (seen[0].id, "passed", 42.0, 0.5)
    tl = json.loads(node.get(NODES, NODE)["metadata"]["annotations"]["nodewarm.io/timeline"])
    assert tl["image_prepull_done"] <= tl["engine_check_requested"] <= tl["engine_check_passed"] <= tl["warm_reported"]
    assert tl["engine_started"] < tl["engine_ready"] < tl["engine_first_token"]


@pytest.mark.kube
@pytest.mark.s3
def test_a_failed_check_is_warm_false_with_its_reason_and_the_engines_last_lines(
        kube, aws_env, node, warmprofile, kubelet_pulls, tmp_path, capsys):
    doc = _doc("ec-fail", put_model(aws_env, model_files(shards=1, mib_per_shard=1, seed=22)), check=True)
    _ns(node, profile.from_dict(doc))
    warmprofile(doc)
    kubelet_pulls(doc, NODE)
    nofit = Result(False, Reason.MODEL_DOES_NOT_FIT, "vLLM exited with code 1 before it served: No available memory "
                   "for the cache blocks", log_tail=("INFO loading", "ValueError: No available memory for the cache "
                                                     "blocks."))
    rc, _ = _run(kube, node, tmp_path, doc, nofit)
    out = json.loads(capsys.readouterr().out)
    assert out["warm"] is False and rc != 0
    cond = next(c for c in node.get(NODES, NODE)["status"]["conditions"] if c["type"] == "nodewarm.io/Warm")
    assert (cond["status"], cond["reason"]) == ("False", Reason.MODEL_DOES_NOT_FIT)
    assert "No available memory" in cond["message"]
    outcome = enginecheck.read_annotation(node.get(NODES, NODE)["metadata"]["annotations"][enginecheck.REQUEST_ANNOTATION])
    assert outcome.state == "failed" and outcome.log_tail[-1].startswith("ValueError: No available memory")
    assert TAINT in node.get(NODES, NODE)["spec"]["taints"]


@pytest.mark.kube
@pytest.mark.s3
def test_without_engine_check_the_agent_never_asks(kube, aws_env, node, warmprofile, kubelet_pulls, tmp_path, capsys):
    doc = _doc("ec-off", put_model(aws_env, model_files(shards=1, mib_per_shard=1, seed=23)), check=False)
    warmprofile(doc)
    kubelet_pulls(doc, NODE)
    rc, _ = _run(kube, node, tmp_path, doc, None)
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["warm"] is True and out["engineCheck"] is None
    md = node.get(NODES, NODE)["metadata"]
    assert enginecheck.REQUEST_ANNOTATION not in (md.get("annotations") or {})
    assert not [k for k in json.loads(md["annotations"]["nodewarm.io/timeline"]) if k.startswith("engine")]


@pytest.mark.kube
def test_on_auto_mode_the_agents_service_account_may_follow_the_check_pods_and_nothing_more(kube, k, tmp_path):
    """The DaemonSet agent (Auto Mode, Bottlerocket) is a ServiceAccount, not the node: the rendered RBAC must let it
    list and watch the check pods in the serving namespace (a Role there), and nothing wider."""
    from nodewarm import instancetypes
    from nodewarm.nodeclasses.render import render
    from nodewarm.userdata import daemonset
    from support.controller_fixtures import uniq
    from support.rbac import apply_replacing

    doc = v("automode", metadata__name=uniq("ecam"), spec__serving__namespace=uniq("llm"),
            spec__bootstrap__namespace=uniq("nwsys"), spec__bootstrap__image="registry.example/nodewarm:0.1.0",
            spec__readiness__engineCheck={"enabled": True, "image": IMAGE})
    p = profile.from_dict(doc)
    docs = render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
    rbac = [d for d in docs if d["kind"] in ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                               "RoleBinding")]
    apply_replacing(k, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": p.serving.namespace}}] + rbac)
    sa = kube.api_client(kube.service_account_token(p.bootstrap.namespace, daemonset.NAME))
    r = Result(True, Reason.ENGINE_SERVED, "served", started_at=1.0, ready_at=2.0, first_token_at=2.1)
    name = enginecheck.pod_name(p.name, NODE, "rq1")
    answers: list = []
    # Asked before the pod exists: the answer can only come through the watch.
    t = threading.Thread(target=lambda: answers.append(request.wait(
        sa, NODE, "rq1", namespace=p.serving.namespace, profile=p.name, timeout_s=20)), daemon=True)
    t.start()
    threading.Event().wait(2.0)
    k.create(PODS, {"metadata": {"name": name, "labels": enginecheck.labels(p.name),
                                 "annotations": {enginecheck.REQUEST_ID_ANNOTATION: "rq1"}},
                    "spec": {"nodeName": NODE, "restartPolicy": "Never",
                             "containers": [{"name": enginecheck.CONTAINER, "image": IMAGE}]},
                    }, p.serving.namespace)
    k.merge_patch(PODS, name, {"status": {"phase": "Succeeded", "containerStatuses": [{
        "name": enginecheck.CONTAINER, "image": IMAGE, "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "message": r.to_json()}}}]}}, sub="status", namespace=p.serving.namespace)
    t.join(30)
    assert answers == [r], answers[0].message if answers else "no answer"
    # Nowhere else: another namespace's pods stay out of its watch.
    other = request.wait(sa, NODE, "rq1", namespace="default", profile=p.name, timeout_s=1)
    assert other.reason == Reason.ENGINE_CHECK_NOT_RUN and "may not list and watch" in other.message
