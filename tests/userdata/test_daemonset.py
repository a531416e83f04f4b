"""The bootstrap DaemonSet for Bottlerocket / Auto Mode: its shape, and the real apiserver accepting it."""

from __future__ import annotations

import pytest

from nodewarm.userdata.daemonset import NAME, STATE_DIR, manifests
from nodewarm.userdata.errors import UserDataInvalid
from nodewarm.userdata.launch import BootstrapLaunch

READINESS_TAINT = "readiness.k8s.io/model-cache-warm"


def launch() -> BootstrapLaunch:
    return BootstrapLaunch(profile="llama-8b", cache_mount="/mnt/.ephemeral")


def render(**overrides) -> list[dict]:
    kwargs = dict(nodepool="gpu-a", image="nodewarm:0.1.0", readiness_taint_key=READINESS_TAINT,
                  namespace="nodewarm-system")
    return manifests(launch(), **{**kwargs, **overrides})


def daemonset(docs: list[dict]) -> dict:
    return next(d for d in docs if d["kind"] == "DaemonSet")


def test_objects_in_apply_order():
    assert [d["kind"] for d in render()] == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                             "Role", "RoleBinding", "ValidatingAdmissionPolicy",
                                             "ValidatingAdmissionPolicyBinding", "DaemonSet"]


def test_its_own_namespace_is_the_only_one_labelled_privileged():
    ns = render()[0]
    assert ns["metadata"]["name"] == "nodewarm-system"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert {d["metadata"].get("namespace") for d in render() if d["kind"] in ("ServiceAccount", "DaemonSet")} == \
        {"nodewarm-system"}


def test_selected_by_nodepool_and_tolerating_only_readiness_and_gpu_taints():
    pod = daemonset(render())["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"karpenter.sh/nodepool": "gpu-a", "kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [{"key": READINESS_TAINT, "operator": "Exists"},
                                  {"key": "nvidia.com/gpu", "operator": "Exists"}]
    # A key-less Exists toleration would tolerate every taint.
    assert all(t.get("key") for t in pod["tolerations"])


def test_the_agent_is_one_unprivileged_container_writing_only_the_nvme_hostpath():
    pod = daemonset(render())["spec"]["template"]["spec"]
    assert "initContainers" not in pod          # the agent keeps running: it follows its WarmProfile
    [agent] = pod["containers"]
    assert agent["command"] == ["nodewarm"] and agent["args"] == [*launch().bootstrap_argv(), "--state-dir", STATE_DIR]
    # Its result file goes to the pod's writable /tmp (an emptyDir): the root filesystem is read-only.
    assert agent["args"] == ["bootstrap", "run", "--profile", "llama-8b", "--mount", "/mnt/.ephemeral",
                             "--state-dir", "/tmp/nodewarm"]
    assert {"name": "tmp", "mountPath": "/tmp"} in agent["volumeMounts"]
    sc = agent["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert agent["volumeMounts"][0] == {"name": "nvme", "mountPath": "/mnt/.ephemeral",
                                        "mountPropagation": "HostToContainer"}
    assert pod["volumes"][0] == {"name": "nvme", "hostPath": {"path": "/mnt/.ephemeral", "type": "Directory"}}
    assert [v.get("hostPath") for v in pod["volumes"][1:]] == [None]          # the only hostPath is the mount
    # No region: the agent reads its Node's region label (pods on Auto Mode cannot reach instance metadata). Its own
    # pod exactly (namespace, name, uid): that pod mounts the whole NVMe, and is no user of the models there.
    assert agent["env"] == [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}} for name, path in (
        ("NODE_NAME", "spec.nodeName"), ("POD_NAMESPACE", "metadata.namespace"), ("POD_NAME", "metadata.name"),
        ("POD_UID", "metadata.uid"))]


def test_rbac_reports_status_but_cannot_touch_taints():
    role = next(d for d in render() if d["kind"] == "ClusterRole")
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {("nodes", "get"), ("nodes/status", "patch"), ("warmprofiles", "get"), ("warmprofiles", "watch"),
                       ("pods", "list")}


def test_it_may_watch_pods_only_in_its_own_namespace():
    """The image pre-pull pod lives there; a watch on every pod of the cluster would be more than it needs."""
    role = next(d for d in render() if d["kind"] == "Role")
    binding = next(d for d in render() if d["kind"] == "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "nodewarm-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": "nodewarm-system"}]


def test_service_account_annotations_for_irsa():
    sa = render(service_account_annotations={"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"})[1]
    assert sa["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}


@pytest.mark.parametrize("pool", ["GPU", "a_b", "x" * 60, ""])
def test_nodepool_names_that_cannot_name_the_daemonset_are_refused(pool):
    with pytest.raises(UserDataInvalid, match="NodePool name"):
        render(nodepool=pool)


@pytest.mark.kube
def test_the_apiserver_accepts_it_and_rbac_holds(kube):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    admin = kube.api_client()
    core = client.CoreV1Api(admin)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="nodewarm-ds-test")))
    # v1.20 serves no ValidatingAdmissionPolicy; test_admission_policy evaluates its CEL.
    docs = render(namespace="nodewarm-ds-test", nodepool="gpu-ds-test", with_admission_policy=False)[1:]
    # Applied, not created: the cluster-scoped ClusterRole may already exist from another test (or profile).
    from nodewarm.kubeapply import apply

    apply(admin, docs)
    stored = client.AppsV1Api(admin).read_namespaced_daemon_set("nodewarm-bootstrap-gpu-ds-test", "nodewarm-ds-test")
    assert stored.spec.template.spec.containers[0].security_context.privileged is False
    assert stored.spec.template.spec.volumes[0].host_path.type == "Directory"

    node_name = "nodewarm-ds-test-node"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node_name), spec=client.V1NodeSpec(
        taints=[client.V1Taint(key=READINESS_TAINT, effect="NoSchedule")])))
    as_pod = client.CoreV1Api(kube.api_client(kube.service_account_token("nodewarm-ds-test", NAME)))
    condition = {"status": {"conditions": [{"type": "example.com/ModelCacheWarm", "status": "True",
                                            "reason": "Warm", "message": "test"}]}}
    as_pod.patch_node_status(node_name, condition)
    conditions = as_pod.read_node(node_name).status.conditions
    assert [(c.type, c.status) for c in conditions] == [("example.com/ModelCacheWarm", "True")]
    with pytest.raises(ApiException) as denied:
        as_pod.patch_node(node_name, {"spec": {"taints": []}})
    assert denied.value.status == 403
    assert core.read_node(node_name).spec.taints[0].key == READINESS_TAINT
    # Through nodes/status the same identity writes its labels and annotations, and the API server resets
    # spec there: a taint change smuggled into the status patch is dropped, not applied.
    as_pod.patch_node_status(node_name, {"metadata": {"labels": {"nodewarm.io/generation": "g1"},
                                                      "annotations": {"nodewarm.io/compile-cache": "cold"}},
                                         "spec": {"taints": []}})
    stored = core.read_node(node_name)
    assert stored.metadata.labels["nodewarm.io/generation"] == "g1"
    assert stored.metadata.annotations["nodewarm.io/compile-cache"] == "cold"
    assert [t.key for t in stored.spec.taints][0] == READINESS_TAINT
