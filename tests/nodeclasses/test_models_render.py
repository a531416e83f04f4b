"""spec.models rendered (docs/models.md): each further model's Deployment, Service and PDB from its view, placed by
its own Node label; every model readable by the agent (and the publisher); and nothing of spec.models on a node
object, so adding, removing or rolling a model drifts no node (Karpenter's hashes and the `render --diff` preview)."""

from __future__ import annotations

import copy
import json
import math
import re

import pytest
import yaml

from nodewarm import instancetypes, profile
from nodewarm.api import models
from nodewarm.api.errors import ProfileError
from nodewarm.api.generation import generation
from nodewarm.api.names import GENERATION_LABEL, NODEPOOL_LABEL, PROFILE_LABEL
from nodewarm.api.podlayout import model_dir, model_path
from nodewarm.karpenter import apis, driftpreview, drifthash as kh
from nodewarm.cli import main
from nodewarm.nodeclasses.render import render
from nodewarm.render_cli import check_claims, load_checked
from support import paths
from support.builders import INSTANCE_TYPE, POOL, v

CODER = {"name": "coder", "uri": "s3://models-bucket/coder-7b/", "sizeGB": 15, "required": True, "replicas": 2}
EMBED = {"name": "embed", "uri": "s3://other-bucket/embed/", "sizeGB": 2, "priority": 5}
PUBLISHER = {"uri": "s3://cache-bucket/compile-cache/", "verifyKey": "k" * 44,
             "publisher": {"image": "registry.example/vllm-nodewarm:0.21", "signingKeySecret": "nodewarm-signing"}}


def checked(doc):
    p = profile.from_dict(doc)
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    return p, types


def rendered(doc):
    p, types = checked(doc)
    return render(p, types)


def named(docs, kind, name):
    (d,) = [x for x in docs if x["kind"] == kind and x["metadata"]["name"] == name]
    return d


def kinds(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def refused(doc) -> ProfileError:
    with pytest.raises(ProfileError) as e:
        checked(doc)
    return e.value


# --- what is rendered per model ------------------------------------------------------------------------------------

def test_each_extra_model_gets_its_deployment_service_and_pdb_placed_by_its_own_label():
    p, _ = checked(v(spec__models=[CODER, EMBED]))
    docs = rendered(v(spec__models=[CODER, EMBED])).documents
    assert [d["metadata"]["name"] for d in kinds(docs, "Deployment")] == [
        "qwen3-35b-vllm", "qwen3-35b-coder-vllm", "qwen3-35b-embed-vllm"]
    for view in models.views(p)[1:]:
        dep = named(docs, "Deployment", f"{view.name}-vllm")
        spec = dep["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == {NODEPOOL_LABEL: POOL}      # never nodewarm.io/generation
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms == {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": models.label_key(view), "operator": "In", "values": [generation(view)]}]}]}
        assert models.label_key(view) == f"models.nodewarm.io/{view.name}"
        assert dep["spec"]["replicas"] == view.serving.replicas
        # The pods' profile label is the view's: the agent's "older pods of my profile" query for the first
        # model (followplan.older_pods, by nodewarm.io/profile=<profile>) never sees them.
        assert dep["spec"]["template"]["metadata"]["labels"][PROFILE_LABEL] == view.name
        vllm = spec["containers"][0]
        assert f"--model={model_path(view.name)}" in vllm["args"]
        weights = {"name": "weights", "hostPath": {"path": model_dir(view), "type": "DirectoryOrCreate"}}
        assert weights in spec["volumes"]
        assert named(docs, "Service", f"{view.name}-vllm")["spec"]["selector"][PROFILE_LABEL] == view.name
        assert named(docs, "PodDisruptionBudget", f"{view.name}-vllm")["spec"]["selector"]["matchLabels"][
            PROFILE_LABEL] == view.name
    assert named(docs, "Deployment", "qwen3-35b-coder-vllm")["spec"]["replicas"] == 2
    first = named(docs, "Deployment", "qwen3-35b-vllm")["spec"]["template"]["spec"]
    assert first["nodeSelector"] == {NODEPOOL_LABEL: POOL, GENERATION_LABEL: generation(p)}
    assert "affinity" not in first
    # One start script for all the profile's models.
    assert [c["metadata"]["name"] for c in kinds(docs, "ConfigMap")] == ["qwen3-35b-vllm-serve-start"]


def doc_profile() -> dict:
    """The profile docs/models.md shows under "The profile" (its first yaml block there), completed with the base
    profile's other fields: what a reader copies."""
    section = (paths.REPO / "docs" / "models.md").read_text().split("\n## The profile\n", 1)[1].split("\n## ", 1)[0]
    spec = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))["spec"]
    return v(**{f"spec__{k}": x for k, x in spec.items()})


def test_the_profile_docs_models_md_shows_renders(tmp_path, capsys):
    f = tmp_path / "profile.yaml"
    f.write_text(yaml.safe_dump(doc_profile()))
    p, types = load_checked(str(f))          # what `nodewarm render -f` loads and checks
    docs = render(p, types).documents
    assert p.models and [d["metadata"]["name"] for d in kinds(docs, "Deployment")] == [
        f"{view.name}-vllm" for view in models.views(p)]
    assert main(["render", "-f", str(f)]) == 0
    assert "Deployment" in [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]


def unsized(m):
    return {k: x for k, x in m.items() if k != "sizeGB"}


def vllm_container(docs, name):
    return named(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]


def loader_config(c) -> dict:
    return json.loads(next(a for a in c["args"] if a.startswith("--model-loader-extra-config=")).split("=", 1)[1])


def test_a_model_without_a_size_streams_at_the_streamers_default_and_its_probe_waits_for_the_largest_weights():
    p, types = checked(v(spec__models=[unsized(EMBED)]))
    view = models.views(p)[1]
    assert view.concurrency is None                             # the streamer's own default, not the formula's
    c = vllm_container(render(p, types).documents, "qwen3-35b-embed-vllm")
    assert loader_config(c) == {"distributed": True}            # TP=2
    # The budget of the largest weights the pod's GPUs serve: the largest size check_gpu_memory accepts.
    largest = profile.largest_weights_gb(p, types)
    checked(v(spec__model__sizeGB=largest - 0.01))
    with pytest.raises(ProfileError, match="use TP >= 4"):
        checked(v(spec__model__sizeGB=largest + 0.01))
    as_large = vllm_container(rendered(v(spec__models=[dict(EMBED, sizeGB=largest)])).documents,
                              "qwen3-35b-embed-vllm")
    assert c["startupProbe"] == as_large["startupProbe"]
    assert loader_config(as_large) == {"concurrency": math.ceil(largest / 4), "distributed": True}
    small = vllm_container(rendered(v(spec__models=[EMBED])).documents, "qwen3-35b-embed-vllm")
    assert small["startupProbe"]["failureThreshold"] < c["startupProbe"]["failureThreshold"]


def test_a_views_model_is_named_by_its_own_entry_of_spec_models():
    """Views warm in another order than the document lists them (required first): each model's fields are still
    named by its own entry, never as spec.model, whose place its view takes."""
    p, _ = checked(v(spec__models=[EMBED, CODER]))
    assert [(view.name, view.model.where) for view in models.views(p)] == [
        ("qwen3-35b", "spec.model"), ("qwen3-35b-coder", "spec.models[1]"), ("qwen3-35b-embed", "spec.models[0]")]
    e = refused(v(spec__models=[EMBED, unsized(CODER)]))
    assert e.field == "spec.models[1].sizeGB"


def test_a_profile_without_models_renders_exactly_what_it_did():
    plain = rendered(v()).documents
    with_empty = rendered(v(spec__models=[])).documents
    assert with_empty[1:] == plain[1:]          # the WarmProfile document itself carries the (empty) list
    assert [d["kind"] for d in plain].count("Deployment") == 1


def test_the_extra_models_share_the_profiles_publisher_identity_and_the_engine_check_stays_the_first_models():
    def doc(ms):
        return v(spec__models=ms, spec__compileCache=PUBLISHER, spec__aws__identity="podIdentity",
                 spec__readiness__engineCheck={"enabled": True})

    one, many = rendered(doc(None)), rendered(doc([CODER, EMBED]))
    # Identity (ServiceAccount, RBAC, admission policy) and the engine check (PodTemplate, Role): not per model.
    shared = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
              "ValidatingAdmissionPolicyBinding", "PodTemplate", "Role", "RoleBinding", "ConfigMap")
    assert [d for d in many.documents if d["kind"] in shared] == [d for d in one.documents if d["kind"] in shared]
    assert many.pod_identity_commands == one.pod_identity_commands
    for name in ("qwen3-35b-coder-vllm", "qwen3-35b-embed-vllm"):
        spec = named(many.documents, "Deployment", name)["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == "qwen3-35b-publisher"


@pytest.mark.parametrize("principal", ["agent", "publisher"])
def test_the_agent_and_the_publisher_may_read_every_models_prefix(principal):
    doc = v(spec__models=[CODER, EMBED], spec__compileCache=PUBLISHER)
    policy = rendered(doc).iam_policies[principal]
    reads = [r for s in policy["Statement"] if s["Sid"].startswith("ReadModel") for r in s["Resource"]]
    lists = [(s["Resource"], s["Condition"]["StringLike"]["s3:prefix"]) for s in policy["Statement"]
             if s["Sid"].startswith("ListModel")]
    assert sorted(reads) == ["arn:aws:s3:::models-bucket/coder-7b/*", "arn:aws:s3:::models-bucket/qwen3-35b/*",
                             "arn:aws:s3:::other-bucket/embed/*"]
    assert (["arn:aws:s3:::other-bucket"], ["embed/*"]) in lists
    sids = [s["Sid"] for s in policy["Statement"]]
    assert len(sids) == len(set(sids))          # IAM refuses a policy with a Sid twice


# --- no drift ----------------------------------------------------------------------------------------------------

def node_objects(doc) -> dict[str, dict]:
    return {d["kind"]: d for d in rendered(doc).documents if d["kind"] in ("EC2NodeClass", "NodeClass", "NodePool")}


ROLLED = dict(CODER, uri="s3://models-bucket/coder-7b-v2/", revision="r2")
MODEL_SETS = {"none": None, "one": [CODER], "two": [CODER, EMBED], "removed": [EMBED], "rolled": [ROLLED, EMBED],
              "empty": []}


@pytest.mark.parametrize("mode", ["karpenter", "bottlerocket", "automode"])
def test_nothing_of_spec_models_reaches_a_node_object(mode):
    def doc(ms):
        changes = {"spec__models": ms}
        if mode == "bottlerocket":
            changes["spec__nodes__amiAlias"] = "bottlerocket@v1.20.4"
        return v("automode" if mode == "automode" else "karpenter", **changes)

    base = node_objects(doc(None))
    for name, ms in MODEL_SETS.items():
        objs = node_objects(doc(ms))
        # Whole objects, limits included: extra models' pods ride on the nodes the first model's pods bring up
        # (vllm.placement), so they add no node the GPU limit must allow for.
        assert objs == base, name
        assert kh.nodepool_hash(objs["NodePool"]) == kh.nodepool_hash(base["NodePool"])
        if mode != "automode":
            for version in apis.EC2NODECLASS_VERSIONS:
                assert kh.ec2nodeclass_hash(objs["EC2NodeClass"], "ca", version) == \
                    kh.ec2nodeclass_hash(base["EC2NodeClass"], "ca", version)


def test_the_gpu_limit_is_outside_the_nodepool_hash_whatever_it_counts():
    pool = node_objects(v(spec__models=[CODER]))["NodePool"]
    more = copy.deepcopy(pool)
    more["spec"]["limits"]["nvidia.com/gpu"] = str(int(pool["spec"]["limits"]["nvidia.com/gpu"]) + 16)
    assert kh.nodepool_hash(more) == kh.nodepool_hash(pool)


def stamped(obj: dict) -> dict:
    out = copy.deepcopy(obj)
    h = kh.stamped_hash(out, "ca")
    out["metadata"]["annotations"] = {h.hash_annotation: h.value, h.version_annotation: h.version}
    return out


def live_claim(pool: dict, nodeclass: dict) -> dict:
    """A NodeClaim as Karpenter launched it from ``pool`` and ``nodeclass``: their stamps and the labels the
    pool's requirements ask for."""
    annotations = {**pool["metadata"]["annotations"], **nodeclass["metadata"]["annotations"]}
    labels = {NODEPOOL_LABEL: POOL, "node.kubernetes.io/instance-type": INSTANCE_TYPE, GENERATION_LABEL: "g1",
              "karpenter.k8s.aws/instance-local-nvme": "30400"}
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "claim-1", "labels": labels, "annotations": annotations},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                      "name": nodeclass["metadata"]["name"]}}}


@pytest.mark.parametrize("name", sorted(MODEL_SETS))
def test_render_diff_predicts_no_drift_when_models_change(name):
    before = node_objects(v(spec__models=[CODER]))
    live = [stamped(before["NodePool"]), stamped(before["EC2NodeClass"])]
    claim = live_claim(*live)
    after = list(node_objects(v(spec__models=MODEL_SETS[name])).values())
    assert driftpreview.preview(after, live, [claim]).count() == 0
    # The same preview sees a hashed change: it is not blind.
    hashed = list(node_objects(v(spec__models=MODEL_SETS[name], spec__readiness__taintKey="example.com/w")).values())
    assert driftpreview.preview(hashed, live, [claim]).count() == 1


# --- render-time errors --------------------------------------------------------------------------------------------

def test_two_models_with_one_name_are_refused():
    e = refused(v(spec__models=[CODER, dict(EMBED, name="coder")]))
    assert e.field == "spec.models[1].name" and e.value == "coder" and "own name" in e.fix


@pytest.mark.parametrize("models_, where, field", [
    ([dict(EMBED, uri="s3://models-bucket/qwen3-35b/")], "spec.model", "spec.models[0].uri"),
    ([CODER, dict(EMBED, uri=CODER["uri"])], "spec.models[0]", "spec.models[1].uri"),
])
def test_a_model_claiming_another_models_folder_is_refused(models_, where, field):
    e = refused(v(spec__models=models_))
    assert e.field == field and "claims the same model folder" in e.fix and where in e.fix


def test_the_same_weights_at_another_revision_are_another_model():
    checked(v(spec__models=[dict(EMBED, uri="s3://models-bucket/qwen3-35b/", revision="awq")]))


def test_a_model_name_too_long_for_its_service_is_refused():
    name = "m" * 20                                  # the schema's maxLength
    doc = v(metadata__name="a-profile-name-of-forty-characters-ok-x", spec__models=[dict(EMBED, name=name)])
    e = refused(doc)
    service = f"a-profile-name-of-forty-characters-ok-x-{name}-vllm"
    assert e.field == "spec.models[0].name" and e.value == name
    assert service in e.fix and f"at most {63 - len(service) + 20} characters" in e.fix
    checked(v(metadata__name="a-profile-name-of-forty-characters-ok-x",
              spec__models=[dict(EMBED, name="m" * (63 - len(service) + 20))]))


def test_a_required_model_needs_its_size():
    e = refused(v(spec__models=[unsized(CODER)]))
    assert e.field == "spec.models[0].sizeGB" and e.value is None
    checked(v(spec__models=[unsized(EMBED)]))       # not required: nothing waits for it


SMALL = dict(spec__nodes__instanceTypes=["g6e.2xlarge", "g6e.xlarge"], spec__serving__tensorParallelSize=1,
             spec__model__sizeGB=20)


def test_the_required_models_must_fit_together_on_every_types_nvme():
    big = {"name": "big", "uri": "s3://models-bucket/big/", "sizeGB": 500}     # not required: not counted
    ms = [dict(CODER, sizeGB=100), big, dict(CODER, name="coder2", uri="s3://models-bucket/c2/", sizeGB=120)]
    e = refused(v(spec__models=ms, **SMALL))
    assert e.field == "spec.models[2].required" and e.value is True
    assert "spec.model 20 GB + spec.models[0] 100 GB + spec.models[2] 120 GB = 240 GB" in e.fix
    assert "g6e.xlarge has 250 GB" in e.fix and "270 GB" in e.fix
    checked(v(spec__models=ms[:2], **SMALL))                  # 120 GB + 30 GB headroom fit 250 GB


# --- two profiles of one cluster -------------------------------------------------------------------------------

def loaded(doc):
    return profile.from_dict(doc)


def test_two_profiles_claiming_one_model_name_are_refused():
    a = loaded(v(spec__models=[CODER]))
    # Profile "qwen3" with model "35b-coder" is the view qwen3-35b-coder, like a's coder.
    b = loaded(v(metadata__name="qwen3", spec__nodes__nodePool="other",
                 spec__models=[EMBED, dict(EMBED, name="35b-coder", uri="s3://models-bucket/x/")]))
    with pytest.raises(ProfileError) as e:
        check_claims([("a.yaml", a), ("b.yaml", b)])
    assert e.value.field == "b.yaml: spec.models[1].name" and e.value.value == "35b-coder"
    assert "qwen3-35b-coder" in e.value.fix and "rename" in e.value.fix
    c = loaded(v(metadata__name="qwen3-35b-coder", spec__nodes__nodePool="third"))
    with pytest.raises(ProfileError) as e:
        check_claims([("a.yaml", a), ("c.yaml", c)])
    assert e.value.field == "c.yaml: metadata.name"


def test_two_profiles_on_one_nodepool_are_refused_and_a_profile_beside_its_own_copy_is_not():
    a = loaded(v())
    b = loaded(v(metadata__name="llama", spec__model__uri="s3://models-bucket/llama/"))
    with pytest.raises(ProfileError) as e:
        check_claims([("a.yaml", a), ("b.yaml", b)])
    assert e.value.field == "b.yaml: spec.nodes.nodePool" and e.value.value == POOL
    assert "list the models in one profile's spec.models" in e.value.fix
    check_claims([("a.yaml", a), ("cluster.yaml", loaded(v(spec__models=[CODER])))])


def test_render_refuses_a_clash_with_also(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(v(spec__models=[CODER])))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(v(metadata__name="llama")))
    assert main(["render", "-f", str(tmp_path / "a.yaml"), "--also", str(tmp_path / "b.yaml")]) == 2
    assert "b.yaml: spec.nodes.nodePool" in capsys.readouterr().err
    assert main(["render", "-f", str(tmp_path / "a.yaml")]) == 0
