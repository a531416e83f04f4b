"""What `nodewarm render` prints for every example is pinned byte for byte: a restructuring that moves code must not
move a single rendered field, because Karpenter hashes NodeClass/NodePool fields and replaces nodes when one
changes. The golden files were written by the code before the package layout changed; a deliberate change to the
rendered objects rewrites them with NODEWARM_UPDATE_GOLDEN=1 and says why in its commit."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

from nodewarm.cli import main
from support import paths

ROOT = paths.REPO
EXAMPLES = paths.EXAMPLES
GOLDEN = paths.FIXTURES / "golden"
CONTROLLER_IMAGE = "registry.example/nodewarm:golden"

VARIANTS = {"": [], ".iam": ["--iam"], ".with-controller": ["--with-controller", CONTROLLER_IMAGE]}
CASES = {f"{ex.stem}{suffix}.out": ["render", "-f", str(ex), *extra]
         for ex in sorted(EXAMPLES.glob("*.yaml")) for suffix, extra in VARIANTS.items()}
CASES["crd.out"] = ["render", "--crd"]
# spec.readiness.engineCheck on (the PodTemplate, Role and RoleBinding it adds, the controller in its own namespace):
# not an example of its own, which are the three launchers (tests/test_examples.py).
CASES["engine-check.out"] = ["render", "-f", str(paths.FIXTURES / "profiles" / "engine-check.yaml"),
                             "--with-controller", CONTROLLER_IMAGE, "--controller-namespace", "platform"]


def _run(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0, argv
    return out.getvalue().replace(str(ROOT), "<repo>")


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_output_is_byte_identical_to_the_golden_file(name):
    got = _run(CASES[name])
    path = GOLDEN / name
    if os.environ.get("NODEWARM_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"no golden file {path}: write it with NODEWARM_UPDATE_GOLDEN=1"
    assert got == path.read_text(), f"{' '.join(CASES[name])} no longer renders what {path.name} pins"


def test_every_example_is_pinned():
    assert {p.name for p in GOLDEN.glob("*.out")} == set(CASES)
