"""`nodewarm render`: the objects' content (pure) and their acceptance by the real API server plus a
strict check against the upstream CRDs' schemas (the v1.20 server prunes unknown fields silently)."""

from __future__ import annotations

import json

import pytest
import yaml

from nodewarm import instancetypes, profile
from nodewarm.cli import main
from nodewarm.kubeapply import apply
from nodewarm.api import prepullpod
from nodewarm.nodeclasses import crdvalidate, prepull
from nodewarm.api.names import PROFILE_LABEL
from nodewarm.nodeclasses.render import render
from support import crds as crdsupport
from support.builders import v


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


def daemonset(docs, prefix):
    """The agent's DaemonSet (``nodewarm-bootstrap-``) or the image pre-pull's (``<profile>-image-prepull``)."""
    found = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"].startswith(prefix)]
    assert len(found) == 1, [d["metadata"]["name"] for d in docs if d["kind"] == "DaemonSet"]
    return found[0]


# The three launchers: AL2023 user data, and the agent DaemonSet on Bottlerocket (under Karpenter) and Auto Mode.
LAUNCHERS = ["al2023", "bottlerocket", "automode"]


def launcher(name: str, **changes) -> dict:
    if name == "bottlerocket":
        changes["spec__nodes__amiAlias"] = "bottlerocket@latest"
    return v("automode" if name == "automode" else "karpenter", **changes)


def test_karpenter_mode_nodeclass_and_nodepool():
    docs = rendered(v())
    nc = by_kind(docs, "EC2NodeClass")["spec"]
    assert nc["instanceStorePolicy"] == "RAID0"
    assert nc["amiSelectorTerms"] == [{"alias": "al2023@v20241011"}]     # the pinned release, never a silent @latest
    assert nc["role"] == "KarpenterNodeRole-my-cluster"
    assert nc["userData"].startswith("MIME-Version: 1.0") or "Content-Type: multipart/mixed" in nc["userData"]
    pool = by_kind(docs, "NodePool")["spec"]["template"]["spec"]
    assert pool["startupTaints"] == [{"key": "nodewarm.io/warming", "effect": "NoSchedule"}]
    assert {"key": "karpenter.k8s.aws/instance-local-nvme", "operator": "Gt", "values": ["0"]} in pool["requirements"]
    assert pool["nodeClassRef"] == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu-p5"}


# Labels Karpenter knows without a NodePool defining them (kubernetes-sigs/karpenter pkg/apis/v1/labels.go): a
# pod may select these; any other key must be in the pool's requirements or template labels.
KARPENTER_KNOWN = {"karpenter.sh/nodepool", "karpenter.sh/capacity-type", "kubernetes.io/arch", "kubernetes.io/os",
                   "node.kubernetes.io/instance-type", "topology.kubernetes.io/zone", "topology.kubernetes.io/region"}


@pytest.mark.parametrize("name", LAUNCHERS)
def test_karpenter_can_launch_a_node_for_the_vllm_pods(name):
    """Karpenter provisions only for pods whose node labels the NodePool can produce ("incompatible
    requirements, label ... does not have known values" otherwise): every key the vLLM pod selects is a
    requirement or a template label of the pool, and the generation, which changes, is Exists."""
    docs = rendered(launcher(name))
    pool = by_kind(docs, "NodePool")["spec"]["template"]
    defined = {r["key"] for r in pool["spec"]["requirements"]} | set((pool.get("metadata") or {}).get("labels") or {})
    selected = set(by_kind(docs, "Deployment")["spec"]["template"]["spec"]["nodeSelector"])
    assert selected - defined - KARPENTER_KNOWN == set()
    assert {"key": "nodewarm.io/generation", "operator": "Exists"} in pool["spec"]["requirements"]


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
    # Eager mode is refused unless allowed (tests/nodeclasses/test_vllm_pod.py covers its spellings and allowEager).
    with pytest.raises(profile.ProfileError) as e:
        rendered(v(spec__serving__extraArgs=["--enforce-eager", "--gpu-memory-utilization=0.9"]))
    assert e.value.field == "spec.serving.extraArgs" and "spec.serving.allowEager" in str(e.value)
    docs = rendered(v(spec__serving__extraArgs=["--gpu-memory-utilization=0.9"]))
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
            for vol in by_kind(docs, "Deployment")["spec"]["template"]["spec"]["volumes"] if "hostPath" in vol}
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
    assert daemonset(docs, "nodewarm-bootstrap-")
    assert not any(d["kind"] == "EC2NodeClass" for d in docs)


@pytest.mark.parametrize("name", LAUNCHERS)
def test_every_launcher_renders_the_serving_image_prepull(name):
    docs = rendered(launcher(name, spec__serving__image="registry.example/vllm:v1"))
    ds = daemonset(docs, "qwen3-35b-image-prepull")
    order = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert order.index(("Namespace", "nodewarm-system")) < order.index(("DaemonSet", "qwen3-35b-image-prepull"))
    assert ds["metadata"]["namespace"] == "nodewarm-system"
    pod = ds["spec"]["template"]["spec"]
    # The pool's nodes, while the startup taint is still on them: exactly where and when the agent runs.
    assert pod["nodeSelector"] == {"karpenter.sh/nodepool": "gpu-p5", "kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [{"key": "nodewarm.io/warming", "operator": "Exists"},
                                  {"key": "nvidia.com/gpu", "operator": "Exists"}]
    if name != "al2023":
        agent = daemonset(docs, "nodewarm-bootstrap-")["spec"]["template"]["spec"]
        assert (pod["nodeSelector"], pod["tolerations"]) == (agent["nodeSelector"], agent["tolerations"])
        assert "initContainers" not in agent        # the agent never waits for the image to start
    [init] = pod["initContainers"]
    assert (init["name"], init["image"]) == ("serving-image", "registry.example/vllm:v1")
    assert init["command"] == ["/bin/true"]
    [main] = pod["containers"]
    assert main["image"] == prepull.PAUSE_IMAGE and "command" not in main
    # Nothing to protect: no token, no volume, no privilege, a bounded footprint on a GPU node.
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod and "volumes" not in pod
    for c in (init, main):
        assert "volumeMounts" not in c
        sc = c["securityContext"]
        assert (sc["privileged"], sc["allowPrivilegeEscalation"]) == (False, False)
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert c["resources"]["limits"]["memory"] == c["resources"]["requests"]["memory"]
    # The agent finds the pod by this selector. The profile label would make it a vLLM pod of an older generation
    # to the agent (profilesource.pods_on_node), which would then never free old weights.
    labels = ds["spec"]["template"]["metadata"]["labels"]
    wanted = dict(kv.split("=") for kv in prepullpod.label_selector("qwen3-35b").split(","))
    assert wanted == ds["spec"]["selector"]["matchLabels"] and wanted.items() <= labels.items()
    assert PROFILE_LABEL not in labels


def test_the_bootstrap_namespace_is_one_document_for_every_launcher():
    """Profiles of different launchers may share it: one apply must not undo another's labels."""
    spaces = [by_kind(rendered(launcher(name)), "Namespace") for name in LAUNCHERS]
    assert spaces[0] == spaces[1] == spaces[2]


def test_the_agent_waits_for_the_rendered_prepull_pod():
    """What the agent reads at boot names the image, namespace and pod the renderer put on its node."""
    from pathlib import Path

    from nodewarm.bootstrap import followplan, profilesource

    docs = rendered(launcher("automode", spec__bootstrap__imagePrepullTimeout="90s",
                             spec__bootstrap__namespace="warm-ns"))
    ds = daemonset(docs, "qwen3-35b-image-prepull")
    resolved = profilesource.resolve(by_kind(docs, "WarmProfile"), Path("/mnt/.ephemeral"))
    cfg = followplan.agent_config(resolved, followplan.FollowOptions("p", Path("/mnt/.ephemeral"), "n"))
    assert cfg.serving_image == ds["spec"]["template"]["spec"]["initContainers"][0]["image"]
    assert cfg.prepull_namespace == ds["metadata"]["namespace"] == "warm-ns"
    assert ds["spec"]["selector"]["matchLabels"] == prepullpod.selector(cfg.profile)
    assert cfg.prepull_deadline_s == 90.0


def _actions(pol) -> set[str]:
    return {a for s in pol["Statement"] for a in s["Action"]}


def test_iam_is_split_by_principal_and_never_wider_than_a_prefix():
    doc = v(spec__compileCache__verifyKey="A" * 43 + "=",
            spec__compileCache__publisher={"image": "registry.example/vllm-nodewarm:0.21.0", "signingKeySecret": "k"})
    p = profile.from_dict(doc)
    pols = render(p, instancetypes.lookup(list(p.nodes.instance_types))).iam_policies
    assert set(pols) == {"agent", "publisher"}
    reader, writer = pols["agent"], pols["publisher"]
    # The reader never writes; the writer writes only the compile-cache prefix; nobody deletes.
    assert not {a for a in _actions(reader) if not a.startswith(("s3:Get", "s3:List"))}
    assert _actions(writer) <= {"s3:ListBucket", "s3:GetObject", "s3:PutObject"}
    for pol in (reader, writer):
        for s in pol["Statement"]:
            for r in s["Resource"]:
                assert r in ("arn:aws:s3:::models-bucket", "arn:aws:s3:::cache-bucket",
                             "arn:aws:s3:::cache-bucket/nodewarm/nodewarm-0.1.0.pyz") or \
                    r.startswith(("arn:aws:s3:::models-bucket/qwen3-35b/", "arn:aws:s3:::cache-bucket/compile-cache/")), r
            if s["Action"] == ["s3:ListBucket"]:
                assert s["Condition"]["StringLike"]["s3:prefix"][0].endswith("/*")
    put = [s for s in writer["Statement"] if "s3:PutObject" in s["Action"]]
    assert all(r.startswith("arn:aws:s3:::cache-bucket/compile-cache/") for s in put for r in s["Resource"])
    # The pointers nodes trust are only ever written conditionally.
    envelope = [s for s in put if s["Resource"] == ["arn:aws:s3:::cache-bucket/compile-cache/*.json"]]
    assert {tuple(s["Condition"]["Null"]) for s in envelope} == {("s3:if-none-match",), ("s3:if-match",)}
    assert not any("kms:" in a for pol in (reader, writer) for a in _actions(pol))


def test_kms_statements_name_exactly_the_key():
    key = "arn:aws:kms:us-west-2:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    doc = v(spec__aws__kmsKeyArn=key, spec__compileCache__verifyKey="A" * 43 + "=",
            spec__compileCache__publisher={"image": "i", "signingKeySecret": "k"})
    p = profile.from_dict(doc)
    pols = render(p, instancetypes.lookup(list(p.nodes.instance_types))).iam_policies
    kms = {name: [s for s in pol["Statement"] if s["Action"][0].startswith("kms:")] for name, pol in pols.items()}
    assert kms["agent"] == [{"Sid": "DecryptWithBucketKey", "Effect": "Allow", "Action": ["kms:Decrypt"],
                             "Resource": [key]}]
    assert kms["publisher"][0]["Action"] == ["kms:Decrypt", "kms:GenerateDataKey"] and kms["publisher"][0]["Resource"] == [key]


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


def test_cli_render_makes_the_ami_a_choice_and_says_what_latest_costs(tmp_path, capsys):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(v(spec__nodes__amiAlias=None)))
    assert main(["render", "-f", str(f)]) == 2                    # no silent al2023@latest
    err = capsys.readouterr().err
    assert "spec.nodes.amiAlias" in err and "al2023@v20241011" in err
    f.write_text(yaml.safe_dump(v(spec__nodes__amiAlias="al2023@latest", spec__serving__replicas=3)))
    assert main(["render", "-f", str(f)]) == 0                    # written out: a choice, priced on stderr
    err = capsys.readouterr().err
    assert "3 serving node(s) x 67 GB of weights pulled again" in err and "spec.nodes.disruption.drift" in err
    f.write_text(yaml.safe_dump(v()))                             # pinned: nothing to warn about
    assert main(["render", "-f", str(f)]) == 0
    assert "AMIDrift" not in capsys.readouterr().err


def _missing(sent, stored, path="spec") -> list[str]:
    """Paths of values in ``sent`` that ``stored`` lacks or holds differently (extra keys allowed)."""
    if isinstance(sent, dict) and isinstance(stored, dict):
        return [m for k, val in sent.items() for m in _missing(val, stored.get(k), f"{path}.{k}")]
    if isinstance(sent, list) and isinstance(stored, list) and len(sent) == len(stored):
        return [m for i, (a, b) in enumerate(zip(sent, stored)) for m in _missing(a, b, f"{path}[{i}]")]
    return [] if sent == stored or str(sent) == str(stored) else [path]


def _strict_crds():
    return crdsupport.strict_crds()


@pytest.mark.parametrize("name", LAUNCHERS)
def test_rendered_objects_pass_the_strict_crd_check(name):
    docs = rendered(launcher(name))
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
    crds = crdsupport.upstream_crds(crdsupport.upstream_release_dir())
    assert crdvalidate.validate(rendered(v()), crds) == {}


@pytest.mark.kube
@pytest.mark.parametrize("name", LAUNCHERS)
def test_server_accepts_every_rendered_object(kube, name):
    from kubernetes import client

    suffix = name[:4]
    doc = launcher(name, metadata__name=f"qwen-{suffix}", spec__nodes__nodePool=f"gpu-{suffix}",
                   spec__nodes__nodeClass=f"gpu-{suffix}", spec__serving__namespace=f"ns-{suffix}")
    # The v1.20 API server has no ValidatingAdmissionPolicy (1.30+); its CEL is tested in test_admission_policy.
    # Nor policy/v1 (1.21+): the PodDisruptionBudget is checked against the client's model in test_vllm_pod.
    docs = [d for d in rendered(doc) if not d["kind"].startswith("ValidatingAdmissionPolicy")
            and d["kind"] != "PodDisruptionBudget"]
    client.CoreV1Api(kube.api_client()).create_namespace({"metadata": {"name": f"ns-{suffix}"}})
    results = apply(kube.api_client(), docs)
    # The agent's ClusterRoles (and the nodes' binding), the bootstrap namespace and the agent's identity in it
    # serve every profile in a cluster: another test may have made them first.
    assert {r.kind for r in results if r.action != "created"} <= {"ClusterRole", "ClusterRoleBinding", "Namespace",
                                                                  "ServiceAccount", "Role", "RoleBinding"}
    # Read back: what the server stored equals what we sent (nothing pruned away).
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(kube.api_client())
    for d in docs:
        res = dyn.resources.get(api_version=d["apiVersion"], kind=d["kind"])
        stored = res.get(name=d["metadata"]["name"], namespace=d["metadata"].get("namespace")).to_dict()
        # Everything sent is stored (the server may add defaults, but must not prune).
        assert _missing(d.get("spec", {}), stored.get("spec", {})) == [], d["kind"]
    # Converges: applying again changes nothing.
    # Converges: applying again changes no spec. (Workload objects are compared by metadata.generation: a
    # Deployment/DaemonSet controller, when one runs in this session, writes their status in between.)
    def state():
        out = {}
        for d in docs:
            res = dyn.resources.get(api_version=d["apiVersion"], kind=d["kind"])
            md = res.get(name=d["metadata"]["name"], namespace=d["metadata"].get("namespace")).to_dict()["metadata"]
            out[(d["kind"], d["metadata"]["name"])] = md.get("generation") if d["kind"] in ("Deployment", "DaemonSet") \
                else md["resourceVersion"]
        return out

    before = state()
    apply(kube.api_client(), docs)
    assert state() == before


@pytest.mark.kube
def test_with_controller_renders_controller_objects_the_server_accepts(kube, tmp_path, capsys):
    doc = v(metadata__name="qwen-ctl", spec__nodes__nodePool="gpu-ctl", spec__nodes__nodeClass="gpu-ctl",
            spec__serving__namespace="ns-ctl")
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["render", "-f", str(f), "--with-controller", "registry.example/nodewarm:0.1.0"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [d["kind"] for d in docs]
    assert kinds[0] == "Namespace" and "ClusterRole" in kinds and kinds.count("Deployment") == 2
    docs = [d for d in docs if d["kind"] != "PodDisruptionBudget"]     # v1.20 serves no policy/v1 (1.21+)
    from kubernetes import client

    client.CoreV1Api(kube.api_client()).create_namespace({"metadata": {"name": "ns-ctl"}})
    results = apply(kube.api_client(), docs)
    assert len(results) == len(docs)


def test_publisher_sidecar_builds_the_same_key_the_node_restores_with():
    from pathlib import Path

    from nodewarm.bootstrap import followplan, profilesource
    from nodewarm.bootstrap.compilecache import cli as cache_cli
    from nodewarm.cli import build_parser

    doc = v(spec__compileCache__verifyKey="A" * 43 + "=",
            spec__compileCache__publisher={"image": "registry.example/vllm-nodewarm:0.21.0", "signingKeySecret": "cc-key"},
            spec__serving__extraArgs=["--gpu-memory-utilization=0.9", "--quantization", "fp8",
                                      '--compilation_config={"level": 3, "cudagraph_mode": "FULL"}',
                                      "--pipeline-parallel-size=2", "--disable-log-requests"])
    docs = rendered(doc)
    pod = by_kind(docs, "Deployment")["spec"]["template"]["spec"]
    vllm_c, pub = pod["containers"]
    # vLLM's environment (VLLM_*/TORCHINDUCTOR_* are in the key), plus the region (no instance metadata in pods)
    # and the Node it runs on (it records hit|miss|cold there).
    assert pub["name"] == "nodewarm-publish" and pub["env"] == vllm_c["env"] + [
        {"name": "AWS_REGION", "value": "us-west-2"}, {"name": "AWS_DEFAULT_REGION", "value": "us-west-2"},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    # TP x PP GPUs; the hit is proven against vLLM's health endpoint and the agent's baseline.
    assert vllm_c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert pub["args"][pub["args"].index("--ready-url") + 1] == "http://127.0.0.1:8000/health"
    assert pub["args"][pub["args"].index("--baseline") + 1] == "/compile-cache/nodewarm-baseline.json"
    # Its ServiceAccount may patch nodes/status and nothing else.
    role, = (d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].startswith("nodewarm-publisher"))
    binding, = (d for d in docs if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == role["metadata"]["name"])
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "qwen3-35b-publisher", "namespace": "default"}]
    assert pod["serviceAccountName"] == "qwen3-35b-publisher"
    sa = by_kind(docs, "ServiceAccount")
    assert sa["metadata"]["name"] == "qwen3-35b-publisher" and sa["metadata"]["namespace"] == "default"
    assert {"name": "signing-key", "secret": {"secretName": "cc-key", "defaultMode": 0o400}} in pod["volumes"]
    parser = build_parser()
    published = cache_cli._spec(parser.parse_args(pub["args"]))
    # The node agent's side: the WarmProfile object as rendered, resolved the way the agent does at boot.
    resolved = profilesource.resolve(by_kind(docs, "WarmProfile"), Path("/mnt/k8s-disks/0"))
    restored = followplan.agent_config(resolved, followplan.FollowOptions("p", Path("/mnt/k8s-disks/0"), "n")).spec
    assert published == restored
    assert (published.tp, published.pp) == (2, 2)
    assert {k: published.engine[k] for k in ("quantization", "compilation-config")} == {
        "quantization": "fp8", "compilation-config": '{"cudagraph_mode":"FULL","level":3}'}
    assert "gpu-memory-utilization" not in published.engine     # not in vLLM's compile hash either
    assert "disable-log-requests" not in published.engine       # how the HTTP server runs compiles nothing
    assert published.model == next(a for a in vllm_c["args"] if a.startswith("--model=")).split("=", 1)[1]


def test_publisher_needs_the_verify_key_nodes_check_with():
    with pytest.raises(profile.ProfileError) as e:
        rendered(v(spec__compileCache__publisher={"image": "x", "signingKeySecret": "k"}))
    assert e.value.field == "spec.compileCache.verifyKey"


NODE_KINDS = ("EC2NodeClass", "NodeClass", "NodePool")


def node_objects(doc) -> list[dict]:
    return [d for d in rendered(doc) if d["kind"] in NODE_KINDS]


@pytest.mark.parametrize("mode", ["karpenter", "automode"])
def test_every_serving_field_changed_renders_byte_identical_node_objects(mode, monkeypatch):
    """Karpenter hashes these objects (nodewarm/karpenter/drift.py): a serving change must not replace a node."""
    from nodewarm.karpenter import drift

    base = v(mode)
    changed = v(mode, spec__model__uri="s3://other-models/llama-70b/", spec__model__revision="r2",
                spec__model__sizeGB=140, spec__serving__image="vllm/vllm-openai:v0.22.0",
                spec__serving__tensorParallelSize=8, spec__serving__maxModelLen=32768, spec__serving__dtype="bfloat16",
                spec__serving__extraArgs=["--gpu-memory-utilization=0.95"], spec__serving__replicas=4,
                spec__serving__chunkSizeGB=8, spec__compileCache__uri="s3://other-cache/cc/",
                spec__compileCache__verifyKey="B" * 43 + "=", spec__nodes__region="eu-west-1")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    a = node_objects(base)
    monkeypatch.setenv("AWS_REGION", "ap-south-1")       # the renderer's environment never leaks in
    b = node_objects(changed)
    # The replicas size the NodePool's default GPU limit (spec.limits, outside the drift hash): the one difference.
    limits = [(x["spec"].pop("limits"), y["spec"].pop("limits")) for x, y in zip(a, b) if x["kind"] == "NodePool"]
    assert limits == [({"nvidia.com/gpu": "16"}, {"nvidia.com/gpu": "40"})]
    assert yaml.safe_dump_all(a) == yaml.safe_dump_all(b)
    assert [drift.static_hash(x) for x in a] == [drift.static_hash(x) for x in b]
    # ... while the serving objects do change, and say which generation they need.
    dep_a, dep_b = by_kind(rendered(base), "Deployment"), by_kind(rendered(changed), "Deployment")
    gen = "nodewarm.io/generation"
    assert dep_a["spec"]["template"]["spec"]["nodeSelector"][gen] != dep_b["spec"]["template"]["spec"]["nodeSelector"][gen]


def test_a_different_nodewarm_version_renders_the_same_node_objects(monkeypatch):
    import nodewarm

    a = node_objects(v())
    monkeypatch.setattr(nodewarm, "__version__", "9.9.9")
    assert node_objects(v()) == a


def test_node_level_facts_do_change_node_objects():
    """The guard has teeth: what must reach the node does change the hash."""
    from nodewarm.karpenter import drift

    base = [drift.static_hash(x) for x in node_objects(v())]
    for change in (dict(spec__readiness__taintKey="example.com/warm"), dict(spec__bootstrap__artifactSha256="b" * 64),
                   dict(metadata__name="another-profile")):
        assert [drift.static_hash(x) for x in node_objects(v(**change))] != base, change


def test_the_agent_rbac_grants_the_node_group_exactly_get_and_watch_on_profiles():
    docs = rendered(v())
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "nodewarm-agent")
    assert role["rules"] == [{"apiGroups": ["nodewarm.io"], "resources": ["warmprofiles"], "verbs": ["get", "watch"]}]
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]


def test_pod_identity_associations_are_rendered_for_each_pod_principal(tmp_path, capsys):
    doc = v("automode", spec__compileCache__verifyKey="A" * 43 + "=",
            spec__compileCache__publisher={"image": "registry.example/vllm-nodewarm:0.21.0", "signingKeySecret": "k"})
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["render", "-f", str(f), "-o", str(tmp_path / "out")]) == 0
    script = (tmp_path / "out" / "pod-identity-associations.sh").read_text().splitlines()
    cmds = [line.split() for line in script if line.startswith("aws ")]
    assert [c[c.index("--service-account") + 1] for c in cmds] == ["nodewarm-bootstrap", "qwen3-35b-publisher"]
    assert [c[c.index("--namespace") + 1] for c in cmds] == ["nodewarm-system", "default"]
    assert [c[c.index("--role-arn") + 1] for c in cmds] == ["arn:aws:iam::111122223333:role/nodewarm-agent",
                                                            "arn:aws:iam::111122223333:role/nodewarm-publisher"]
    assert json.loads((tmp_path / "out" / "iam-publisher-policy.json").read_text())["Statement"]
    assert json.loads((tmp_path / "out" / "iam-agent-policy.json").read_text())["Statement"]


def test_irsa_annotates_each_service_account_with_its_own_role():
    docs = rendered(v("automode", spec__aws__identity="irsa", spec__compileCache__verifyKey="A" * 43 + "=",
                      spec__compileCache__publisher={"image": "i", "signingKeySecret": "k"}))
    sas = {d["metadata"]["name"]: d["metadata"]["annotations"] for d in docs if d["kind"] == "ServiceAccount"}
    assert sas == {"nodewarm-bootstrap": {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/nodewarm-agent"},
                   "qwen3-35b-publisher": {"eks.amazonaws.com/role-arn":
                                           "arn:aws:iam::111122223333:role/nodewarm-publisher"}}


@pytest.mark.parametrize("changes, field", [
    (dict(spec__aws__identity="node"), "spec.aws.identity"),                    # a pod cannot use the node role
    (dict(spec__aws__agentRoleArn=None), "spec.aws.agentRoleArn"),
    (dict(spec__aws__clusterName=None), "spec.aws.clusterName"),
])
def test_a_pod_without_a_way_to_get_credentials_is_refused(changes, field):
    with pytest.raises(profile.ProfileError) as e:
        rendered(v("automode", **changes))
    assert e.value.field == field


def test_the_publisher_needs_the_buckets_region():
    with pytest.raises(profile.ProfileError) as e:
        rendered(v(spec__nodes__region=None, spec__compileCache__verifyKey="A" * 43 + "=",
                   spec__compileCache__publisher={"image": "i", "signingKeySecret": "k"}))
    assert e.value.field == "spec.nodes.region"


def test_strict_crd_check_fails_closed_on_an_apiversion_no_crd_describes():
    docs = rendered(v())
    old = dict(by_kind(docs, "NodePool"), apiVersion="karpenter.sh/v1beta1")     # a version the CRDs do not serve
    stray = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    report = crdvalidate.validate(docs + [old, stray, {"metadata": {"name": "nokind"}}], _strict_crds())
    assert set(report) == {"NodePool/gpu-p5", "Widget/w", "<no kind>/nokind"}
    assert "karpenter.sh/v1 NodePool" in report["NodePool/gpu-p5"][0] and "v1beta1" in report["NodePool/gpu-p5"][0]
    assert "pass its CRD file" in report["Widget/w"][0]
    # Built-in kinds (the vLLM Deployment, Service, RBAC) are the API server's to check: still no error.
    assert {d["kind"] for d in docs} >= {"Deployment", "Service"}


def test_the_nodes_load_check_is_tuned_like_the_vllm_pods_streamer():
    """The DaemonSet agent runs the load check (header checks); with --stream-check its streamer read uses the
    settings the vLLM pod gets, taken from the same WarmProfile it reads at boot."""
    from pathlib import Path

    from nodewarm.bootstrap import followplan, profilesource

    docs = rendered(v("automode", spec__serving__chunkSizeGB=2))
    c = container(docs)
    want_concurrency = json.loads(next(a for a in c["args"] if a.startswith("--model-loader-extra-config="))
                                  .split("=", 1)[1])["concurrency"]
    want_chunk = int(next(e["value"] for e in c["env"] if e["name"] == "RUNAI_STREAMER_CHUNK_BYTESIZE"))
    agent = daemonset(docs, "nodewarm-bootstrap-")["spec"]["template"]["spec"]["containers"][0]
    assert "--skip-load-check" not in agent["args"]
    resolved = profilesource.resolve(by_kind(docs, "WarmProfile"), Path("/mnt/.ephemeral"))
    cfg = followplan.agent_config(resolved, followplan.FollowOptions("p", Path("/mnt/.ephemeral"), "n"))
    assert cfg.load_check and cfg.streamer is None       # header checks only, no torch: the default
    cfg = followplan.agent_config(resolved, followplan.FollowOptions("p", Path("/mnt/.ephemeral"), "n", stream_check=True))
    assert cfg.load_check and (cfg.streamer.concurrency, cfg.streamer.chunk_bytes) == (want_concurrency, want_chunk)
    assert want_chunk == 2 * 2**30


def test_peers_render_the_controllers_role_for_the_key_and_nothing_else_changes():
    off = rendered(v())
    on = rendered(v(spec__weights={"peers": {"enabled": True}}))
    added = [d for d in on if d not in off]
    # The WarmProfile itself carries the setting; beyond it only the controller's Role and RoleBinding in the
    # bootstrap namespace (where the key Secret lives) are new, and every other document is the same.
    assert sorted((d["kind"], d["metadata"].get("namespace")) for d in added) == [
        ("Role", "nodewarm-system"), ("RoleBinding", "nodewarm-system"), ("WarmProfile", None)]
    role = next(d for d in added if d["kind"] == "Role")
    assert {r["resources"][0] for r in role["rules"]} == {"secrets", "roles", "rolebindings"}
    assert len(on) == len(off) + 2
