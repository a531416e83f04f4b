"""The examples in examples/ are what a user copies: each must load, pass every semantic check (the GPU-memory
fit included), render, pass the strict check against the upstream Karpenter CRDs, and have the compile cache
fully configured (signed bundles restored by the agent, published by the sidecar)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from nodewarm import instancetypes, profile
from nodewarm.bootstrap import followplan, profilesource
from nodewarm.bootstrap.compilecache import signing
from nodewarm.cli import main
from nodewarm.nodeclasses import crdvalidate, identity
from nodewarm.nodeclasses.render import render
from nodewarm_dev.testenv import kube as kubeenv
from nodewarm_dev.testenv.crds import AUTOMODE_TEST_CRD
from support import crds as crdsupport
from support import paths

EXAMPLES = paths.EXAMPLES
# name -> (mode, AMI family or None for Auto Mode, where the agent runs)
EXPECTED = {
    "karpenter-al2023.yaml": ("karpenter", "al2023@", "host"),
    "karpenter-bottlerocket.yaml": ("karpenter", "bottlerocket@", "daemonset"),
    "automode.yaml": ("automode", None, "daemonset"),
}


def test_the_examples_are_the_three_launchers():
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(EXPECTED)


def checked(name: str):
    p = profile.load(EXAMPLES / name)
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)                 # NVMe, TP, GPU-memory fit, identities, deadlines
    return p, render(p, types).documents


def by_kind(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, (kind, [d["kind"] for d in docs])
    return found[0]


def strict_crds():
    return crdsupport.strict_crds()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_loads_checks_renders_and_passes_the_strict_crd_check(name):
    mode, ami, agent = EXPECTED[name]
    p, docs = checked(name)
    assert p.nodes.mode == mode and p.uses_daemonset == (agent == "daemonset")
    if ami:
        assert p.nodes.ami_alias.startswith(ami)
    assert crdvalidate.validate(docs, strict_crds()) == {}
    kinds = {d["kind"] for d in docs}
    assert {"WarmProfile", "NodePool", "Deployment"} <= kinds
    assert ("NodeClass" if mode == "automode" else "EC2NodeClass") in kinds
    # Every Karpenter/EKS object was checked, none skipped as built-in.
    crd_kinds = {k for _, k in strict_crds()}
    assert {d["kind"] for d in docs if d["kind"] in crd_kinds} >= {"WarmProfile", "NodePool"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_has_the_compile_cache_fully_configured(name, tmp_path):
    p, docs = checked(name)
    cc = p.compile_cache
    # A verify key nodes can use: an Ed25519 public key as keygen prints it.
    assert cc.verify_key and signing.load_public(cc.verify_key)
    assert cc.publisher and cc.publisher.image and cc.publisher.signing_key_secret
    # The publisher sidecar is rendered, with the signing key mounted from the named Secret.
    pod = by_kind(docs, "Deployment")["spec"]["template"]["spec"]
    pub = next(c for c in pod["containers"] if c["name"] == "nodewarm-publish")
    assert pub["image"] == cc.publisher.image and "publish" in pub["args"] and cc.uri in pub["args"]
    secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
    assert cc.publisher.signing_key_secret in secrets
    assert {"name": "AWS_REGION", "value": p.nodes.region} in pub["env"]
    # Its identity, and the agent's when it is a pod: a role for each principal, as the identity needs it.
    principals = identity.principals(p)
    assert {x.name for x in principals} == ({"agent", "publisher"} if p.uses_daemonset else {"publisher"})
    assert all(x.role_arn for x in principals)
    if p.aws.identity == "podIdentity":
        assert p.aws.cluster_name and len(render(p, instancetypes.lookup(list(p.nodes.instance_types)))
                                          .pod_identity_commands) == len(principals)
    else:
        assert p.aws.identity == "irsa"
        sas = [d for d in docs if d["kind"] == "ServiceAccount"]
        assert {x.role_arn for x in principals} <= {
            (s["metadata"].get("annotations") or {}).get(identity.IRSA_ANNOTATION) for s in sas}
    # The agent restores: its config, derived from the WarmProfile as render stores it in the cluster, has the
    # bundle prefix and the verify key (without a verify key it never restores: NoVerifyKey).
    stored = by_kind(docs, "WarmProfile")
    resolved = profilesource.resolve({**stored, "metadata": {**stored["metadata"], "resourceVersion": "1"}}, tmp_path)
    cfg = followplan.agent_config(resolved, followplan.FollowOptions(profile=p.name, mount=tmp_path, node_name="n"))
    assert cfg.compile_cache_uri == cc.uri and cfg.verify_key == cc.verify_key
    assert cfg.serving_spec().tp == p.serving.tensor_parallel_size


def test_the_al2023_example_pins_the_artifact_nodewarm_package_builds():
    from nodewarm.userdata.package import artifact_name

    p, docs = checked("karpenter-al2023.yaml")
    sha = p.bootstrap.artifact_sha256
    assert isinstance(sha, str) and len(sha) == 64
    # The name `nodewarm package` gives the tar.gz it builds (content-addressed by this sha256).
    assert p.bootstrap.artifact_uri.endswith("/" + artifact_name("0.1.0", "3.11", "x86_64", sha))
    user_data = by_kind(docs, "EC2NodeClass")["spec"]["userData"]
    assert p.bootstrap.artifact_uri in user_data and sha in user_data


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_render_cli_checks_the_example_against_the_crds(name, tmp_path, capsys):
    crds = tmp_path / "crds"
    crds.mkdir()
    # The folder a user passes: one YAML file per CRD (the Karpenter CRDs in force, and the Auto Mode one).
    for doc in kubeenv.karpenter_crds():
        (crds / f"{doc['metadata']['name']}.yaml").write_text(yaml.safe_dump(doc))
    shutil.copy(AUTOMODE_TEST_CRD, crds / AUTOMODE_TEST_CRD.name.replace(".test-crd", ""))
    assert main(["render", "-f", str(EXAMPLES / name), "--crds", str(crds)]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert by_kind(docs, "WarmProfile")["metadata"]["name"] == profile.load(EXAMPLES / name).name
