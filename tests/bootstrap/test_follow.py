"""The node agent after its first warm (Step 7): it follows its WarmProfile and warms a new generation on a
node that already serves, without replacing or re-tainting it, and a rolling update of the rendered Deployment
lands new pods only on nodes labelled with the new generation. Real API server, real kube-scheduler and
Deployment/ReplicaSet controllers, real S3, the agent with its node's kubelet identity."""

from __future__ import annotations

import copy

import pytest

from support.builders import NO_CACHE, v
from support.bootstrap_fixtures import RunningAgent as Running, model_files, put_model, serving_node
from support.controller_fixtures import wait_for
from nodewarm import profile
from nodewarm.api import generation
from nodewarm.controller.kube import NODES, Resource
from nodewarm.api.names import GENERATION_LABEL

pytestmark = [pytest.mark.kube, pytest.mark.s3]
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
POOL = "follow-pool"


def label(k, node):
    return (k.get(NODES, node)["metadata"].get("labels") or {}).get(GENERATION_LABEL)


def warm_cond(k, node):
    # The agent writes labels and annotations first, the condition last: wait for it.
    return wait_for(lambda: next((c for c in k.get(NODES, node)["status"].get("conditions") or ()
                                  if c["type"] == "nodewarm.io/Warm"), None), 30, what="the Warm condition")


def gen_of(doc) -> str:
    return generation.generation(profile.from_dict(doc))


def test_a_model_change_is_warmed_beside_the_old_one_and_the_old_weights_go_when_no_pod_uses_them(
        kube, k, aws_env, fresh_node, warmprofile, kubelet_pulls, tmp_path):
    v1 = v(metadata__name="follow-a",
           spec__model={"uri": put_model(aws_env, model_files(shards=1, mib_per_shard=1, seed=1))},
           spec__compileCache__uri=NO_CACHE, spec__bootstrap__allowNonNvme=True, spec__nodes__nodePool=POOL,
           spec__serving__tensorParallelSize=1)
    v2 = copy.deepcopy(v1)
    v2["spec"]["model"]["uri"] = put_model(aws_env, model_files(shards=1, mib_per_shard=1, seed=2))
    v2["spec"]["serving"]["image"] = "vllm/vllm-openai:v0.22.0"
    serving_node(k, fresh_node, "node-3", {"karpenter.sh/nodepool": POOL}, gpus=2)
    warmprofile(v1)
    kubelet_pulls(v1, "node-3")
    agent = Running(kube, tmp_path, "node-3", "follow-a")
    try:
        wait_for(lambda: label(k, "node-3") == gen_of(v1), 30, what="node labelled with generation 1")
        first = warm_cond(k, "node-3")
        assert first["status"] == "True"
        models = agent.mount / "nodewarm" / "models" / "follow-a"
        old_dir = models / generation.model_key(profile.from_dict(v1))
        assert (old_dir / "config.json").exists()
        # A pod of generation 1 still runs here: its weights must stay.
        k.create(PODS, {"metadata": {"name": "follow-a-old", "labels": {"nodewarm.io/profile": "follow-a",
                                                                        GENERATION_LABEL: gen_of(v1)}},
                        "spec": {"nodeName": "node-3", "containers": [{"name": "c", "image": "pause"}]}}, "default")

        warmprofile(v2)
        kubelet_pulls(v2, "node-3")     # the DaemonSet rolls its pod to the new image; the kubelet pulls it
        wait_for(lambda: label(k, "node-3") == gen_of(v2), 30, what="node relabelled with generation 2")
        new_dir = models / generation.model_key(profile.from_dict(v2))
        assert (new_dir / "config.json").exists() and old_dir.exists()
        now = warm_cond(k, "node-3")
        # Never not-Warm while serving, never re-tainted.
        assert now["status"] == "True" and now["lastTransitionTime"] == first["lastTransitionTime"]
        assert [t["key"] for t in k.get(NODES, "node-3")["spec"]["taints"]] == ["nvidia.com/gpu"]
        assert k.get(NODES, "node-3")["metadata"]["annotations"]["nodewarm.io/rewarm"] == f"{gen_of(v2)} done"

        # Gone for good (no kubelet here to finish a graceful deletion; a terminating pod still counts).
        k.request("DELETE", PODS.path("follow-a-old", "default"), body={"gracePeriodSeconds": 0})
        wait_for(lambda: not old_dir.exists(), 30, what="old weights removed once no pod of generation 1 runs")
        assert new_dir.exists()
    finally:
        agent.close()
        try:
            k.request("DELETE", PODS.path("follow-a-old", "default"), body={"gracePeriodSeconds": 0})
        except Exception:
            pass


def test_a_rolling_update_lands_new_pods_only_on_nodes_warm_for_the_new_generation(
        scheduling, kube, k, admin, aws_env, fresh_node, warmprofile, kubelet_pulls, tmp_path):
    from nodewarm.kubeapply import apply
    from nodewarm.nodeclasses import vllm

    ns = "follow-roll"
    try:
        k.create(Resource("", "v1", "namespaces", "Namespace"), {"metadata": {"name": ns}})
    except Exception:
        pass
    v1 = v(metadata__name="follow-r",
           spec__model={"uri": put_model(aws_env, model_files(shards=1, mib_per_shard=1, seed=3))},
           spec__compileCache__uri=NO_CACHE, spec__bootstrap__allowNonNvme=True, spec__nodes__nodePool=POOL,
           spec__serving__tensorParallelSize=1, spec__serving__replicas=2, spec__serving__namespace=ns,
           spec__model__sizeGB=0.002)
    v2 = copy.deepcopy(v1)
    v2["spec"]["serving"]["image"] = "vllm/vllm-openai:v0.22.0"
    serving_node(k, fresh_node, "node-3", {"karpenter.sh/nodepool": POOL})  # its agent warmed once, stays on gen 1
    serving_node(k, fresh_node, "node-4", {"karpenter.sh/nodepool": POOL})  # its agent follows the profile
    warmprofile(v1)
    kubelet_pulls(v1, "node-3")
    kubelet_pulls(v1, "node-4")
    once = Running(kube, tmp_path, "node-3", "follow-r", once=True)
    once.thread.join(60)
    agent = Running(kube, tmp_path, "node-4", "follow-r")
    try:
        wait_for(lambda: label(k, "node-3") == label(k, "node-4") == gen_of(v1), 30, what="both nodes on generation 1")
        apply(admin, [vllm.deployment(profile.from_dict(v1))])
        wait_for(lambda: len(bound(k, ns, gen_of(v1))) == 2, 60, what="two generation-1 pods bound")

        warmprofile(v2)
        kubelet_pulls(v2, "node-4")
        wait_for(lambda: label(k, "node-4") == gen_of(v2), 30, what="the following node relabelled")
        assert label(k, "node-3") == gen_of(v1)
        apply(admin, [vllm.deployment(profile.from_dict(v2))])
        new = wait_for(lambda: bound(k, ns, gen_of(v2)), 60, what="a generation-2 pod bound")
        assert set(new.values()) == {"node-4"}, new
        # The scheduler had room on node-3 too (4 GPUs, at most 2 taken by generation-1 pods): only the
        # generation label kept the new pods off it.
        assert list(bound(k, ns, gen_of(v1)).values()).count("node-3") <= 2
        pending = [p for p in k.list(PODS, ns)["items"]
                   if p["metadata"]["labels"].get(GENERATION_LABEL) == gen_of(v2) and not p["spec"].get("nodeName")]
        assert not pending or all(p["spec"]["nodeSelector"][GENERATION_LABEL] == gen_of(v2) for p in pending)
    finally:
        agent.close()
        try:
            k.request("DELETE", f"/apis/apps/v1/namespaces/{ns}/deployments/follow-r-vllm")
        except Exception:
            pass
        for p in k.list(PODS, ns)["items"]:
            k.request("DELETE", PODS.path(p["metadata"]["name"], ns), body={"gracePeriodSeconds": 0})


def bound(k, ns: str, gen: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in k.list(PODS, ns)["items"]
            if (p["metadata"].get("labels") or {}).get(GENERATION_LABEL) == gen and p["spec"].get("nodeName")}
