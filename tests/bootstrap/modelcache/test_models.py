"""Many models on one profile's nodes (spec.models, docs/models.md), end to end on the real parts: the local API
server, the S3 server, node agents as their nodes (kubelet identities), the nodewarm controller as its own
ServiceAccount (it alone sets the model labels), and the real kube-scheduler placing two models' Deployments by them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.builders import NO_CACHE, v
from support.bootstrap_fixtures import RunningAgent as Running, model_files, put_model, serving_node
from support.controller_fixtures import wait_for
from support.modelviews import folder, model_labels, view
from nodewarm import profile
from nodewarm.api import models
from nodewarm.api.generation import generation
from nodewarm.api.names import MODELS_ANNOTATION, PROFILE_LABEL
from nodewarm.bootstrap.modelcache import plan
from nodewarm.bootstrap.weights.capacity import Headroom, free_space
from nodewarm.controller.kube import NODES, Resource

pytestmark = [pytest.mark.kube, pytest.mark.s3]
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
POOL = "models-pool"
MiB = 1 << 20


def pool_node(k, fresh_node, name: str, profile_name: str) -> None:
    serving_node(k, fresh_node, name, {"karpenter.sh/nodepool": POOL, PROFILE_LABEL: profile_name})


def report(k, node) -> dict[str, models.HeldModel]:
    return models.decode((k.get(NODES, node)["metadata"].get("annotations") or {}).get(MODELS_ANNOTATION))


@dataclass(frozen=True)
class SmallNVMe(Headroom):
    """A pull headroom that leaves the node's models ``room`` bytes in all under ``mount``, whatever else this
    machine writes meanwhile: the free space less what the models may still take."""

    mount: Path = Path("/nonexistent")
    room: int = 0

    def for_bytes(self, need: int) -> int:
        seen, used = set(), 0
        for f in self.mount.rglob("*"):
            st = f.lstat()
            if f.is_file() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                used += st.st_blocks * 512
        return max(0, free_space(str(self.mount)).free_bytes - (self.room - used))


def budget(tmp_path, node: str, room_bytes: int) -> SmallNVMe:
    mount = tmp_path / f"nvme-{node}"       # RunningAgent's
    mount.mkdir(exist_ok=True)
    return SmallNVMe(fraction=0, minimum_bytes=0, mount=mount, room=room_bytes)


def test_two_models_each_labelled_where_warm_and_the_scheduler_places_each_deployment_by_its_label(
        scheduling, kube, k, admin, aws_env, fresh_node, warmprofile, kubelet_pulls, controller_as_sa, tmp_path):
    from nodewarm.kubeapply import apply
    from nodewarm.nodeclasses import vllm

    ns = "models-place"
    try:
        k.create(Resource("", "v1", "namespaces", "Namespace"), {"metadata": {"name": ns}})
    except Exception:
        pass
    doc = v(metadata__name="multi-a", spec__compileCache__uri=NO_CACHE, spec__bootstrap__allowNonNvme=True,
            spec__model={"uri": put_model(aws_env, model_files(shards=1, mib_per_shard=1, seed=11)), "sizeGB": 0.0011},
            spec__nodes__nodePool=POOL, spec__serving__tensorParallelSize=1, spec__serving__namespace=ns,
            spec__serving__replicas=2,
            spec__models=[{"name": "b", "uri": put_model(aws_env, model_files(shards=2, mib_per_shard=4, seed=12)),
                           "sizeGB": 0.0085, "replicas": 2}])
    b = view(doc, "b")
    warmprofile(doc)
    # node-m2's NVMe has room for the first model only: the second is reported NoCapacity there, nothing evicted.
    pool_node(k, fresh_node, "node-m1", "multi-a")
    pool_node(k, fresh_node, "node-m2", "multi-a")
    kubelet_pulls(doc, "node-m1")
    kubelet_pulls(doc, "node-m2")
    small = Running(kube, tmp_path, "node-m2", "multi-a", headroom=budget(tmp_path, "node-m2", 5 * MiB))
    try:
        failed = wait_for(lambda: (m := report(k, "node-m2").get(b.name)) and m.state == models.FAILED and m, 60,
                          what="the second model NoCapacity on the small node")
        assert failed.reason == models.NO_CAPACITY and "GiB needed" in failed.message, failed
        assert report(k, "node-m2")["multi-a"].state == models.WARM
        assert not any((small.mount / "nodewarm" / "models" / b.name).glob("*/*.safetensors"))
        big = Running(kube, tmp_path, "node-m1", "multi-a")
        try:
            wait_for(lambda: model_labels(k, "node-m1") == {models.label_key(b): generation(b)}, 60,
                     what="the controller labels node-m1 for the second model")
            assert model_labels(k, "node-m2") == {}
            held = report(k, "node-m1")
            assert held[b.name].state == models.WARM and held[b.name].bytes > 8 * MiB and held[b.name].last_used

            # Both Deployments as rendered: the second model's pods land only where the second model is warm.
            p = profile.from_dict(doc)
            apply(admin, [vllm.deployment(p), vllm.deployment(b)])
            placed = wait_for(lambda: (got := bound(k, ns)) and len(got) == 4 and got, 90, what="four pods bound")
            assert {n for pod, n in placed.items() if pod.startswith(f"{b.name}-vllm")} == {"node-m1"}, placed
            # node-m2 had room for them (4 GPUs each, 1 per pod): only the label kept them off.
            assert sum(n == "node-m1" for n in placed.values()) >= 2
        finally:
            big.close()
    finally:
        small.close()
        for name in (f"{doc['metadata']['name']}-vllm", f"{b.name}-vllm"):
            try:
                k.request("DELETE", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")
            except Exception:
                pass
        for pod in k.list(PODS, ns)["items"]:
            k.request("DELETE", PODS.path(pod["metadata"]["name"], ns), body={"gracePeriodSeconds": 0})


def bound(k, ns: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in k.list(PODS, ns)["items"]
            if p["spec"].get("nodeName")}


def using(k, name: str, node: str, folder_on_host: str) -> None:
    """A pod bound to ``node`` that mounts a model's folder, as a vLLM pod does."""
    k.create(PODS, {"metadata": {"name": name}, "spec": {
        "nodeName": node, "containers": [{"name": "c", "image": "pause"}],
        "volumes": [{"name": "w", "hostPath": {"path": folder_on_host}}]}}, "default")


def test_eviction_waits_for_the_pods_takes_the_label_first_and_a_roll_links_what_did_not_change(
        kube, k, aws_env, fresh_node, warmprofile, kubelet_pulls, controller_as_sa, tmp_path):
    from nodewarm.api.podlayout import model_dir

    c_uri = put_model(aws_env, model_files(shards=2, mib_per_shard=4, seed=21))
    d_files = model_files(shards=3, mib_per_shard=1.5, seed=22)
    doc = v(metadata__name="multi-e", spec__compileCache__uri=NO_CACHE, spec__bootstrap__allowNonNvme=True,
            spec__model={"uri": put_model(aws_env, model_files(shards=1, mib_per_shard=1, seed=20)), "sizeGB": 0.0011},
            spec__nodes__nodePool=POOL, spec__serving__tensorParallelSize=1,
            spec__models=[{"name": "c", "uri": c_uri, "sizeGB": 0.0085, "priority": 1}])
    c = view(doc, "c")
    warmprofile(doc)
    pool_node(k, fresh_node, "node-m3", "multi-e")
    kubelet_pulls(doc, "node-m3")
    # 12 MiB for models: the first (1 MiB) and c (8 MiB), or the first and d (4.5 MiB) twice during its roll, but
    # never c and d together.
    small = budget(tmp_path, "node-m3", 12 * MiB)
    # What a crash in the middle of an earlier eviction left: the next start finishes it before anything else.
    crashed = small.mount / "nodewarm" / "models" / ".evicting" / "multi-e-c-0123456789ab-0"
    crashed.mkdir(parents=True)
    (crashed / "model.safetensors").write_bytes(b"\0" * MiB)
    agent = Running(kube, tmp_path, "node-m3", "multi-e", headroom=small, retry_s=1)
    try:
        wait_for(lambda: model_labels(k, "node-m3") == {models.label_key(c): generation(c)}, 60,
                 what="model c warm and labelled")
        assert not crashed.exists()
        c_dir = plan.targets(profile.from_dict(doc), agent.mount)[1].dest
        using(k, "uses-c", "node-m3", model_dir(c))

        # d matters more than c (priority 5), but a pod mounts c: d does not fit, and nothing changes on disk.
        with_d = copy.deepcopy(doc)
        with_d["spec"]["models"].append({"name": "d", "uri": put_model(aws_env, d_files), "sizeGB": 0.0048,
                                         "priority": 5})
        d = view(with_d, "d")
        warmprofile(with_d)
        failed = wait_for(lambda: (m := report(k, "node-m3").get(d.name)) and m.state == models.FAILED and m, 60,
                          what="d NoCapacity while c is in use")
        assert failed.reason == models.NO_CAPACITY and "in use by a pod" in failed.message, failed
        assert c_dir.is_dir() and model_labels(k, "node-m3")[models.label_key(c)] == generation(c)

        # The pod goes: c is evicted (its label first, then its folder, whole) and d pulled.
        k.request("DELETE", PODS.path("uses-c", "default"), body={"gracePeriodSeconds": 0})
        wait_for(lambda: model_labels(k, "node-m3") == {models.label_key(d): generation(d)}, 60,
                 what="c evicted and d labelled")
        assert not c_dir.exists()
        # c is still in the profile, but d matters more: c is not pulled back (which would evict d in turn).
        back = wait_for(lambda: (m := report(k, "node-m3").get(c.name)) and m.state == models.FAILED and m, 30,
                        what="c reported NoCapacity")
        assert f"{d.name}/" in back.message and "priority 5 >= 1" in back.message, back
        assert not any((agent.mount / "nodewarm" / "models" / ".evicting").glob("*"))
        assert agent.follower.models.evicted == [f"{c.name}/{c_dir.name}"]

        # d rolls to a new version with one shard changed: two shards and the small files are linked, not pulled.
        changed = "model-00002-of-00003.safetensors"
        d2_files = {**d_files, changed: model_files(shards=3, mib_per_shard=1.5, seed=23)[changed]}
        rolled = copy.deepcopy(with_d)
        rolled["spec"]["models"][1]["uri"] = put_model(aws_env, d2_files)
        rolled["spec"]["models"] = rolled["spec"]["models"][1:]       # and c leaves the profile
        d2 = view(rolled, "d")
        warmprofile(rolled)
        wait_for(lambda: model_labels(k, "node-m3") == {models.label_key(d2): generation(d2)}, 60,
                 what="d's label switched to the new generation")
        done = agent.follower.models.results[d2.name]
        assert done["linkedFiles"] == len(d_files) - 1 and done["downloadedBytes"] == len(d2_files[changed]), done
        d_dirs = {t.name: t.dest for t in plan.targets(profile.from_dict(rolled), agent.mount)}
        old_d = folder(with_d, agent.mount, d.name)
        assert old_d != d_dirs[d2.name]
        wait_for(lambda: not old_d.exists(), 30, what="d's old folder removed: no pod used it")
        assert d_dirs[d2.name].is_dir()
    finally:
        agent.close()
        try:
            k.request("DELETE", PODS.path("uses-c", "default"), body={"gracePeriodSeconds": 0})
        except Exception:
            pass


def test_a_models_files_stay_until_its_label_is_gone(kube, k, aws_env, fresh_node, warmprofile, kubelet_pulls,
                                                      tmp_path):
    """No controller here: the test plays its part by hand, so the order is seen. The agent asks (evicting), the
    files stay while the label does, and go only once it is off; a label that never goes gives the eviction up."""
    import time

    doc = v(metadata__name="multi-l", spec__compileCache__uri=NO_CACHE, spec__bootstrap__allowNonNvme=True,
            spec__model={"uri": put_model(aws_env, model_files(shards=1, mib_per_shard=1, seed=30)), "sizeGB": 0.0011},
            spec__nodes__nodePool=POOL, spec__serving__tensorParallelSize=1,
            spec__models=[{"name": "c", "uri": put_model(aws_env, model_files(shards=2, mib_per_shard=4, seed=31)),
                           "sizeGB": 0.0085, "priority": 1}])
    c = view(doc, "c")
    warmprofile(doc)
    pool_node(k, fresh_node, "node-m3", "multi-l")
    kubelet_pulls(doc, "node-m3")
    agent = Running(kube, tmp_path, "node-m3", "multi-l", headroom=budget(tmp_path, "node-m3", 12 * MiB),
                    retry_s=1, label_wait_s=4)
    try:
        wait_for(lambda: (m := report(k, "node-m3").get(c.name)) and m.state == models.WARM, 60, what="c warm")
        k.merge_patch(NODES, "node-m3", {"metadata": {"labels": {models.label_key(c): generation(c)}}})
        c_dir = plan.targets(profile.from_dict(doc), agent.mount)[1].dest
        with_d = copy.deepcopy(doc)
        d_uri = put_model(aws_env, model_files(shards=3, mib_per_shard=1.5, seed=32))
        with_d["spec"]["models"].append({"name": "d", "uri": d_uri, "sizeGB": 0.0048, "priority": 5})
        warmprofile(with_d)
        wait_for(lambda: report(k, "node-m3")[c.name].state == models.EVICTING, 30, what="c reported evicting")
        time.sleep(2)
        assert c_dir.is_dir() and report(k, "node-m3")[c.name].state == models.EVICTING, "files went before the label"
        # The label never goes: the agent gives the eviction up, and c is back as it was.
        wait_for(lambda: report(k, "node-m3")[c.name].state == models.WARM, 30, what="c warm again")
        assert c_dir.is_dir()
        # Now as the controller does when it reads `evicting`: the label goes, then the files.
        wait_for(lambda: report(k, "node-m3")[c.name].state == models.EVICTING, 30, what="c evicting again")
        k.request("PATCH", NODES.path("node-m3"), body=[{"op": "remove", "path": "/metadata/labels/" +
                                                         models.label_key(c).replace("/", "~1")}],
                  content_type="application/json-patch+json")
        wait_for(lambda: not c_dir.exists(), 30, what="c's folder removed once its label is off")
    finally:
        agent.close()


def test_the_agents_own_daemonset_pods_mounting_the_whole_nvme_keep_no_model_from_eviction_or_removal(
        kube, k, admin, aws_env, fresh_node, warmprofile, kubelet_pulls, controller_as_sa, tmp_path):
    """Auto Mode: the agent is the rendered DaemonSet's pod, which mounts the whole NVMe root (as does, during the
    DaemonSet's rolling update, its older pod). Neither is a user of the models: a model of lower priority is evicted
    for one that matters more, and a rolled model's old folder is removed, with both pods on the node."""
    from nodewarm import instancetypes
    from nodewarm.api import agentpod
    from nodewarm.kubeapply import apply
    from nodewarm.nodeclasses.render import render
    from nodewarm_dev.testenv.karpenter import KarpenterSim
    from support.bootstrap_fixtures import kubelet_env

    node = "node-m4"
    d_files = model_files(shards=3, mib_per_shard=1.5, seed=42)
    doc = v("automode", metadata__name="multi-ds", spec__compileCache__uri=NO_CACHE,
            spec__bootstrap__allowNonNvme=True,
            spec__model={"uri": put_model(aws_env, model_files(shards=1, mib_per_shard=1, seed=40)), "sizeGB": 0.0011},
            spec__nodes__nodePool=POOL, spec__serving__tensorParallelSize=1,
            spec__models=[{"name": "c", "uri": put_model(aws_env, model_files(shards=2, mib_per_shard=4, seed=41)),
                           "sizeGB": 0.0085, "priority": 1}])
    p = profile.from_dict(doc)
    c = view(doc, "c")
    ns, ds_name = p.bootstrap.namespace, agentpod.daemonset_name(POOL)
    # The agent's Namespace, ServiceAccount and DaemonSet exactly as `nodewarm render` emits them.
    agent_docs = [d for d in render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
                  if (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) in
                  {("Namespace", None, ns), ("ServiceAccount", ns, agentpod.NAME), ("DaemonSet", ns, ds_name)}]
    assert len(agent_docs) == 3, agent_docs
    apply(admin, agent_docs)
    warmprofile(doc)
    pool_node(k, fresh_node, node, "multi-ds")
    kubelet_pulls(doc, node)
    # The DaemonSet controller's pods on the node: an older one still there (a rolling update), then the agent's own.
    sim = KarpenterSim(admin)
    older = sim.run_daemonset_pod(node, ns, ds_name)
    own = sim.run_daemonset_pod(node, ns, ds_name)
    agent_pods = [older["metadata"]["name"], own["metadata"]["name"]]
    assert {"name": "nvme", "hostPath": {"path": p.nodes.cache_mount, "type": "Directory"}} in own["spec"]["volumes"]
    env = kubelet_env(own["spec"]["containers"][0], own)       # what `bootstrap run` reads in the pod
    assert env[agentpod.NODE_NAME_ENV] == node
    me = agentpod.own_pod(env)
    assert me is not None and me.uid == own["metadata"]["uid"]
    # Room for the first model (1 MiB) and c (8 MiB), or the first and d (4.5 MiB) twice during its roll, never c
    # and d together.
    agent = Running(kube, tmp_path, node, "multi-ds", headroom=budget(tmp_path, node, 12 * MiB), retry_s=1,
                    agent_pod=me)
    try:
        wait_for(lambda: model_labels(k, node) == {models.label_key(c): generation(c)}, 60,
                 what="model c warm and labelled")
        c_dir = folder(doc, agent.mount, c.name)

        # d matters more than c (priority 5): c is evicted, though both agent pods mount the whole NVMe.
        with_d = copy.deepcopy(doc)
        with_d["spec"]["models"].append({"name": "d", "uri": put_model(aws_env, d_files), "sizeGB": 0.0048,
                                         "priority": 5})
        d = view(with_d, "d")
        warmprofile(with_d)

        def d_settled():
            m = report(k, node).get(d.name)
            if m is not None and m.state == models.FAILED:
                return m
            return model_labels(k, node) == {models.label_key(d): generation(d)} and m

        got = wait_for(d_settled, 90, what="c evicted and d labelled, or d failed")
        assert got.state == models.WARM, f"{got.reason}: {got.message}"
        assert not c_dir.exists() and agent.follower.models.evicted == [f"{c.name}/{c_dir.name}"]

        # d rolls to a new version (c leaves the profile): its old folder goes, though both agent pods still mount
        # the whole NVMe.
        changed = "model-00002-of-00003.safetensors"
        rolled = copy.deepcopy(with_d)
        rolled["spec"]["models"] = [{**with_d["spec"]["models"][1], "uri": put_model(
            aws_env, {**d_files, changed: model_files(shards=3, mib_per_shard=1.5, seed=43)[changed]})}]
        d2 = view(rolled, "d")
        warmprofile(rolled)
        wait_for(lambda: model_labels(k, node) == {models.label_key(d2): generation(d2)}, 60,
                 what="d's label switched to the new generation")
        old_d = folder(with_d, agent.mount, d.name)
        new_d = folder(rolled, agent.mount, d2.name)
        wait_for(lambda: not old_d.exists(), 30, what="d's old folder removed beside the agent's pods")
        assert new_d.is_dir()
        assert {pod["metadata"]["name"] for pod in k.list(PODS, ns)["items"]} >= set(agent_pods)
    finally:
        agent.close()
        for name in agent_pods:
            try:
                k.request("DELETE", PODS.path(name, ns), body={"gracePeriodSeconds": 0})
            except Exception:
                pass
        try:
            k.request("DELETE", f"/apis/apps/v1/namespaces/{ns}/daemonsets/{ds_name}")
        except Exception:
            pass
