"""What a user applies: plain YAML, a first install that works in one documented command, and no user data
(which may hold secrets) copied into the cluster-scoped WarmProfile."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from nodewarm.cli import main
from nodewarm.controller import manifests
from nodewarm.render_cli import HELP
from nodewarm.nodeclasses.render import render, warmprofile_document
from nodewarm import instancetypes, profile
from support.builders import USER_MIME, v


def _render_cli(capsys, *argv: str) -> str:
    assert main(["render", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("doc", [v(), v("automode"), v(spec__nodes__amiAlias="bottlerocket@latest",
                                                       spec__bootstrap={"image": "registry.example/nodewarm:1"})])
def test_render_prints_no_yaml_anchors(doc, tmp_path, capsys):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    out = _render_cli(capsys, "-f", str(f), "--with-controller", "registry.example/nodewarm:0.1.0")
    p = profile.from_dict(doc)
    docs = manifests.render("registry.example/nodewarm:0.1.0") + \
        render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
    # The objects do share dicts (label maps, selectors): a plain safe_dump prints them as &id001 / *id001.
    assert yaml.safe_dump_all(docs).count("&id") > 0
    assert "&id" not in out and "*id" not in out
    assert list(yaml.safe_load_all(out)) == docs


def test_the_warmprofile_in_the_cluster_carries_no_user_data(tmp_path, capsys):
    doc = v(spec__nodes__userData=USER_MIME)
    p = profile.from_dict(doc)
    wp = warmprofile_document(p)
    assert "userData" not in wp["spec"]["nodes"] and "user-part-one" not in yaml.safe_dump(wp)
    assert p.raw["spec"]["nodes"]["userData"] == USER_MIME          # the parsed profile is left as it was
    # The EC2NodeClass rendered beside it still carries the user's part, merged with nodewarm's.
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    docs = list(yaml.safe_load_all(_render_cli(capsys, "-f", str(f))))
    by_kind = {d["kind"]: d for d in docs}
    assert "userData" not in by_kind["WarmProfile"]["spec"]["nodes"]
    assert "user-part-one" in by_kind["EC2NodeClass"]["spec"]["userData"]
    # What the cluster holds is still a valid profile that renders the same objects, user data aside.
    assert profile.from_dict(by_kind["WarmProfile"]).nodes.user_data is None


def test_render_crd_prints_the_crd_alone_and_with_controller_leaves_it_out(tmp_path, capsys):
    crd_docs = list(yaml.safe_load_all(_render_cli(capsys, "--crd")))
    assert [d["kind"] for d in crd_docs] == ["CustomResourceDefinition"]
    assert crd_docs[0]["metadata"]["name"] == "warmprofiles.nodewarm.io"
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(v()))
    kinds = [d["kind"] for d in yaml.safe_load_all(_render_cli(capsys, "-f", str(f), "--with-controller", "img:1"))]
    assert "CustomResourceDefinition" not in kinds and "WarmProfile" in kinds
    assert main(["render"]) == 2
    assert "-f/--file" in capsys.readouterr().err


def _documented_first_install() -> str:
    """The first-install command exactly as `nodewarm render --help` prints it."""
    lines = HELP.split("First install, in one command")[1].splitlines()[1:4]
    return " ".join(line.strip().rstrip("\\") for line in lines)


@pytest.mark.kube
def test_the_documented_first_install_works_where_one_apply_does_not(bare_cluster, tmp_path):
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed on PATH: the documented install command is a kubectl one"
    kubeconfig = bare_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    profile_file = tmp_path / "profile.yaml"
    profile_file.write_text(yaml.safe_dump(v(metadata__name="first-install", spec__serving__namespace="default")))
    # The local API server is v1.20, which serves no policy/v1 (1.21+; every EKS version does): a kubectl in
    # front of the real one drops the rendered PodDisruptionBudget from what it applies, and nothing else.
    shim = tmp_path / "bin" / "kubectl"
    shim.parent.mkdir()
    shim.write_text(f"""#!{sys.executable}
import subprocess, sys, yaml
stdin = None
if "apply" in sys.argv:
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d and d.get("kind") != "PodDisruptionBudget"]
    stdin = yaml.safe_dump_all(docs)
sys.exit(subprocess.run([{kubectl!r}, *sys.argv[1:]], input=stdin, text=True).returncode)
""")
    shim.chmod(0o755)
    # `nodewarm` as the user runs it: the console script beside this interpreter.
    env = {**os.environ, "KUBECONFIG": str(kubeconfig),
           "PATH": f"{shim.parent}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}

    def sh(cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-o", "pipefail", "-c", cmd], env=env, capture_output=True, text=True,
                              timeout=180, check=False)

    # One apply of the CRD and a profile: kubectl maps every kind first, so the WarmProfile fails.
    both = sh("{ nodewarm render --crd; nodewarm render -f %s; } | kubectl apply --server-side -f -" % profile_file)
    assert both.returncode != 0 and "WarmProfile" in both.stderr, both.stderr
    sh("kubectl delete crd warmprofiles.nodewarm.io --ignore-not-found --wait=true")
    assert "warmprofiles" not in sh("kubectl get crd -o name").stdout

    cmd = _documented_first_install().replace("profile.yaml", str(profile_file)).replace(
        "IMAGE", "registry.example/nodewarm:0.1.0")
    done = sh(cmd)
    assert done.returncode == 0, done.stderr
    got = sh("kubectl get warmprofiles.nodewarm.io first-install -o yaml")
    assert got.returncode == 0 and yaml.safe_load(got.stdout)["spec"]["model"]["uri"] == "s3://models-bucket/qwen3-35b/"
    assert sh("kubectl -n nodewarm get deployment nodewarm-controller -o name").returncode == 0
