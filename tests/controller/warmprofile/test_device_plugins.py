"""Device plugins that cannot start on a warming node: found (pure rule), reported on the WarmProfile by the
controller running as its own ServiceAccount with its rendered RBAC, and fixed by the patch `nodewarm render
--device-plugin-patch` prints, applied to a real DaemonSet on the real API server."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from nodewarm import profile
from nodewarm.cli import main
from nodewarm.controller.kube import DAEMONSETS, WARMPROFILES, Kube, Resource
from nodewarm.controller.warmprofile import deviceplugins as dp
from support.builders import v

TAINT_KEY = "nodewarm.io/warming"


def prof(**kw):
    return profile.from_dict(v(**{"metadata__name": "p1", **kw}))


def ds_obj(name="nvidia-device-plugin-daemonset", ns="kube-system", tolerations=(), host_path=dp.DEVICE_PLUGIN_DIR,
           image="nvcr.io/nvidia/k8s-device-plugin:v0.17.0", container="nvidia-device-plugin-ctr",
           node_selector=None, affinity_terms=None) -> dict:
    spec = {"containers": [{"name": container, "image": image}], "tolerations": [dict(t) for t in tolerations]}
    if host_path:
        spec["volumes"] = [{"name": "dp", "hostPath": {"path": host_path}}]
    if node_selector:
        spec["nodeSelector"] = node_selector
    if affinity_terms is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": t} for t in affinity_terms]}}}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


GPU_TOL = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


# -- pure: which DaemonSets are device plugins ---------------------------------------------------------------
@pytest.mark.parametrize("obj, plugin", [
    (ds_obj(), True),
    # A renamed copy (no "nvidia" anywhere) is still recognised by the kubelet socket directory it mounts.
    (ds_obj(name="gpu-thing", image="example.com/x:1", container="main", host_path="/var/lib/kubelet/device-plugins/"), True),
    # A plugin mounting a broader path is recognised by its name/image.
    (ds_obj(name="dp", host_path="/var/lib/kubelet", image="nvcr.io/nvidia/k8s-device-plugin:v0.17.0", container="c"), True),
    # Not plugins: a log shipper mounting another kubelet path, the image pre-pull DaemonSet.
    (ds_obj(name="fluent-bit", host_path="/var/lib/kubelet/pods", image="fluent/fluent-bit:3", container="fb"), False),
    (ds_obj(name="p1-image-prepull", host_path=None, image="vllm/vllm-openai:v0.21.0", container="pause"), False),
])
def test_device_plugins_are_found_by_the_socket_directory_they_mount_or_their_name(obj, plugin):
    assert dp.DaemonSetView.from_obj(obj).device_plugin is plugin


@pytest.mark.parametrize("tols, ok", [
    ([GPU_TOL], False),                                              # the usual NVIDIA manifest: GPU taint only
    ([GPU_TOL, {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}], True),
    ([{"key": TAINT_KEY, "operator": "Exists"}], True),              # any effect
    ([{"operator": "Exists"}], True),                                # tolerates everything (GPU operator default)
    ([{"key": TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}], False),
    ([{"key": TAINT_KEY, "value": "x", "effect": "NoSchedule"}], False),   # Equal "x" vs the taint's empty value
    ([{"key": TAINT_KEY, "effect": "NoSchedule"}], True),            # Equal with the empty value
    ([], False),
])
def test_toleration_matching_is_kubernetes_own(tols, ok):
    view = dp.DaemonSetView.from_obj(ds_obj(tolerations=tols))
    assert dp.tolerates(view.tolerations, {"key": TAINT_KEY, "effect": "NoSchedule"}) is ok


def test_only_plugins_that_may_run_on_the_profiles_nodes_count():
    p = prof()
    types = list(p.nodes.instance_types)
    views = [dp.DaemonSetView.from_obj(o) for o in (
        ds_obj(name="a"),                                                           # no selector: everywhere
        ds_obj(name="b", node_selector={"nvidia.com/gpu.present": "true"}),         # unknown label: may match
        ds_obj(name="c", node_selector={"karpenter.sh/nodepool": "other-pool"}),    # another pool: never here
        ds_obj(name="d", affinity_terms=[[{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                           "values": ["g4dn.xlarge"]}]]),           # other instance types
        ds_obj(name="e", affinity_terms=[[{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                           "values": ["g4dn.xlarge"]}],
                                         [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                           "values": types}]]),                     # ORed terms: the 2nd matches
        ds_obj(name="f", affinity_terms=[[{"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]}]]),
        ds_obj(name="g", tolerations=[GPU_TOL, {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]),
        ds_obj(name="fluent-bit", host_path="/var/log", image="fluent/fluent-bit:3", container="fb"),
    )]
    verdict = dp.check(views, p)
    assert verdict.plugins == ("kube-system/a", "kube-system/b", "kube-system/e", "kube-system/g")
    assert verdict.missing == ("kube-system/a", "kube-system/b", "kube-system/e")
    c = verdict.condition
    assert (c.type, c.status, c.reason) == ("DevicePluginsTolerate", "False", "MissingToleration")
    assert "kube-system/a" in c.message and TAINT_KEY in c.message and "--device-plugin-patch" in c.message
    good = dp.check([views[-2]], p).condition
    assert (good.status, good.reason) == ("True", "Tolerated")
    none = dp.check([views[2], views[-1]], p).condition
    assert (none.status, none.reason) == ("Unknown", "NoDevicePluginFound")


# -- render --device-plugin-patch ------------------------------------------------------------------------------
def _patch_from(out: str, which: int) -> tuple[list[str], list[dict]]:
    lines = [ln.lstrip("# ") for ln in out.splitlines() if "kubectl " in ln and " patch daemonset " in ln]
    argv = shlex.split(lines[which])
    return argv, json.loads(argv[argv.index("-p") + 1])


def test_render_prints_a_json_patch_that_appends_the_toleration(tmp_path, capsys):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(v(**{"metadata__name": "p1", "spec__readiness__taintKey": "example.com/warm"})))
    assert main(["render", "-f", str(f), "--device-plugin-patch", "gpu/nvidia-device-plugin"]) == 0
    out = capsys.readouterr().out
    argv, ops = _patch_from(out, 0)
    assert argv[:6] == ["kubectl", "-n", "gpu", "patch", "daemonset", "nvidia-device-plugin"] and "--type=json" in argv
    assert ops == [{"op": "add", "path": "/spec/template/spec/tolerations/-",
                    "value": {"key": "example.com/warm", "operator": "Exists", "effect": "NoSchedule"}}]
    _, ops2 = _patch_from(out, 1)
    assert ops2[0]["path"] == "/spec/template/spec/tolerations" and ops2[0]["value"] == [ops[0]["value"]]


# -- the controller, as its ServiceAccount, on the real API server ----------------------------------------------
@pytest.mark.kube
def test_controller_reports_a_plugin_missing_the_toleration_and_the_rendered_patch_fixes_it(kube, tmp_path, capsys):
    from support.controller_fixtures import events_for, installed, running, uniq, wait_for

    admin = kube.api_client()
    ak = Kube(admin)
    ns = uniq("nodewarm")
    sa_client = kube.api_client(kube.controller_token(ns))
    plugin_ns = uniq("gpu")
    ak.create(Resource("", "v1", "namespaces", "Namespace"), {"metadata": {"name": plugin_ns}})
    name = "nvidia-device-plugin-daemonset"
    ds_res = Resource("apps", "v1", "daemonsets", "DaemonSet", namespaced=True)
    ak.create(ds_res, ds_obj(name=name, ns=plugin_ns, tolerations=[GPU_TOL]), plugin_ns)
    # A namesake elsewhere that is no device plugin must not be confused with it (the cache keys namespace/name).
    ak.create(ds_res, ds_obj(name=name, ns=ns, host_path="/var/log", image="busybox", container="x"), ns)

    def cond(prof_name):
        st = ak.get(WARMPROFILES, prof_name).get("status") or {}
        return next((c for c in st.get("conditions") or () if c["type"] == dp.CONDITION), None)

    try:
        with installed(ak, user_data=None, user_startup_taints=()) as inst, running(sa_client) as c:
            key = f"{plugin_ns}/{name}"
            bad = wait_for(lambda: (x := cond(inst.name)) and x["status"] == "False" and key in x["message"] and x,
                           timeout_s=20, what="DevicePluginsTolerate=False naming the DaemonSet")
            assert bad["reason"] == "MissingToleration" and inst.profile.readiness.taint_key in bad["message"]
            assert f"{ns}/{name}" not in bad["message"]
            wait_for(lambda: [e for e in events_for(ak, "WarmProfile", inst.name) if e["reason"] == "MissingToleration"
                              and key in e["message"]], what="Warning event on the WarmProfile")
            assert c.metrics.device_plugins_missing.labels(inst.name)._value.get() == 1

            # The fix `render` prints, applied as printed (the patch body; kubectl is not here).
            f = tmp_path / "p.yaml"
            f.write_text(yaml.safe_dump(inst.doc))
            assert main(["render", "-f", str(f), "--device-plugin-patch", key]) == 0
            _, ops = _patch_from(capsys.readouterr().out, 0)
            after = ak.request("PATCH", ds_res.path(name, plugin_ns), body=ops,
                               content_type="application/json-patch+json")
            tols = after["spec"]["template"]["spec"]["tolerations"]
            assert GPU_TOL in tols and dp.toleration(inst.profile) in tols       # appended, nothing dropped
            good = wait_for(lambda: (x := cond(inst.name)) and x["status"] == "True" and x, timeout_s=20,
                            what="DevicePluginsTolerate=True after the patch")
            assert good["reason"] == "Tolerated" and key in good["message"]
            wait_for(lambda: c.metrics.device_plugins_missing.labels(inst.name)._value.get() == 0, what="metric 0")
            assert c.metrics.reconcile_errors.labels("profile")._value.get() == 0
    finally:
        ak.delete(Resource("", "v1", "namespaces", "Namespace"), plugin_ns)
        ak.delete(ds_res, name, ns)


@pytest.mark.kube
def test_the_service_account_may_read_daemonsets_and_change_none(kube):
    from kubernetes.client.exceptions import ApiException

    from support.controller_fixtures import uniq

    ns = uniq("nodewarm")
    sa = Kube(kube.api_client(kube.controller_token(ns)))
    assert "items" in sa.list(DAEMONSETS)
    ds_res = Resource("apps", "v1", "daemonsets", "DaemonSet", namespaced=True)
    with pytest.raises(ApiException) as e:
        sa.create(ds_res, ds_obj(name="x", ns=ns), ns)
    assert e.value.status == 403
