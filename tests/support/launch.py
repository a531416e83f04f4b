"""The rendered nodewarm-launch script as a node runs it (download from the local S3, verify, run): what the
launch tests and the agent's tests share, with the fixtures that give it a bucket and an `aws` command."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from nodewarm.userdata.al2023 import render_script
from nodewarm.userdata.launch import BootstrapLaunch

BUCKET = "nodewarm-launch-test"


def launch_script(uri: str, sha256: str) -> str:
    launch = BootstrapLaunch(artifact_uri=uri, artifact_sha256=sha256, profile="p", cache_mount="/mnt/k8s-disks/0")
    script = render_script(launch)
    match = re.search(r"^cat > /opt/nodewarm/bin/nodewarm-launch <<'NODEWARM_EOF'\n(.*?)\nNODEWARM_EOF$",
                      script, re.S | re.M)
    return match.group(1) + "\n"


def tiny_artifact(body: bytes = b'#!/bin/sh\necho "ran: $*"\n') -> bytes:
    """A stand-in artifact whose bin/nodewarm echoes its arguments (or is ``body``)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo("bin/nodewarm")
        info.size, info.mode = len(body), 0o755
        tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


@pytest.fixture
def aws_path(tmp_path) -> str:
    """PATH with an `aws` command: the real AWS CLI where installed, else a boto3 stand-in for `s3 cp`
    (the download still goes to the real local S3 server)."""
    path = os.environ["PATH"]
    if shutil.which("aws"):
        return path
    stand_in = tmp_path / "aws-bin" / "aws"
    stand_in.parent.mkdir()
    stand_in.write_text(
        f"#!{sys.executable}\n"
        "import sys, boto3\n"
        "args = [a for a in sys.argv[1:] if a != '--only-show-errors']\n"
        "assert args[:2] == ['s3', 'cp'], args\n"
        "bucket, key = args[2].removeprefix('s3://').split('/', 1)\n"
        "boto3.client('s3').download_file(bucket, key, args[3])\n"
    )
    stand_in.chmod(0o755)
    return f"{stand_in.parent}:{path}"


@pytest.fixture
def bucket(s3):
    client = s3.client()
    if BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        s3.create_bucket(BUCKET)
    return client


def run_launch(tmp_path: Path, s3, aws_path: str, uri: str, sha256: str) -> subprocess.CompletedProcess:
    script = tmp_path / "nodewarm-launch"
    script.write_text(launch_script(uri, sha256))
    env = {**os.environ, **s3.env(), "PATH": aws_path, "NODEWARM_ROOT": str(tmp_path / "opt"),
           "NODEWARM_STATE_DIR": str(tmp_path / "state"),
           "NODEWARM_ARTIFACT_URI": uri, "NODEWARM_ARTIFACT_SHA256": sha256}
    return subprocess.run(["bash", str(script), "bootstrap", "run", "--profile", "p"], env=env,
                          capture_output=True, text=True, timeout=120)
