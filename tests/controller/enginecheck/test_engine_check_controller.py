"""The engine check's controller side against the real kube-apiserver: the controller, running as its own
ServiceAccount with the RBAC it ships plus the Role `nodewarm render` adds for the check (a minted token, not admin),
creates the check pod for a node's request from the applied PodTemplate, replaces it for a newer request, deletes it
once the node reports the outcome, and cannot create pods in a namespace without that Role.

There is no kubelet: the agent's annotations are written with the node's own identity, and the pod's terminated
status as the kubelet would write it."""

from __future__ import annotations

import json

import pytest

from nodewarm.api import enginecheck as contract
from nodewarm.api.decisions import EventReason
from nodewarm.bootstrap.nodestatus import report_warm
from nodewarm.controller.kube import NODES, PODS, PODTEMPLATES, Kube
from nodewarm.nodeclasses import enginecheck
from support.controller_fixtures import TAINT, events_for, installed, running, taint_keys, uniq, wait_for
from support.rbac import apply_replacing

pytestmark = pytest.mark.kube

IMAGE = "registry.example/vllm-nodewarm:check"
NODE = "node-6"          # one of the session API server's kubelet identities (tests/conftest.py KUBE_NODE_NAMES)


def namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def check_pods(k: Kube, ns: str, profile: str) -> dict[str, dict]:
    items = k.list(PODS, ns, labelSelector=contract.label_selector(profile))["items"]
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def ask(node_k: Kube, node: str, value: str) -> None:
    """The agent's write on its own Node (NodeRestriction lets a node change its annotations)."""
    node_k.merge_patch(NODES, node, {"metadata": {"annotations": {contract.REQUEST_ANNOTATION: value}}})


def reasons(k: Kube, node: str) -> list[str]:
    return [e["reason"] for e in events_for(k, "Node", node)]


@pytest.fixture
def checked(kube, k):
    """A profile with the engine check installed in a fresh serving namespace, and the node's own client:
    (serving namespace, node client, the Installed profile)."""
    serving = uniq("llm")
    apply_replacing(k, [namespace(serving)])
    node_k = Kube(kube.api_client(kube.node_token(NODE)))
    with installed(k, user_data=None, user_startup_taints=(), spec__serving__namespace=serving,
                   spec__readiness__engineCheck={"enabled": True, "image": IMAGE}) as inst:
        yield serving, node_k, inst


@pytest.fixture
def controller_sa(kube, k):
    """The controller's shipped RBAC in its own namespace, and a client with a token minted for its ServiceAccount."""
    ns = uniq("nodewarm")
    return ns, kube.api_client(kube.controller_token(ns))


def test_the_controller_creates_replaces_and_deletes_the_check_pod(kube, k, fresh_node, controller_sa, checked):
    ctrl_ns, sa_client = controller_sa
    serving, node_k, inst = checked
    p = inst.profile
    role, binding, template = enginecheck.manifests(p, controller_namespace=ctrl_ns)
    apply_replacing(k, [role, binding])
    k.create(PODTEMPLATES, template, serving)
    node = fresh_node(NODE, [{"key": TAINT, "effect": "NoSchedule"}], {"karpenter.sh/nodepool": inst.pool})
    sa = Kube(sa_client)
    with running(sa_client) as c:
        ask(node_k, NODE, contract.Request("r1", "2027-01-15T08:00:00.000Z").to_json())
        first = contract.pod_name(p.name, NODE, "r1")
        pods = wait_for(lambda: check_pods(k, serving, p.name), what="the check pod created")
        assert list(pods) == [first]
        pod = pods[first]
        md, spec = pod["metadata"], pod["spec"]
        assert md["annotations"][contract.REQUEST_ID_ANNOTATION] == "r1"
        assert md["annotations"][contract.NODE_ANNOTATION] == NODE
        assert md["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"] == [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]
        # What was applied is what runs: the live template's container, argv and tolerations.
        live = k.get(PODTEMPLATES, template["metadata"]["name"], serving)["template"]["spec"]
        assert spec["containers"][0]["args"] == live["containers"][0]["args"]
        assert spec["containers"][0]["image"] == IMAGE and spec["restartPolicy"] == "Never"
        # The API server's DefaultTolerationSeconds adds its not-ready/unreachable ones to every pod, after ours.
        assert spec["tolerations"][:len(live["tolerations"])] == live["tolerations"]
        wait_for(lambda: EventReason.ENGINE_CHECK_STARTED in reasons(k, NODE), what="EngineCheckStarted")

        # The kubelet ran it and recorded the runner's Result as the termination message.
        result = contract.Result(False, contract.Reason.COMPILE_CACHE_NOT_LOADED, "vLLM compiled again",
                                 compile_cache="miss", log_tail=("loading weights", "compiling graph 1/3"))
        # A patch of the status alone, as a kubelet writes it: the pod read above may have changed since (a PUT
        # of that copy met a 409 once).
        k.merge_patch(PODS, first, {"status": {"phase": "Failed", "containerStatuses": [{
            "name": contract.CONTAINER, "ready": False, "restartCount": 0, "image": IMAGE, "imageID": "",
            "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": result.to_json()}}}]}},
                      sub="status", namespace=serving)

        # The agent asks again (a newer request): the old pod goes, the new one comes.
        ask(node_k, NODE, contract.Request("r2", "2027-01-15T08:05:00.000Z").to_json())
        second = contract.pod_name(p.name, NODE, "r2")
        wait_for(lambda: list(check_pods(k, serving, p.name)) == [second], what="the pod of request r2 only")
        wait_for(lambda: EventReason.ENGINE_CHECK_SUPERSEDED in reasons(k, NODE), what="EngineCheckSuperseded")

        # The outcome: Warm=False with the reason, and the Outcome in the annotation; the pod is deleted.
        outcome = contract.Outcome.of("r2", result)
        report_warm(node_k.api, NODE, False, outcome.reason, outcome.message, {})
        ask(node_k, NODE, outcome.to_json())
        wait_for(lambda: check_pods(k, serving, p.name) == {}, what="the check pod deleted after the outcome")
        failed = wait_for(lambda: [e for e in events_for(k, "Node", NODE)
                                   if e["reason"] == EventReason.ENGINE_CHECK_FAILED], what="EngineCheckFailed")
        assert failed[0]["type"] == "Warning"
        assert failed[0]["message"].startswith("CompileCacheNotLoaded: vLLM compiled again")
        assert failed[0]["message"].endswith("loading weights\ncompiling graph 1/3")
        m = c.metrics.engine_checks
        assert m.labels(inst.pool, "failed", "CompileCacheNotLoaded")._value.get() == 1
        assert m.labels(inst.pool, "started", "")._value.get() == 2
        assert c.metrics.reconcile_errors.labels("check")._value.get() == 0
        # A failed check is a node that is not Warm: the taint stays for readiness.deadline to act on.
        assert TAINT in taint_keys(k, NODE)

        # The shipped ClusterRole still has no pods: only the serving namespace's Role lets it.
        with pytest.raises(Exception) as e:
            sa.list(PODS, "default")
        assert getattr(e.value, "status", None) == 403

        # A node that goes takes its check pod with it.
        ask(node_k, NODE, contract.Request("r3", "2027-01-15T08:10:00.000Z").to_json())
        wait_for(lambda: list(check_pods(k, serving, p.name)) == [contract.pod_name(p.name, NODE, "r3")],
                 what="the pod of request r3")
        k.delete(NODES, NODE)
        wait_for(lambda: check_pods(k, serving, p.name) == {}, what="the check pod deleted with its node")
        assert m.labels(inst.pool, "node_gone", "")._value.get() == 1
    k.delete(PODTEMPLATES, template["metadata"]["name"], serving)


def test_without_the_role_no_pod_is_created_and_the_node_is_told(kube, k, fresh_node, controller_sa, checked):
    ctrl_ns, sa_client = controller_sa
    serving, node_k, inst = checked
    p = inst.profile
    # The PodTemplate is there (applied by someone else), the Role is not.
    template = enginecheck.pod_template(p)
    k.create(PODTEMPLATES, template, serving)
    fresh_node(NODE, [{"key": TAINT, "effect": "NoSchedule"}], {"karpenter.sh/nodepool": inst.pool})
    with running(sa_client) as c:
        ask(node_k, NODE, contract.Request("r1", "2027-01-15T08:00:00.000Z").to_json())
        told = wait_for(lambda: [e for e in events_for(k, "Node", NODE)
                                 if e["reason"] == EventReason.ENGINE_CHECK_NOT_STARTED],
                        what="EngineCheckNotStarted")
        assert told[0]["type"] == "Warning" and serving in told[0]["message"]
        assert "Role" in told[0]["message"]
        assert c.metrics.engine_checks.labels(inst.pool, "not_started", "")._value.get() == 1
    assert check_pods(k, serving, p.name) == {}
    # Nor could it, by hand: its token may not create a pod there.
    body = json.loads(json.dumps(template["template"]))
    with pytest.raises(Exception) as e:
        Kube(sa_client).create(PODS, {"apiVersion": "v1", "kind": "Pod",
                                      "metadata": {"name": "x", "namespace": serving}, **body}, serving)
    assert getattr(e.value, "status", None) == 403
    k.delete(PODTEMPLATES, template["metadata"]["name"], serving)
