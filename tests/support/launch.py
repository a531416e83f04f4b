"""The rendered nodewarm-launch script as a node runs it (download from the local S3, verify, run): what the
launch tests and the agent's tests share (the fixtures that give it a bucket and an `aws` command are in
tests/conftest.py)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
from pathlib import Path

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


def run_launch(tmp_path: Path, s3, aws_path: str, uri: str, sha256: str) -> subprocess.CompletedProcess:
    script = tmp_path / "nodewarm-launch"
    script.write_text(launch_script(uri, sha256))
    env = {**os.environ, **s3.env(), "PATH": aws_path, "NODEWARM_ROOT": str(tmp_path / "opt"),
           "NODEWARM_STATE_DIR": str(tmp_path / "state"),
           "NODEWARM_ARTIFACT_URI": uri, "NODEWARM_ARTIFACT_SHA256": sha256}
    return subprocess.run(["bash", str(script), "bootstrap", "run", "--profile", "p"], env=env,
                          capture_output=True, text=True, timeout=120)
