"""Fixtures of the snapshot tests: CRIU as setup builds it, the counter's root filesystem, a private runc root
(support/runcbox.py says what the counter does)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.runcbox import Runc, counter_rootfs


@pytest.fixture(scope="session")
def criu() -> str:
    from nodewarm_dev.testenv.criu import criu_binary
    return str(criu_binary())


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory) -> Path:
    """A root filesystem holding only the static counter (the image's one layer)."""
    if os.geteuid() != 0:
        pytest.fail("the snapshot tests run containers with runc: they need root (the test command runs as root)")
    return counter_rootfs(tmp_path_factory.mktemp("counter"))


@pytest.fixture
def runc(tmp_path, rootfs):
    r = Runc(tmp_path, rootfs)
    yield r
    r.cleanup()
