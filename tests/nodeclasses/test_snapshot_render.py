"""spec.serving.snapshot rendered (nodewarm/nodeclasses/snapshot.py): one shared RuntimeClass naming the handler, and
the first model's serving pod on it, with service links off, the seccomp profile and the loopback env on its vLLM
container; the further models' pods, the node objects and a profile with the field off render what they always did."""

from __future__ import annotations

import copy
import time

import pytest
import yaml

from nodewarm import instancetypes, profile
from nodewarm.api import models
from nodewarm.api import snapshot as contract
from nodewarm.api.names import MANAGED_BY, PROFILE_LABEL
from nodewarm.kubeapply import apply
from nodewarm.nodeclasses import crdvalidate, snapshot, vllm
from nodewarm.nodeclasses.render import render
from support import crds as crdsupport
from support.builders import v

CHECK = {"enabled": True, "timeout": "8m", "image": "registry.example/vllm-nodewarm:check"}
CODER = {"name": "coder", "uri": "s3://models-bucket/coder-7b/", "sizeGB": 15, "required": True}
SECCOMP = {"type": "Localhost", "localhostProfile": contract.SECCOMP_PROFILE}


def snap(enabled: bool | None, **changes) -> dict:
    """A profile with the engine check (snapshots require it) and spec.serving.snapshot.enabled as given (None: the
    field left out)."""
    if enabled is not None:
        changes["spec__serving__snapshot"] = {"enabled": enabled}
    return v(**{"spec__readiness__engineCheck": CHECK, **changes})


def checked(doc):
    p = profile.from_dict(doc)
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    return p, types


def rendered(doc) -> list[dict]:
    return render(*checked(doc)).documents


def named(docs, kind, name) -> dict:
    (d,) = [x for x in docs if x["kind"] == kind and x["metadata"]["name"] == name]
    return d


def kinds(docs, kind) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def pod(docs, name="qwen3-35b") -> dict:
    return named(docs, "Deployment", f"{name}-vllm")["spec"]["template"]["spec"]


def engine(spec) -> dict:
    (c,) = [c for c in spec["containers"] if c["name"] == contract.CONTAINER]
    return c


def test_the_runtime_class_names_the_handler_and_belongs_to_no_profile():
    rc = snapshot.runtime_class()
    assert rc == {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                  "metadata": {"name": contract.RUNTIME_CLASS, "labels": {MANAGED_BY: "nodewarm"}},
                  "handler": contract.RUNTIME_HANDLER}
    # Shared by every profile that enables snapshots: two profiles render the very same object.
    one, two = rendered(snap(True)), rendered(snap(True, metadata__name="other", spec__nodes__nodePool="gpu-other",
                                                   spec__nodes__nodeClass="gpu-other"))
    assert kinds(one, "RuntimeClass") == kinds(two, "RuntimeClass") == [rc]
    assert PROFILE_LABEL not in rc["metadata"]["labels"] and "scheduling" not in rc


def test_the_runtime_class_comes_before_every_pod_that_names_it():
    docs = rendered(snap(True))
    at = [i for i, d in enumerate(docs) if d["kind"] == "RuntimeClass"]
    assert len(at) == 1
    users = [i for i, d in enumerate(docs) if d["kind"] in ("Deployment", "PodTemplate")]
    assert users and at[0] < min(users)


def test_the_first_models_pod_is_set_up_for_a_restore():
    on, off = pod(rendered(snap(True))), pod(rendered(snap(False)))
    assert on["runtimeClassName"] == contract.RUNTIME_CLASS
    assert on["enableServiceLinks"] is False
    c = engine(on)
    assert c["securityContext"] == {"seccompProfile": SECCOMP}
    assert c["env"][-len(contract.ENGINE_ENV):] == [{"name": k, "value": val} for k, val in contract.ENGINE_ENV.items()]
    assert len({e["name"] for e in c["env"]}) == len(c["env"])        # appended, never a second value of a name
    # Nothing else of the pod changes: take those four settings back out and it is the pod without snapshots.
    back = copy.deepcopy(on)
    del back["runtimeClassName"], back["enableServiceLinks"]
    b = engine(back)
    del b["securityContext"]
    b["env"] = b["env"][:-len(contract.ENGINE_ENV)]
    assert back == off


def test_only_the_vllm_container_gets_the_seccomp_profile_and_the_env():
    publisher = {"spec__compileCache__publisher": {"image": "registry.example/vllm-nodewarm:0.21.0",
                                                   "signingKeySecret": "cc-key"},
                 "spec__compileCache__verifyKey": "A" * 43 + "="}
    on, off = pod(rendered(snap(True, **publisher))), pod(rendered(snap(False, **publisher)))
    assert [c["name"] for c in on["containers"]] == [contract.CONTAINER, "nodewarm-publish"]
    assert on["containers"][1:] == off["containers"][1:]
    assert on["initContainers"] == off["initContainers"]


def test_restorable_merges_the_security_context_and_leaves_its_input_alone():
    spec = {"containers": [{"name": "sidecar", "env": [{"name": "A", "value": "1"}]},
                           {"name": contract.CONTAINER, "securityContext": {"runAsUser": 1000,
                                                                            "allowPrivilegeEscalation": False}}]}
    before = copy.deepcopy(spec)
    out = snapshot.restorable(spec)
    assert spec == before
    assert out["containers"][0] == spec["containers"][0]
    assert out["containers"][1]["securityContext"] == {"runAsUser": 1000, "allowPrivilegeEscalation": False,
                                                       "seccompProfile": SECCOMP}
    assert out["containers"][1]["env"] == [{"name": k, "value": val} for k, val in contract.ENGINE_ENV.items()]
    with pytest.raises(LookupError, match=contract.CONTAINER):
        snapshot.restorable({"containers": [{"name": "sidecar"}]})


@pytest.mark.parametrize("changes", [{}, {"spec__readiness__engineCheck": None}],
                         ids=["with-engine-check", "without-engine-check"])
def test_off_renders_exactly_what_a_profile_without_the_field_renders(changes):
    absent, off = rendered(snap(None, **changes)), rendered(snap(False, **changes))
    # Past the WarmProfile itself (which says what the user wrote), the very same objects.
    assert off[1:] == absent[1:]
    wp = copy.deepcopy(off[0])
    assert wp["spec"]["serving"].pop("snapshot") == {"enabled": False}
    assert wp == absent[0]
    assert contract.RUNTIME_CLASS not in yaml.safe_dump_all(off[1:])
    assert "enableServiceLinks" not in yaml.safe_dump_all(off[1:])


def test_further_models_boot_as_before():
    on, off = rendered(snap(True, spec__models=[CODER])), rendered(snap(False, spec__models=[CODER]))
    assert pod(on)["runtimeClassName"] == contract.RUNTIME_CLASS
    coder = named(on, "Deployment", "qwen3-35b-coder-vllm")
    assert coder == named(off, "Deployment", "qwen3-35b-coder-vllm")
    spec = coder["spec"]["template"]["spec"]
    assert "runtimeClassName" not in spec and "enableServiceLinks" not in spec
    assert "securityContext" not in engine(spec)
    assert not {e["name"] for e in engine(spec)["env"]} & set(contract.ENGINE_ENV)
    # The model views do carry the profile's serving settings: the guard is the renderer's, not the view's.
    p, _ = checked(snap(True, spec__models=[CODER]))
    assert all(view.serving.snapshot for view in models.views(p))


@pytest.mark.parametrize("changes", [{}, {"spec__models": [CODER]}], ids=["one-model", "with-models"])
def test_on_changes_only_the_first_models_pod_and_adds_the_runtime_class(changes):
    """Nothing of this part reaches a node object: the NodePool is the same, and so is the EC2NodeClass but for
    its user data (the user data installs the handler: another part's). The engine check's PodTemplate copies the
    serving pod, and the WarmProfile echoes the field."""
    on, off = rendered(snap(True, **changes)), rendered(snap(False, **changes))
    key = lambda d: (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])  # noqa: E731
    added = [d for d in on if key(d) not in {key(o) for o in off}]
    assert added == [snapshot.runtime_class()]
    assert [key(d) for d in on if d not in added] == [key(d) for d in off]
    first = ("Deployment", "default", "qwen3-35b-vllm")
    copies = {"WarmProfile", "PodTemplate"}
    same = [(a, b) for a, b in zip([d for d in on if d not in added], off)
            if key(a) != first and a["kind"] not in copies]
    for a, b in same:
        if a["kind"] == "EC2NodeClass":
            a, b = copy.deepcopy(a), copy.deepcopy(b)
            a["spec"].pop("userData"), b["spec"].pop("userData")
        assert a == b, key(a)
    assert named(on, "NodePool", "gpu-p5") == named(off, "NodePool", "gpu-p5")
    assert vllm.pod_spec(*checked(snap(True, **changes))) == pod(on)    # what the check pod copies is this


def test_rendered_objects_pass_the_strict_crd_check():
    assert crdvalidate.validate(rendered(snap(True, spec__models=[CODER])), crdsupport.strict_crds()) == {}


def test_the_strict_check_knows_the_runtime_class_group_as_the_servers_own():
    """The strict check leaves built-in groups to the API server (the kube test below): node.k8s.io must be one, or
    the RuntimeClass fails closed as a kind no CRD describes."""
    rc = snapshot.runtime_class()
    assert crdvalidate.validate([rc], {}) == {}
    assert crdvalidate.validate([{**rc, "apiVersion": "nodes.k8s.io/v1"}], {}) != {}


@pytest.mark.kube
def test_server_accepts_the_runtime_class_and_the_pods_that_name_it(kube):
    """The v1.20 API server stores the RuntimeClass and the Deployment with the snapshot settings unpruned, and its
    RuntimeClass admission refuses the serving pod until the RuntimeClass exists (why render puts it first)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    from kubernetes.dynamic import DynamicClient
    from nodewarm_dev.testenv import kube as kubeenv

    ns = "ns-snap"
    docs = rendered(snap(True, metadata__name="qwen-snap", spec__nodes__nodePool="gpu-snap",
                         spec__nodes__nodeClass="gpu-snap", spec__serving__namespace=ns))
    docs = [d for d in docs if d["kind"] not in kubeenv.NOT_SERVED]
    core = client.CoreV1Api(kube.api_client())
    core.create_namespace({"metadata": {"name": ns}})
    serving_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "serving", "namespace": ns},
                   "spec": pod(docs, "qwen-snap")}

    # No other test creates the RuntimeClass: before it exists, admission refuses the pod (a dry run: nothing stays).
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(ns, serving_pod, dry_run="All")
    assert refused.value.status == 403 and contract.RUNTIME_CLASS in refused.value.body

    results = apply(kube.api_client(), docs)
    assert ("RuntimeClass", contract.RUNTIME_CLASS, None, "created") in \
        {(r.kind, r.name, r.namespace, r.action) for r in results}
    dyn = DynamicClient(kube.api_client())
    stored = dyn.resources.get(api_version="node.k8s.io/v1", kind="RuntimeClass").get(
        name=contract.RUNTIME_CLASS).to_dict()
    assert stored["handler"] == contract.RUNTIME_HANDLER
    assert stored["metadata"]["labels"] == {MANAGED_BY: "nodewarm"}
    dep = dyn.resources.get(api_version="apps/v1", kind="Deployment").get(name="qwen-snap-vllm", namespace=ns).to_dict()
    spec = dep["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == contract.RUNTIME_CLASS and spec["enableServiceLinks"] is False
    c = engine(spec)
    assert c["securityContext"]["seccompProfile"] == SECCOMP
    assert {e["name"]: e.get("value") for e in c["env"]}.items() >= contract.ENGINE_ENV.items()

    # Admission reads RuntimeClasses from an informer: the pod is admitted once it has seen the new one.
    deadline = time.monotonic() + 30
    while True:
        try:
            core.create_namespaced_pod(ns, serving_pod, dry_run="All")
            break
        except ApiException as e:
            if e.status != 403 or time.monotonic() > deadline:
                raise
            time.sleep(0.5)

    # Converges: a second apply changes neither.
    again = {(r.kind, r.name): r.action for r in apply(kube.api_client(), [snapshot.runtime_class()])}
    assert again == {("RuntimeClass", contract.RUNTIME_CLASS): "unchanged"}
