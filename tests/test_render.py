"""`nodewarm render`: the objects' content (pure) and their acceptance by the real API server plus a
strict check against the upstream CRDs' schemas (the v1.20 server prunes unknown fields silently)."""

from __future__ import annotations

import json

import pytest
import yaml

from nodewarm import instancetypes, profile
from nodewarm.cli import main
from nodewarm.kubeapply import apply
from nodewarm.nodeclasses import crdvalidate
from nodewarm.nodeclasses.render import render
from nodewarm.testenv import kube as kubeenv
from nodewarm.testenv.crds import AUTOMODE_TEST_CRD
from profiles import v


def rendered(doc):
    p = profile.from_dict(doc)
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    return render(p, types).documents


def by_kind(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, [d["kind"] for d in docs]
    return found[0]


def container(docs):
    return by_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def test_karpenter_mode_nodeclass_and_nodepool():
    docs = rendered(v())
    nc = by_kind(docs, "EC2NodeClass")["spec"]
    assert nc["instanceStorePolicy"] == "RAID0"
    assert nc["amiSelectorTerms"] == [{"alias": "al2023@latest"}]
    assert nc["role"] == "KarpenterNodeRole-my-cluster"
    assert nc["userData"].startswith("MIME-Version: 1.0") or "Content-Type: multipart/mixed" in nc["userData"]
    pool = by_kind(docs, "NodePool")["spec"]["template"]["spec"]
    assert pool["startupTaints"] == [{"key": "nodewarm.io/warming", "effect": "NoSchedule"}]
    assert {"key": "karpenter.k8s.aws/instance-local-nvme", "operator": "Gt", "values": ["0"]} in pool["requirements"]
    assert pool["nodeClassRef"] == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu-p5"}


@pytest.mark.parametrize("tp, distributed", [(1, False), (2, True), (8, True)])
def test_vllm_loader_config(tp, distributed):
    c = container(rendered(v(spec__serving__tensorParallelSize=tp)))
    cfg = json.loads(next(a for a in c["args"] if a.startswith("--model-loader-extra-config="))
                     .split("=", 1)[1])
    assert cfg["concurrency"] == 17
    assert cfg.get("distributed", False) is distributed
    assert "--load-format=runai_streamer" in c["args"]
    assert f"--tensor-parallel-size={tp}" in c["args"]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == str(tp)


def test_vllm_never_enforce_eager_and_never_tolerates_the_startup_taint():
    docs = rendered(v(spec__serving__extraArgs=["--enforce-eager", "--gpu-memory-utilization=0.9"]))
    c = container(docs)
    assert "--enforce-eager" not in c["args"] and "--gpu-memory-utilization=0.9" in c["args"]
    pod = by_kind(docs, "Deployment")["spec"]["template"]["spec"]
    keys = [t.get("key") for t in pod["tolerations"]]
    assert "nodewarm.io/warming" not in keys and "nvidia.com/gpu" in keys
    assert not any(t.get("operator") == "Exists" and "key" not in t for t in pod["tolerations"])


@pytest.mark.parametrize("mode, mount", [("karpenter", "/mnt/k8s-disks/0"), ("automode", "/mnt/.ephemeral")])
def test_caches_and_weights_on_the_nvme_hostpath(mode, mount):
    docs = rendered(v(mode))
    c = container(docs)
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["XDG_CACHE_HOME"] == "/compile-cache"
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith("/compile-cache/")
    assert env["TRITON_CACHE_DIR"].startswith("/compile-cache/")
    assert env["RUNAI_STREAMER_CHUNK_BYTESIZE"] == str(4 * 2**30)
    assert {"RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS", "RUNAI_STREAMER_S3_LOW_SPEED_LIMIT"} <= set(env)
    vols = {vol["name"]: vol["hostPath"]["path"]
            for vol in by_kind(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert vols["compile-cache"] == f"{mount}/compile-cache"
    assert vols["weights"].startswith(f"{mount}/")
    model_arg = next(a for a in c["args"] if a.startswith("--model="))
    assert model_arg == "--model=/models/qwen3-35b"


def test_automode_renders_nodeclass_and_daemonset_not_userdata():
    docs = rendered(v("automode"))
    nc = by_kind(docs, "NodeClass")
    assert nc["apiVersion"] == "eks.amazonaws.com/v1"
    assert "userData" not in nc["spec"]
    assert nc["spec"]["ephemeralStorage"]["size"].endswith("Gi")
    assert by_kind(docs, "NodePool")["spec"]["template"]["spec"]["nodeClassRef"]["group"] == "eks.amazonaws.com"
    assert by_kind(docs, "DaemonSet")
    assert not any(d["kind"] == "EC2NodeClass" for d in docs)


def test_iam_policy_reads_model_and_writes_only_the_cache_prefix():
    p = profile.from_dict(v())
    pol = render(p, instancetypes.lookup(list(p.nodes.instance_types))).iam_policy
    actions = {a for s in pol["Statement"] for a in s["Action"]}
    assert "s3:DeleteObject" not in actions and "s3:*" not in actions
    put = [s for s in pol["Statement"] if "s3:PutObject" in s["Action"]]
    assert put and all(r.startswith("arn:aws:s3:::cache-bucket/compile-cache/") for s in put for r in s["Resource"])


def test_cli_render_prints_yaml_and_exit_code_2_on_bad_profile(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(v()))
    assert main(["render", "-f", str(good)]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds[:3] == ["WarmProfile", "EC2NodeClass", "NodePool"] and "Deployment" in kinds
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(v(spec__serving__tensorParallelSize=3)))
    assert main(["render", "-f", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "spec.serving.tensorParallelSize" in err and "3" in err and "[1, 2, 4, 8]" in err


def _missing(sent, stored, path="spec") -> list[str]:
    """Paths of values in ``sent`` that ``stored`` lacks or holds differently (extra keys allowed)."""
    if isinstance(sent, dict) and isinstance(stored, dict):
        return [m for k, val in sent.items() for m in _missing(val, stored.get(k), f"{path}.{k}")]
    if isinstance(sent, list) and isinstance(stored, list) and len(sent) == len(stored):
        return [m for i, (a, b) in enumerate(zip(sent, stored)) for m in _missing(a, b, f"{path}[{i}]")]
    return [] if sent == stored or str(sent) == str(stored) else [path]


def _strict_crds():
    return crdvalidate.load_dir(kubeenv.upstream_crd_files() + [AUTOMODE_TEST_CRD])


@pytest.mark.parametrize("mode", ["karpenter", "automode"])
def test_rendered_objects_pass_the_strict_crd_check(mode):
    docs = rendered(v(mode))
    assert crdvalidate.validate(docs, _strict_crds()) == {}


def test_strict_crd_check_catches_what_the_server_would_prune():
    docs = rendered(v())
    nc = by_kind(docs, "EC2NodeClass")
    nc["spec"]["instanceStorePolicy"] = "RAID5"
    nc["spec"]["instanceStorPolicy"] = "RAID0"
    report = crdvalidate.validate(docs, _strict_crds())
    errs = report["EC2NodeClass/gpu-p5"]
    assert any("RAID5" in e for e in errs) and any("instanceStorPolicy" in e for e in errs)


def test_release_crds_accept_the_rendered_objects_too():
    release = kubeenv.crds_dir() / "release-v1.14.1"
    crds = crdvalidate.load_dir(kubeenv.upstream_crd_files(release))
    assert crdvalidate.validate(rendered(v()), crds) == {}


@pytest.mark.kube
@pytest.mark.parametrize("mode", ["karpenter", "automode"])
def test_server_accepts_every_rendered_object(kube, mode):
    from kubernetes import client

    suffix = mode[:4]
    doc = v(mode, metadata__name=f"qwen-{suffix}", spec__nodes__nodePool=f"gpu-{suffix}",
            spec__nodes__nodeClass=f"gpu-{suffix}", spec__serving__namespace=f"ns-{suffix}")
    docs = rendered(doc)
    client.CoreV1Api(kube.api_client()).create_namespace({"metadata": {"name": f"ns-{suffix}"}})
    results = apply(kube.api_client(), docs)
    # One ClusterRole serves every bootstrap DaemonSet in a cluster: another test may have made it first.
    assert [r.kind for r in results if r.action != "created"] in ([], ["ClusterRole"])
    # Read back: what the server stored equals what we sent (nothing pruned away).
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(kube.api_client())
    for d in docs:
        res = dyn.resources.get(api_version=d["apiVersion"], kind=d["kind"])
        stored = res.get(name=d["metadata"]["name"], namespace=d["metadata"].get("namespace")).to_dict()
        # Everything sent is stored (the server may add defaults, but must not prune).
        assert _missing(d.get("spec", {}), stored.get("spec", {})) == [], d["kind"]
    # Converges: applying again changes nothing.
    assert {r.action for r in apply(kube.api_client(), docs)} == {"unchanged"}


@pytest.mark.kube
def test_with_controller_renders_crd_and_controller_objects_the_server_accepts(kube, tmp_path, capsys):
    doc = v(metadata__name="qwen-ctl", spec__nodes__nodePool="gpu-ctl", spec__nodes__nodeClass="gpu-ctl",
            spec__serving__namespace="ns-ctl")
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["render", "-f", str(f), "--with-controller", "registry.example/nodewarm:0.1.0"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in docs]
    assert kinds[0] == "CustomResourceDefinition" and "ClusterRole" in kinds and kinds.count("Deployment") == 2
    from kubernetes import client

    client.CoreV1Api(kube.api_client()).create_namespace({"metadata": {"name": "ns-ctl"}})
    results = apply(kube.api_client(), docs)
    assert len(results) == len(docs)


def test_publisher_sidecar_builds_the_same_key_the_node_restores_with():
    from nodewarm.bootstrap import agent_cli
    from nodewarm.bootstrap.compilecache import cli as cache_cli
    from nodewarm.cli import build_parser
    from nodewarm.nodeclasses.launch import bootstrap_launch

    doc = v(spec__compileCache__verifyKey="A" * 43 + "=",
            spec__compileCache__publisher={"image": "registry.example/vllm-nodewarm:0.21.0", "signingKeySecret": "cc-key"},
            spec__serving__extraArgs=["--gpu-memory-utilization=0.9"])
    docs = rendered(doc)
    pod = by_kind(docs, "Deployment")["spec"]["template"]["spec"]
    vllm_c, pub = pod["containers"]
    assert pub["name"] == "nodewarm-publish" and pub["env"] == vllm_c["env"]
    assert {"name": "signing-key", "secret": {"secretName": "cc-key", "defaultMode": 0o400}} in pod["volumes"]
    parser = build_parser()
    published = cache_cli._spec(parser.parse_args(pub["args"]))
    p = profile.from_dict(doc)
    restored = agent_cli.serving_spec(parser.parse_args(bootstrap_launch(p).bootstrap_argv()))
    assert published == restored
    assert published.model == next(a for a in vllm_c["args"] if a.startswith("--model=")).split("=", 1)[1]


def test_publisher_needs_the_verify_key_nodes_check_with():
    with pytest.raises(profile.ProfileError) as e:
        rendered(v(spec__compileCache__publisher={"image": "x", "signingKeySecret": "k"}))
    assert e.value.field == "spec.compileCache.verifyKey"


def test_the_nodes_load_check_is_tuned_like_the_vllm_pods_streamer():
    from nodewarm.bootstrap import agent_cli
    from nodewarm.cli import build_parser

    docs = rendered(v("automode", spec__serving__chunkSizeGB=2))
    c = container(docs)
    want_concurrency = json.loads(next(a for a in c["args"] if a.startswith("--model-loader-extra-config="))
                                  .split("=", 1)[1])["concurrency"]
    want_chunk = int(next(e["value"] for e in c["env"] if e["name"] == "RUNAI_STREAMER_CHUNK_BYTESIZE"))
    pod = by_kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    warm = next(x for x in pod["initContainers"] + pod["containers"] if "run" in x.get("args", []))
    cfg = agent_cli._agent_config(build_parser().parse_args(warm["args"]))
    assert cfg.load_check and (cfg.streamer.concurrency, cfg.streamer.chunk_bytes) == (want_concurrency, want_chunk)
    assert want_chunk == 2 * 2**30
