"""The dependency floors the two pyproject.toml files declare (nodewarm's, and nodewarm-dev's in dev/) and the
constraints file the floors run installs (scripts/test-floors.sh) are the same versions: a floor raised in one place
only is caught here."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from support.paths import REPO

PYPROJECTS = (REPO / "pyproject.toml", REPO / "dev" / "pyproject.toml")


def _floors_declared() -> dict[str, Version]:
    lines = []
    for path in PYPROJECTS:
        project = tomllib.loads(path.read_text())["project"]
        lines += project["dependencies"]
        for extra in project.get("optional-dependencies", {}).values():
            lines += extra
    out = {}
    for line in lines:
        req = Requirement(line)
        lower = [s.version for s in req.specifier if s.operator == ">="]
        if lower:
            assert out.get(canonicalize_name(req.name), Version(lower[0])) == Version(lower[0]), line
            out[canonicalize_name(req.name)] = Version(lower[0])
    return out


def _floors_pinned() -> dict[str, Version]:
    out = {}
    for line in (REPO / "constraints/floors.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"constraints/floors.txt must pin exactly: {line}"
            out[canonicalize_name(req.name)] = Version(spec.version)
    return out


def test_every_declared_floor_is_pinned_at_exactly_that_version():
    declared, pinned = _floors_declared(), _floors_pinned()
    assert declared == pinned


def test_every_dependency_has_a_floor():
    for path in PYPROJECTS:
        for line in tomllib.loads(path.read_text())["project"]["dependencies"]:
            if Requirement(line).name == "nodewarm":
                continue        # nodewarm-dev's dependency on the product beside it
            req = Requirement(line)
            assert any(s.operator in (">=", "==") for s in req.specifier), f"{line}: declare the version the code needs"
