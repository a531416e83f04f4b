"""The engine check's rendered objects (nodewarm/nodeclasses/enginecheck.py): the check pod is the serving pod's vLLM
container with the runner in front, tolerating exactly the GPU and startup taints; the controller gets pods only in
the serving namespace; a profile without the check renders what it always did, and toggling it drifts no node. With
spec.serving.snapshot the pod runs the serving container verbatim beside a runner that only observes it."""

from __future__ import annotations

import argparse
import copy
import json

import pytest

from nodewarm import instancetypes, profile
from nodewarm.api import enginecheck as contract
from nodewarm.api import snapshot
from nodewarm.api.errors import ProfileError
from nodewarm.api.names import CONTROLLER_NAME, GPU_TAINT
from nodewarm.api.podlayout import CACHE_MOUNT
from nodewarm.api.warmprofile import engine_check_image
from nodewarm.controller import manifests
from nodewarm.karpenter import drifthash
from nodewarm.nodeclasses import enginecheck, servestart, vllm
from nodewarm.nodeclasses.render import render
from support.builders import v

PUBLISHER = {"image": "registry.example/vllm-nodewarm:0.21.0", "signingKeySecret": "cc-key"}
VERIFY = "A" * 43 + "="
CHECK_IMAGE = "registry.example/vllm-nodewarm:check"


def loaded(doc):
    p = profile.from_dict(doc)
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    return p, types


def with_publisher(**kw) -> dict:
    return v(spec__compileCache__publisher=PUBLISHER, spec__compileCache__verifyKey=VERIFY, **kw)


def by_kind(docs, kind) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


@pytest.fixture(params=["publisher", "image-only"])
def checked(request):
    """A profile with the check on: with a publisher (its image, its identity), or with only engineCheck.image."""
    if request.param == "publisher":
        doc = with_publisher(spec__readiness__engineCheck={"enabled": True, "timeout": "8m"})
    else:
        doc = v(spec__readiness__engineCheck={"enabled": True, "timeout": "8m", "image": CHECK_IMAGE})
    return loaded(doc)


def test_the_check_pod_is_the_serving_container_behind_the_runner(checked):
    p, types = checked
    serving = vllm.pod_spec(p, types)
    c_serving = serving["containers"][0]
    t = enginecheck.pod_template(p, types)
    assert t["kind"] == "PodTemplate" and t["metadata"]["namespace"] == p.serving.namespace
    assert t["metadata"]["name"] == contract.template_name(p.name)
    assert t["template"]["metadata"]["labels"] == contract.labels(p.name)
    spec = t["template"]["spec"]
    # The serving pod's identity and nothing more (none without a publisher: the namespace's default, as serving).
    assert spec.get("serviceAccountName") == serving.get("serviceAccountName")
    assert ("serviceAccountName" in spec) == (p.compile_cache.publisher is not None)
    # Exactly the GPU taint and the startup taint.
    assert spec["tolerations"] == [{"key": GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"},
                                   {"key": p.readiness.taint_key, "operator": "Exists", "effect": "NoSchedule"}]
    # No node and no generation selector: the controller binds each pod (the node has no generation label yet).
    assert "nodeSelector" not in spec and "affinity" not in spec and "nodeName" not in spec
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 8 * 60 + enginecheck.GRACE_S
    assert "initContainers" not in spec
    [c] = spec["containers"]
    assert c["name"] == contract.CONTAINER
    assert c["image"] == (PUBLISHER["image"] if p.compile_cache.publisher else CHECK_IMAGE)
    assert c["command"] == ["nodewarm", "engine-check"]
    assert c["terminationMessagePolicy"] == "File" and c["terminationMessagePath"] == contract.TERMINATION_LOG
    assert c["resources"] == c_serving["resources"] and c["resources"]["limits"]["nvidia.com/gpu"]
    assert c["volumeMounts"] == c_serving["volumeMounts"]
    weights = next(m for m in c["volumeMounts"] if m["name"] == "weights")
    assert weights["readOnly"] is True
    # The serving pod's volumes less what the check does not mount: no signing key, ever.
    assert [x["name"] for x in spec["volumes"]] == [x["name"] for x in serving["volumes"] if x["name"] != "signing-key"]
    assert "probes" not in c and "startupProbe" not in c and "ports" not in c


def test_env_is_the_serving_env_plus_strict_mode_region_and_node(checked):
    p, types = checked
    c_serving = vllm.pod_spec(p, types)["containers"][0]
    c = enginecheck.pod_template(p, types)["template"]["spec"]["containers"][0]
    n = len(c_serving["env"])
    assert c["env"][:n] == c_serving["env"]
    rest = c["env"][n:]
    assert rest == [*({"name": k, "value": val} for k, val in contract.STRICT_ENV.items()),
                    {"name": "AWS_REGION", "value": p.nodes.region},
                    {"name": "AWS_DEFAULT_REGION", "value": p.nodes.region},
                    {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]


def test_the_rendered_argv_parses_back_to_what_was_rendered(checked):
    p, types = checked
    c_serving = vllm.pod_spec(p, types)["containers"][0]
    c = enginecheck.pod_template(p, types)["template"]["spec"]["containers"][0]
    parser = argparse.ArgumentParser()
    contract.add_runner_flags(parser)
    got = contract.runner_args(parser.parse_args(c["args"]))
    assert got == enginecheck.runner_args(p, c_serving)
    assert got.engine == (*c_serving["command"], *c_serving["args"])
    assert got.timeout_s == 8 * 60 and got.port == p.serving.port and got.served_model_name == p.name
    if p.compile_cache.publisher:
        # Only the publisher's identity may mark a bundle stale; the start record is in the pod with it.
        assert got.cache_uri == p.compile_cache.uri and got.start_record == servestart.RECORD_FILE
    else:
        assert got.cache_uri is None and got.start_record is None


def test_without_snapshot_the_check_pod_is_exactly_what_it_was(checked):
    """Key for key and in order (what the API server and a diff see): the one runner container booting vLLM with the
    serving container's resources and mounts, nothing of snapshot mode. tests/fixtures/golden/engine-check.out pins
    the whole render of one profile byte for byte as well."""
    p, types = checked
    assert not p.serving.snapshot
    serving = vllm.pod_spec(p, types)
    c = serving["containers"][0]
    before = {
        **({"serviceAccountName": serving["serviceAccountName"]} if "serviceAccountName" in serving else {}),
        "restartPolicy": "Never",
        "activeDeadlineSeconds": p.readiness.engine_check.timeout_s + enginecheck.GRACE_S,
        "tolerations": enginecheck.tolerations(p, serving),
        "containers": [{
            "name": contract.CONTAINER, "image": engine_check_image(p), "command": ["nodewarm", "engine-check"],
            "args": enginecheck.runner_args(p, c).to_argv(), "env": enginecheck.env(p, c),
            "resources": c["resources"], "volumeMounts": c["volumeMounts"],
            "terminationMessagePath": contract.TERMINATION_LOG, "terminationMessagePolicy": "File"}],
        "volumes": [x for x in serving["volumes"] if x["name"] != "signing-key"],
    }
    got = enginecheck.pod_spec(p, types)
    assert json.dumps(got) == json.dumps(before)
    assert "--observe" not in got["containers"][0]["args"]


@pytest.fixture(params=["publisher", "image-only"])
def snapshotted(request):
    """The check's profiles with spec.serving.snapshot on (AL2023 nodes, the base profile's)."""
    check = {"enabled": True, "timeout": "8m"}
    if request.param == "publisher":
        doc = with_publisher(spec__readiness__engineCheck=check, spec__serving__snapshot={"enabled": True})
    else:
        doc = v(spec__readiness__engineCheck={**check, "image": CHECK_IMAGE}, spec__serving__snapshot={"enabled": True})
    p, types = loaded(doc)
    assert p.serving.snapshot
    return p, types


def test_in_snapshot_mode_the_pods_first_container_is_the_serving_container_verbatim(snapshotted):
    # The snapshot's key compares the container's name, args, env, cwd, user and image: any difference (the strict
    # mode's env, the region, the runner's image) would make the serving pod's key differ from the checkpoint's.
    p, types = snapshotted
    serving = vllm.pod_spec(p, types)
    spec = enginecheck.pod_spec(p, types)
    assert [c["name"] for c in spec["containers"]] == [snapshot.CONTAINER, contract.CONTAINER]
    assert spec["containers"][0] == serving["containers"][0]
    for k in ("runtimeClassName", "enableServiceLinks", "securityContext"):
        assert spec.get(k) == serving.get(k), k
    # Still no init container (the agent asks once its copy is complete), no publisher, no generation selector.
    assert "initContainers" not in spec and "nodeSelector" not in spec and "affinity" not in spec
    assert [x["name"] for x in spec["volumes"]] == [x["name"] for x in serving["volumes"] if x["name"] != "signing-key"]
    assert spec["tolerations"] == enginecheck.tolerations(p, serving)
    assert spec["restartPolicy"] == "Never"
    assert spec.get("serviceAccountName") == serving.get("serviceAccountName")
    # The check, its grace, and the agent's checkpoint after the answer (which ends the vLLM container).
    assert spec["activeDeadlineSeconds"] == 8 * 60 + enginecheck.GRACE_S + enginecheck.CHECKPOINT_S


def test_the_pod_level_keys_that_shape_the_serving_process_are_copied_and_nothing_else(snapshotted, monkeypatch):
    # Whatever the serving pod sets of them (the snapshot renderer adds them); placement stays the controller's.
    p, types = snapshotted
    real = vllm.pod_spec
    extra = {"runtimeClassName": snapshot.RUNTIME_CLASS, "enableServiceLinks": False,
             "securityContext": {"runAsUser": 1000}, "priorityClassName": "serving"}
    monkeypatch.setattr(vllm, "pod_spec", lambda *a, **kw: {**real(*a, **kw), **extra})
    spec = enginecheck.pod_spec(p, types)
    assert {k: spec.get(k) for k in extra} == {**extra, "priorityClassName": None}
    monkeypatch.undo()
    off = loaded(v(spec__readiness__engineCheck={"enabled": True, "image": CHECK_IMAGE}))
    monkeypatch.setattr(vllm, "pod_spec", lambda *a, **kw: {**real(*a, **kw), **extra})
    assert not set(extra) & set(enginecheck.pod_spec(*off))        # without snapshot mode: as before


def test_in_snapshot_mode_the_runner_observes_with_no_gpu_and_only_what_it_judges(snapshotted):
    p, types = snapshotted
    c_serving = vllm.pod_spec(p, types)["containers"][0]
    _, r = enginecheck.pod_spec(p, types)["containers"]
    assert r["image"] == engine_check_image(p) and r["command"] == ["nodewarm", "engine-check"]
    assert r["terminationMessagePolicy"] == "File" and r["terminationMessagePath"] == contract.TERMINATION_LOG
    assert r["resources"] == enginecheck.OBSERVER_RESOURCES and "nvidia.com/gpu" not in json.dumps(r["resources"])
    parser = argparse.ArgumentParser()
    contract.add_runner_flags(parser)
    got = contract.runner_args(parser.parse_args(r["args"]))
    assert got.observe and got.engine == ()
    assert got == enginecheck.runner_args(p, c_serving, observe=True)
    assert (got.port, got.served_model_name, got.timeout_s) == (p.serving.port, p.name, 8 * 60)
    # It reads the baseline and the cache dirs under the compile-cache mount, and the start record with a publisher;
    # it never mounts the weights, the start script or /dev/shm.
    paths = [m["mountPath"] for m in r["volumeMounts"]]
    assert all(m in c_serving["volumeMounts"] for m in r["volumeMounts"])
    for f in (got.baseline, got.vllm_cache_root, got.inductor_dir, got.triton_dir, got.pch_dir):
        assert f.startswith(CACHE_MOUNT + "/"), f
    if p.compile_cache.publisher:
        assert paths == [servestart.RECORD_MOUNT, CACHE_MOUNT]
        assert got.start_record == servestart.RECORD_FILE and got.cache_uri == p.compile_cache.uri
    else:
        assert paths == [CACHE_MOUNT] and got.start_record is None and got.cache_uri is None
    # No vLLM env (nothing to boot), so no strict mode; the region and node for a stale marker, the namespace for the
    # message that says where vLLM's log is.
    names = [e["name"] for e in r["env"]]
    assert not set(contract.STRICT_ENV) & set(names)
    assert names == ["AWS_REGION", "AWS_DEFAULT_REGION", "NODE_NAME", contract.NAMESPACE_ENV]


def test_the_controller_gets_pods_in_the_serving_namespace_only(checked):
    p, types = checked
    docs = render(p, types, controller_namespace="ops").documents
    [role], [binding] = by_kind(docs, "Role"), by_kind(docs, "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == p.serving.namespace
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["podtemplates"], "verbs": ["get"],
         "resourceNames": [contract.template_name(p.name)]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": CONTROLLER_NAME, "namespace": "ops"}]
    assert manifests.NAME == CONTROLLER_NAME
    # The ClusterRole stays as it was: no pods anywhere else.
    assert not any("pods" in r["resources"] or "podtemplates" in r["resources"] for r in manifests.cluster_rules())


def test_off_by_default_renders_nothing_more():
    p, types = loaded(with_publisher())
    assert not p.readiness.engine_check.enabled and p.readiness.engine_check.timeout == "10m"
    on, off = (loaded(with_publisher(spec__readiness__engineCheck={"enabled": e})) for e in (True, False))
    # Past the WarmProfile itself (which says what the user wrote), the same objects; the check's appended.
    base = render(p, types).documents[1:]
    assert render(*off).documents[1:] == base
    docs = render(*on).documents[1:]
    assert docs[:len(base)] == base
    assert [d["kind"] for d in docs[len(base):]] == ["Role", "RoleBinding", "PodTemplate"]
    assert enginecheck.manifests(p, types) == []


@pytest.mark.parametrize("mode", ["karpenter", "automode"])
def test_toggling_the_check_changes_no_node_object_and_no_drift_hash(mode):
    def node_objects(enabled: bool):
        doc = v(mode, spec__compileCache__publisher=PUBLISHER, spec__compileCache__verifyKey=VERIFY,
                spec__readiness__engineCheck={"enabled": enabled})
        p, types = loaded(doc)
        docs = render(p, types).documents
        return [d for d in docs if d["kind"] in ("NodePool", "EC2NodeClass", "NodeClass", "DaemonSet")]

    off, on = node_objects(False), node_objects(True)
    assert on == off
    for a, b in zip(off, on):
        if a["kind"] in ("NodePool", "EC2NodeClass"):
            assert drifthash.stamped_hash(a).value == drifthash.stamped_hash(b).value


# --- the profile's checks --------------------------------------------------------------------------------------


def test_a_timeout_the_deadline_leaves_no_room_for_is_refused():
    with pytest.raises(ProfileError) as e:
        loaded(with_publisher(spec__readiness__engineCheck={"enabled": True, "timeout": "19m"}))
    assert e.value.field == "spec.readiness.engineCheck.timeout"
    assert "spec.readiness.deadline (20m)" in str(e.value) and "at most 18m" in str(e.value)
    with pytest.raises(ProfileError, match="lengthen the deadline"):
        loaded(with_publisher(spec__readiness__deadline="2m", spec__readiness__engineCheck={"enabled": True,
                                                                                           "timeout": "1m"}))
    # Off, the timeout is not the deadline's business.
    loaded(with_publisher(spec__readiness__engineCheck={"enabled": False, "timeout": "19m"}))
    loaded(with_publisher(spec__readiness__engineCheck={"enabled": True, "timeout": "18m"}))


def test_the_check_needs_an_image_with_nodewarm():
    with pytest.raises(ProfileError) as e:
        loaded(v(spec__readiness__engineCheck={"enabled": True}))
    assert e.value.field == "spec.readiness.engineCheck.image"
    assert "compileCache.publisher" in str(e.value)
    p, _ = loaded(v(spec__readiness__engineCheck={"enabled": True, "image": CHECK_IMAGE}))
    assert p.readiness.engine_check.image == CHECK_IMAGE
    p, _ = loaded(with_publisher(spec__readiness__engineCheck={"enabled": True, "image": CHECK_IMAGE}))
    assert enginecheck.pod_template(p)["template"]["spec"]["containers"][0]["image"] == CHECK_IMAGE


@pytest.mark.parametrize("field, value", [("timeout", "10 minutes"), ("timeout", "0m"), ("enabled", "yes"),
                                          ("image", ""), ("imag", "x")])
def test_the_schema_refuses_bad_fields(field, value):
    with pytest.raises(ProfileError) as e:
        profile.from_dict(with_publisher(spec__readiness__engineCheck={"enabled": True, field: value}))
    assert "spec.readiness.engineCheck" in e.value.field


@pytest.mark.kube
def test_the_api_server_accepts_the_rendered_objects(kube, k):
    """A server-side dry run of the PodTemplate (snapshot mode's too), Role and RoleBinding: the real API server's
    validation."""
    from nodewarm.controller.kube import PODTEMPLATES
    from support.controller_fixtures import uniq
    from support.rbac import KINDS, apply_replacing

    ns = uniq("llm")
    apply_replacing(k, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}])
    p, types = loaded(with_publisher(spec__serving__namespace=ns, spec__readiness__engineCheck={"enabled": True}))
    snap = loaded(with_publisher(spec__serving__namespace=ns, spec__readiness__engineCheck={"enabled": True},
                                 spec__serving__snapshot={"enabled": True}))
    for d in [*enginecheck.manifests(p, types), enginecheck.pod_template(*snap)]:
        res = KINDS.get(d["kind"]) or PODTEMPLATES
        out = k.request("POST", res.path(None, ns), query={"dryRun": "All"}, body=copy.deepcopy(d))
        assert out["metadata"]["name"] == d["metadata"]["name"]
        if d["kind"] == "PodTemplate":
            # Nothing the server would drop or rewrite: the template comes back as rendered (plus defaults).
            assert out["template"]["spec"]["containers"][0]["args"] == d["template"]["spec"]["containers"][0]["args"]
            assert out["template"]["spec"]["tolerations"] == d["template"]["spec"]["tolerations"]
            assert [c["name"] for c in out["template"]["spec"]["containers"]] == [
                c["name"] for c in d["template"]["spec"]["containers"]]
