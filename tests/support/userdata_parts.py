"""The AL2023 user-data tests' shared pieces: a BootstrapLaunch as the renderer makes one, and the files the rendered
script writes (its heredocs)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nodewarm.userdata.launch import BootstrapLaunch

SHA = "0123456789abcdef" * 4
MOUNT = "/mnt/k8s-disks/0"


def launch(**overrides) -> BootstrapLaunch:
    fields = dict(artifact_uri="s3://cache-bucket/nodewarm/artifacts/nodewarm-0.1.0.tar.gz", artifact_sha256=SHA,
                  profile="llama-8b", cache_mount=MOUNT)
    return BootstrapLaunch(**{**fields, **overrides})


def heredoc(script: str, path: str) -> str:
    """The file the user-data script writes to ``path``."""
    match = re.search(rf"^cat > {re.escape(path)} <<'NODEWARM_EOF'\n(.*?)\nNODEWARM_EOF$", script, re.S | re.M)
    assert match, f"no heredoc for {path}"
    return match.group(1) + "\n"


def check_shell(files: dict[str, tuple[str, str]], tmp_path: Path) -> None:
    """Each of ``files`` ({name: (shell, text)}) parses under its shell (``-n``), then passes shellcheck."""
    for name, (shell, text) in files.items():
        (tmp_path / name).write_text(text)
        run = subprocess.run([shell, "-n", str(tmp_path / name)], capture_output=True, text=True)
        assert run.returncode == 0, (name, run.stderr)
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (apt-get install -y shellcheck)")
    for name, (shell, _) in files.items():
        run = subprocess.run(["shellcheck", "-s", shell, str(tmp_path / name)], capture_output=True, text=True)
        assert run.returncode == 0, (name, run.stdout)
