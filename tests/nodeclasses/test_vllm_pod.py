"""The rendered vLLM pod (pure rendering, no servers): CPU/memory sized by GPUs and instance type, /dev/shm, the
streamer's host-buffer bound, the probes, the PodDisruptionBudget, and extraArgs that may not override what the
profile sets (and the compile-cache key agreeing with what vLLM gets)."""

from __future__ import annotations

import pytest

from nodewarm import instancetypes, profile
from nodewarm.api.errors import ProfileError
from nodewarm.instancetypes import InstanceType
from nodewarm.nodeclasses import vllm
from nodewarm.nodeclasses.render import render
from nodewarm.api.servingspec import normalize_extra_args, parse_extra_args, serving_spec
from support.builders import v

GIB = 2**30
PUBLISHER = {"image": "registry.example/vllm-nodewarm:0.21.0", "signingKeySecret": "cc-key"}


def rendered(doc) -> list[dict]:
    p = profile.from_dict(doc)
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    return render(p, types).documents


def one(docs, kind) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, [d["kind"] for d in docs]
    return found[0]


def pod(docs) -> dict:
    return one(docs, "Deployment")["spec"]["template"]["spec"]


def vllm_container(docs) -> dict:
    c = pod(docs)["containers"][0]
    assert c["name"] == "vllm"
    return c


def env(c) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def quantity_bytes(q: str) -> int:
    return vllm.parse_memory_bytes(q)


# --- CPU and memory ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tp, extra, cpu, memory, gpus", [
    (2, [], "12", "80Gi", "2"),                                   # the AWS guide's TP=2 pod
    (4, [], "24", "160Gi", "4"),
    (2, ["--pipeline-parallel-size=2"], "24", "160Gi", "4"),     # TP x PP GPUs
    (8, [], "48", "320Gi", "8"),
])
def test_requests_are_six_cpu_and_40gi_per_gpu_the_pod_requests(tp, extra, cpu, memory, gpus):
    c = vllm_container(rendered(v(spec__serving__tensorParallelSize=tp, spec__serving__extraArgs=extra)))
    assert c["resources"]["requests"] == {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpus}
    # No CPU/memory limit: only the GPUs are limited.
    assert c["resources"]["limits"] == {"nvidia.com/gpu": gpus}


def test_the_default_is_capped_to_the_smallest_allowed_type_leaving_room_for_the_system():
    # g5.xlarge: 4 vCPUs, 16 GiB. 1 CPU and 3 GiB stay for the kubelet and the system DaemonSets.
    doc = v(spec__serving__tensorParallelSize=1, spec__model__sizeGB=8,
            spec__nodes__instanceTypes=["p5.48xlarge", "g5.xlarge"])
    assert vllm_container(rendered(doc))["resources"]["requests"] == {"cpu": "3", "memory": "13Gi",
                                                                       "nvidia.com/gpu": "1"}
    # The publisher sidecar shares the pod: its requests come off too (2.9 CPU; 12.75 GiB rounded down).
    docs = rendered(v(spec__serving__tensorParallelSize=1, spec__model__sizeGB=8,
                      spec__nodes__instanceTypes=["g5.xlarge"], spec__compileCache__verifyKey="A" * 43 + "=",
                      spec__compileCache__publisher=PUBLISHER))
    assert vllm_container(docs)["resources"]["requests"] == {"cpu": "2900m", "memory": "12Gi", "nvidia.com/gpu": "1"}
    assert pod(docs)["containers"][1]["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}


def test_pods_sharing_a_node_get_their_gpu_share_of_it():
    # 8 GPUs but only 16 vCPUs / 64 GiB: a 1-GPU pod must leave room for the seven others beside it.
    p = profile.from_dict(v(spec__serving__tensorParallelSize=1, spec__model__sizeGB=8,
                            spec__nodes__instanceTypes=["tiny8"]))
    types = {"tiny8": InstanceType("tiny8", 1000, 8, "X", 1, vcpus=16, memory_mib=65536)}
    r = vllm.requests(p, types)
    # (16 - 1 CPU) / 8 = 1.875 -> 1.8; (64 GiB - 5%) / 8 = 7.6 GiB -> 7 GiB
    assert (r.cpu_milli, r.memory_bytes) == (1800, 7 * GIB)
    assert r.quantities() == {"cpu": "1800m", "memory": "7Gi"}
    # Types whose vCPUs/memory are unknown (0) do not cap: the per-GPU default stands.
    unknown = {"tiny8": InstanceType("tiny8", 1000, 8, "X", 1)}
    assert vllm.requests(p, unknown).quantities() == {"cpu": "6", "memory": "40Gi"}


@pytest.mark.parametrize("cpu, memory, want", [
    ("2500m", "10Gi", {"cpu": "2500m", "memory": "10Gi"}),
    ("1.5", "12288Mi", {"cpu": "1500m", "memory": "12Gi"}),
    ("3", "13Gi", {"cpu": "3", "memory": "13Gi"}),          # exactly the room g5.xlarge leaves
])
def test_explicit_requests_that_fit_are_used(cpu, memory, want):
    doc = v(spec__serving__tensorParallelSize=1, spec__model__sizeGB=8,
            spec__nodes__instanceTypes=["g5.xlarge", "p5.48xlarge"],
            spec__serving__resources={"cpu": cpu, "memory": memory})
    assert vllm_container(rendered(doc))["resources"]["requests"] == {**want, "nvidia.com/gpu": "1"}


@pytest.mark.parametrize("resources, field, value, at_most", [
    ({"cpu": "8"}, "spec.serving.resources.cpu", "8", "at most 3 "),
    ({"cpu": "3100m"}, "spec.serving.resources.cpu", "3100m", "at most 3 "),
    ({"memory": "16Gi"}, "spec.serving.resources.memory", "16Gi", "at most 13Gi "),
    ({"memory": "14G"}, "spec.serving.resources.memory", "14G", "at most 13Gi "),
])
def test_explicit_requests_that_cannot_fit_the_smallest_type_are_refused(resources, field, value, at_most):
    doc = v(spec__serving__tensorParallelSize=1, spec__model__sizeGB=8,
            spec__nodes__instanceTypes=["p5.48xlarge", "g5.xlarge"],
            spec__serving__resources=resources)
    with pytest.raises(ProfileError) as e:
        rendered(doc)
    assert (e.value.field, e.value.value) == (field, value)
    assert "g5.xlarge" in e.value.fix and at_most in e.value.fix and "spec.nodes.instanceTypes" in e.value.fix


# --- /dev/shm and the streamer's host buffer ---------------------------------------------------------------

@pytest.mark.parametrize("tp, resources, shm", [
    (2, {}, "8Gi"),                      # 4 GiB per GPU
    (8, {}, "32Gi"),
    (2, {"memory": "8Gi"}, "2Gi"),       # never more than a quarter of the memory request
])
def test_dev_shm_is_memory_backed_and_scales_with_the_gpus(tp, resources, shm):
    docs = rendered(v(spec__serving__tensorParallelSize=tp, spec__serving__resources=resources))
    vol = next(x for x in pod(docs)["volumes"] if x["name"] == "dshm")
    assert vol == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in vllm_container(docs)["volumeMounts"]


@pytest.mark.parametrize("tp, resources, limit", [
    (2, {}, 40 * GIB),                       # distributed: half of 80Gi
    (2, {"memory": "32Gi"}, 16 * GIB),       # follows an explicit request
    (1, {}, 20 * GIB),                       # the single reader buffers the same way
])
def test_the_streamers_host_buffer_is_bounded_by_the_memory_request(tp, resources, limit):
    docs = rendered(v(spec__serving__tensorParallelSize=tp, spec__serving__resources=resources))
    c = vllm_container(docs)
    assert int(env(c)["RUNAI_STREAMER_MEMORY_LIMIT"]) == limit
    assert limit <= quantity_bytes(c["resources"]["requests"]["memory"]) // 2
    # The publisher gets vLLM's environment (its key reads VLLM_*), the limit included; RUNAI_* is not in the key.
    docs = rendered(v(spec__serving__tensorParallelSize=tp, spec__serving__resources=resources,
                      spec__compileCache__verifyKey="A" * 43 + "=", spec__compileCache__publisher=PUBLISHER))
    assert env(pod(docs)["containers"][1])["RUNAI_STREAMER_MEMORY_LIMIT"] == str(limit)


# --- probes --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size_gb, threshold", [
    (67, 149),     # 67/0.2 + 67/0.5 + 900 + 120 = 1489 s
    (400, 382),    # 2000 + 800 + 1020 = 3820 s
])
def test_the_startup_probe_covers_a_cold_load_of_the_model_plus_compile(size_gb, threshold):
    c = vllm_container(rendered(v(spec__model__sizeGB=size_gb, spec__serving__tensorParallelSize=8)))
    sp = c["startupProbe"]
    assert sp["httpGet"] == {"path": "/health", "port": 8000}
    assert (sp["periodSeconds"], sp["failureThreshold"], sp["initialDelaySeconds"]) == (10, threshold, 30)
    # Room for reading the model from S3 (cold start) and from NVMe, at the conservative rates, plus compile.
    assert sp["periodSeconds"] * sp["failureThreshold"] >= size_gb / 0.2 + size_gb / 0.5 + 900


def test_readiness_and_liveness_use_health_on_the_serving_port():
    c = vllm_container(rendered(v(spec__serving__port=9000)))
    assert c["readinessProbe"] == {"httpGet": {"path": "/health", "port": 9000}, "periodSeconds": 5,
                                   "timeoutSeconds": 3}
    lp = c["livenessProbe"]
    assert lp["httpGet"] == {"path": "/health", "port": 9000}
    # A minute of consecutive failures, never one slow answer, restarts the container.
    assert lp["periodSeconds"] * lp["failureThreshold"] >= 60 and lp["timeoutSeconds"] >= 3
    assert c["ports"] == [{"containerPort": 9000, "name": "http", "protocol": "TCP"}]


# --- PodDisruptionBudget -------------------------------------------------------------------------------------

def test_a_pod_disruption_budget_covers_exactly_the_deployments_pods():
    from kubernetes import client

    docs = rendered(v(spec__serving__namespace="serving"))
    kinds = [d["kind"] for d in docs]
    assert kinds[-3:] == ["Deployment", "Service", "PodDisruptionBudget"]
    pdb, dep = one(docs, "PodDisruptionBudget"), one(docs, "Deployment")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["metadata"]["name"] == "qwen3-35b-vllm" and pdb["metadata"]["namespace"] == "serving"
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": dep["spec"]["selector"],
                           "unhealthyPodEvictionPolicy": "AlwaysAllow"}
    template_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert set(dep["spec"]["selector"]["matchLabels"].items()) <= set(template_labels.items())
    # Every field is one the policy/v1 API has (the test API server, v1.20, serves no policy/v1).
    known = set(client.V1PodDisruptionBudgetSpec.attribute_map.values())
    assert set(pdb["spec"]) <= known


# --- extraArgs -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, names", [
    (["--tensor-parallel-size=8"], "spec.serving.tensorParallelSize"),
    (["--tensor_parallel_size", "8"], "spec.serving.tensorParallelSize"),
    (["-tp", "8"], "spec.serving.tensorParallelSize"),
    (["--port=9000"], "spec.serving.port"),
    (["--port", "9000"], "spec.serving.port"),
    (["--host", "127.0.0.1"], "0.0.0.0"),
    (["--model=s3://other/"], "spec.model.uri"),
    (["--served_model_name=foo"], "metadata.name"),
    (["--load-format=safetensors"], "runai_streamer"),
    (['--model-loader-extra-config={"concurrency":1}'], "spec.serving.chunkSizeGB"),
    (["--max_model_len=4096"], "spec.serving.maxModelLen"),
    (["--dtype", "half"], "spec.serving.dtype"),
    (["--data-parallel-size=2"], "spec.serving.replicas"),
])
def test_extra_args_may_not_set_what_the_profile_sets(extra, names):
    with pytest.raises(ProfileError) as e:
        rendered(v(spec__serving__extraArgs=["--gpu-memory-utilization=0.9", *extra]))
    assert e.value.field == "spec.serving.extraArgs" and e.value.value == " ".join(extra)
    assert names in e.value.fix


@pytest.mark.parametrize("extra", [["--enforce-eager"], ["--enforce_eager"], ["--enforce-eager=true"],
                                   ["--enforce-eager", "true"], ["--enforce-eager=True"]])
def test_eager_mode_is_refused_unless_allowed(extra):
    with pytest.raises(ProfileError) as e:
        rendered(v(spec__serving__extraArgs=extra))
    assert e.value.field == "spec.serving.extraArgs" and "spec.serving.allowEager: true" in e.value.fix
    c = vllm_container(rendered(v(spec__serving__extraArgs=extra, spec__serving__allowEager=True)))
    eager = [a for a in c["args"] if "eager" in a]
    assert eager == ["--enforce-eager"]     # the one spelling every vLLM parses


@pytest.mark.parametrize("extra", [["--no-enforce-eager"], ["--no_enforce_eager"], ["--enforce-eager=false"],
                                   ["--enforce-eager", "--no-enforce-eager"]])
def test_eager_off_is_vllms_default(extra):
    allow = extra == ["--enforce-eager", "--no-enforce-eager"]      # the last one wins, as in vLLM's parser
    doc = v(spec__serving__extraArgs=extra, spec__serving__allowEager=allow)
    c = vllm_container(rendered(doc))
    assert not [a for a in c["args"] if "eager" in a]
    assert serving_spec(profile.from_dict(doc)) == serving_spec(profile.from_dict(v()))


def test_a_malformed_eager_value_is_refused():
    with pytest.raises(ProfileError) as e:
        rendered(v(spec__serving__extraArgs=["--enforce-eager=maybe"], spec__serving__allowEager=True))
    assert e.value.field == "spec.serving.extraArgs" and e.value.value == "--enforce-eager=maybe"


def test_pipeline_parallelism_comes_from_extra_args_once():
    for extra in (["--pipeline-parallel-size=2"], ["-pp", "2"], ["--pipeline_parallel_size", "2"]):
        doc = v(spec__serving__extraArgs=extra)
        c = vllm_container(rendered(doc))
        # Once, as one token in vLLM's long spelling (nodewarm/nodeclasses/vllmargs.py: spelled).
        assert [a for a in c["args"] if "pipeline" in a or a == "-pp"] == ["--pipeline-parallel-size=2"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
        assert serving_spec(profile.from_dict(doc)).pp == 2


def test_the_key_sees_exactly_the_engine_flags_vllm_gets():
    extra = ["--max_num_seqs", "64", "-O3", "--seed", "-1", "--no-enable-prefix-caching", "--disable-log-requests",
             "--enforce-eager"]
    doc = v(spec__serving__extraArgs=extra, spec__serving__allowEager=True)
    c = vllm_container(rendered(doc))
    own = ("--model=", "--served-model-name=", "--load-format=", "--model-loader-extra-config=",
           "--tensor-parallel-size=", "--dtype=", "--host=", "--port=", "--max-model-len=")
    passed = [a for a in c["args"] if not a.startswith(own)]
    spec = serving_spec(profile.from_dict(doc))
    engine = {k: val for k, val in spec.engine.items() if k not in ("dtype", "max-model-len")}
    assert normalize_extra_args(parse_extra_args(passed)) == engine == {
        "optimization-level": "3", "enforce-eager": "true", "max-num-seqs": "64"}
