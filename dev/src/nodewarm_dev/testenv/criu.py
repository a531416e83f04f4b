"""CRIU, the checkpoint/restore tool that runc drives, as build-criu.sh builds it (from Debian sid's source).

Why a build of our own: bookworm's packaged criu 3.17 fails ``criu check`` on this machine's kernel (its vDSO), and
CRIU 4.1 fails on TCP sockets on kernels >= 6.16; 4.2 and later work. build-criu.sh caches the binary in
``~/.cache/nodewarm/criu`` (or ``$NODEWARM_CRIU_BIN``); this module finds it and reads its version, so a caller
says what is missing and how to get it instead of failing later inside runc.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# The product's reading of `criu --version`: one home, the one the node's handler uses.
from nodewarm.bootstrap.snapshot.nodefacts import parse_criu_version as parse_version

BUILD_SCRIPT = "bash dev/src/nodewarm_dev/testenv/build-criu.sh"


def criu_bin_dir() -> Path:
    """The folder build-criu.sh writes ``criu`` to: ``$NODEWARM_CRIU_BIN``, else ``~/.cache/nodewarm/criu``."""
    return Path(os.environ.get("NODEWARM_CRIU_BIN", Path.home() / ".cache/nodewarm/criu"))


def criu_binary() -> Path:
    """The cached criu binary. Raises RuntimeError naming the build script when it is not there: the only criu that
    works on this kernel is the one that script builds, so a system criu is never a silent stand-in."""
    path = criu_bin_dir() / "criu"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise RuntimeError(f"no CRIU binary at {path}: build it with `{BUILD_SCRIPT}` "
                           "(CRIU >= 4.2 from Debian's source, cached; NODEWARM_CRIU_BIN names another folder)")
    return path


def criu_version(path: Path | str) -> tuple[int, int, int]:
    """The version the criu binary at ``path`` reports (``criu --version``), e.g. (4, 2, 1): what tells the cached
    build (>= nodefacts.MIN_CRIU) from an older criu that fails on this kernel."""
    run = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    if run.returncode != 0:
        raise RuntimeError(f"{path} --version exited {run.returncode}: {(run.stderr or run.stdout).strip()[:300]}")
    return parse_version(run.stdout)
