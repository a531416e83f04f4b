"""CRIU as build-criu.sh builds it (nodewarm_dev.testenv.criu): the cached binary is there, is 4.2 or later and passes
``criu check`` on this kernel (root: this machine's tests run as root); running the script again changes nothing.

Where the binary is missing these tests FAIL with the fix (criu_binary's RuntimeError), never skip: build it with
dev/src/nodewarm_dev/testenv/build-criu.sh (scripts/setup.sh runs it).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from nodewarm_dev.testenv import criu

SCRIPT = Path(criu.__file__).with_name("build-criu.sh")


def test_the_cached_binary_is_criu_4_2_or_later():
    path = criu.criu_binary()
    assert path == criu.criu_bin_dir() / "criu"
    assert criu.criu_version(path) >= (4, 2, 0), f"{path}: {criu.criu_version(path)}"


def test_criu_check_passes_on_this_kernel():
    assert os.geteuid() == 0, "criu check needs root; this machine's tests run as root"
    run = subprocess.run([str(criu.criu_binary()), "check"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"criu check exited {run.returncode}:\n{run.stdout}\n{run.stderr}"
    assert "Looks good" in run.stdout + run.stderr, run.stdout + run.stderr


@pytest.mark.parametrize("output, version", [
    ("Version: 4.2.1\n", (4, 2, 1)),
    ("Version: 3.17.1\nGitID: v3.17.1-12-gabcdef0\n", (3, 17, 1)),
    ("Version: 4.2\n", (4, 2, 0)),                          # a release without a patch number
    ("criu: some notice\nVersion: 4.10.0\n", (4, 10, 0)),   # compared as numbers, not text
])
def test_version_lines_parse(output, version):
    assert criu.parse_version(output) == version


def test_output_without_a_version_line_is_refused():
    with pytest.raises(ValueError, match="no 'Version"):
        criu.parse_version("Usage: criu [options]\n")


def test_criu_version_reads_what_the_binary_prints(tmp_path):
    fake = tmp_path / "criu"
    fake.write_text("#!/bin/sh\necho 'Version: 4.1'\n")
    fake.chmod(0o755)
    assert criu.criu_version(fake) == (4, 1, 0)


def test_a_missing_binary_names_the_build_script(tmp_path, monkeypatch):
    monkeypatch.setenv("NODEWARM_CRIU_BIN", str(tmp_path))
    with pytest.raises(RuntimeError, match="bash dev/src/nodewarm_dev/testenv/build-criu.sh") as e:
        criu.criu_binary()
    assert str(tmp_path / "criu") in str(e.value)


def test_a_second_run_of_the_script_is_a_quick_no_op():
    path = criu.criu_binary()
    before = path.stat().st_mtime_ns
    t0 = time.monotonic()
    run = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert run.returncode == 0, run.stdout + run.stderr
    assert "already built" in run.stdout, run.stdout + run.stderr
    assert took < 10, f"a cached run took {took:.1f} s"
    assert path.stat().st_mtime_ns == before
