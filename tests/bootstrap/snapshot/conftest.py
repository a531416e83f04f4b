"""Fixtures of the snapshot tests: CRIU as setup builds it, the counter's root filesystem, a private runc root
(support/runcbox.py says what the counter does)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from support.runcbox import COUNTER_C, Runc


@pytest.fixture(scope="session")
def criu() -> str:
    from nodewarm_dev.testenv.criu import criu_binary
    return str(criu_binary())


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory) -> Path:
    """A root filesystem holding only the static counter (the image's one layer)."""
    if os.geteuid() != 0:
        pytest.fail("the snapshot tests run containers with runc: they need root (the test command runs as root)")
    base = tmp_path_factory.mktemp("counter")
    (base / "counter.c").write_text(COUNTER_C)
    root = base / "rootfs"
    for d in ("out", "dev/shm", "proc", "sys", "tmp"):
        (root / d).mkdir(parents=True)
    subprocess.run(["gcc", "-static", "-O2", "-o", str(root / "counter"), str(base / "counter.c")], check=True)
    return root


@pytest.fixture
def runc(tmp_path, rootfs):
    r = Runc(tmp_path, rootfs)
    yield r
    r.cleanup()
