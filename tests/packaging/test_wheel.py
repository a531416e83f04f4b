"""The wheels hold what the layout says, built for real (pip wheel with this environment's setuptools, ~2 s each).

nodewarm's wheel is src/nodewarm, all of it and nothing else: every module and data file in the tree (found from
the tree, so a new folder is covered without editing this test), no test environment, demo, tests or benchmarks,
and no top-level name but `nodewarm`. nodewarm-dev's wheel (dev/) is nodewarm_dev alone and adds `nodewarm demo`
through the nodewarm.commands entry point. And nothing in the checkout is importable under a bare name:
`nodewarm.X` is the only way in.
"""

from __future__ import annotations

import ast
import configparser
import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from support.paths import REPO, package_files

SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


def _build(project: Path, out: Path) -> zipfile.ZipFile:
    """The project's wheel, built from a copy of its pyproject.toml, readme and src/: setuptools writes build/ and
    an egg-info into the folder it builds, and a build/lib left from an earlier build would ship modules that no
    longer exist; a copy builds exactly what the tree holds now and leaves the checkout alone."""
    copy = out / "project"
    copy.mkdir(parents=True)
    shutil.copy2(project / "pyproject.toml", copy)
    readme = tomllib.loads((project / "pyproject.toml").read_text())["project"].get("readme")
    if readme:
        shutil.copy2(project / readme, copy)
    shutil.copytree(project / "src", copy / "src", ignore=SKIP)
    return _build_copy(copy, out / "wheel")


def _build_copy(copy: Path, out: Path) -> zipfile.ZipFile:
    run = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(out), str(copy)],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def _payload(wheel: zipfile.ZipFile) -> set[str]:
    return {n for n in wheel.namelist() if not n.split("/")[0].endswith((".dist-info", ".data"))}


def _entry_points(wheel: zipfile.ZipFile) -> dict[str, dict[str, str]]:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")] or [None]
    if name is None:
        return {}
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str
    parser.read_string(wheel.read(name).decode())
    return {group: dict(parser[group]) for group in parser.sections()}


def _defines(wheel: zipfile.ZipFile, module: str, function: str) -> bool:
    tree = ast.parse(wheel.read(module.replace(".", "/") + ".py"))
    return any(isinstance(n, ast.FunctionDef) and n.name == function for n in tree.body)


@pytest.fixture(scope="module")
def product(tmp_path_factory) -> zipfile.ZipFile:
    return _build(REPO, tmp_path_factory.mktemp("nodewarm"))


@pytest.fixture(scope="module")
def dev(tmp_path_factory) -> zipfile.ZipFile:
    return _build(REPO / "dev", tmp_path_factory.mktemp("nodewarm-dev"))


def test_every_module_and_data_file_under_src_ships(product):
    missing = package_files(REPO / "src" / "nodewarm") - _payload(product)
    assert not missing, f"in src/nodewarm, not in the wheel: {sorted(missing)}"


def test_the_wheel_holds_nodewarm_and_nothing_else(product):
    extra = _payload(product) - package_files(REPO / "src" / "nodewarm")
    assert not extra, f"in the wheel, not in src/nodewarm: {sorted(extra)}"
    tops = {n.split("/")[0] for n in _payload(product)}
    assert tops == {"nodewarm"}, f"top-level names in the wheel: {sorted(tops)}"
    banned = {"nodewarm_dev", "testenv", "demo", "tests", "bench", "conftest.py"}
    shipped = [n for n in product.namelist() if banned & set(n.split("/"))]
    assert not shipped, f"the test environment, demo, tests or benchmarks in the product wheel: {shipped}"


def test_every_folder_of_modules_is_a_package():
    """A folder without __init__.py still ships (pyproject's packages.find finds namespace packages too), but it
    imports as a namespace package: no __file__, open to modules from any other distribution. nodewarm's folders
    are all regular packages."""
    folders = {p.parent for p in (REPO / "src" / "nodewarm").rglob("*.py") if "__pycache__" not in p.parts}
    bare = [f.relative_to(REPO).as_posix() for f in sorted(folders) if not (f / "__init__.py").is_file()]
    assert not bare, f"folders of modules without an __init__.py: {bare}"


def test_the_declared_package_data_exists_and_ships(product):
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package, patterns in declared.items():
        folder = REPO / "src" / package.replace(".", "/")
        for pattern in patterns:
            files = {p.relative_to(REPO / "src").as_posix() for p in folder.glob(pattern)}
            assert files, f"{package}: {pattern} matches nothing (a pattern left behind by a move?)"
            assert files <= _payload(product), f"{package}: {sorted(files - _payload(product))} not in the wheel"


def test_the_console_script_is_declared(product):
    eps = _entry_points(product)
    assert eps.get("console_scripts") == {"nodewarm": "nodewarm.cli:main"}, eps
    assert _defines(product, "nodewarm.cli", "main")
    # The product's own commands are TOP_LEVEL in nodewarm/cli.py; the entry-point group is for other distributions.
    assert "nodewarm.commands" not in eps, eps


def test_a_new_folder_ships_without_editing_anything(tmp_path):
    """The issue's case: a wheel built with a new controller/lifecycle/ folder silently left it out."""
    copy = tmp_path / "project"
    shutil.copytree(REPO / "src", copy / "src", ignore=SKIP)
    shutil.copy2(REPO / "pyproject.toml", copy)
    shutil.copy2(REPO / "README.md", copy)
    lifecycle = copy / "src" / "nodewarm" / "controller" / "lifecycle"
    new = {"__init__.py", "launch.py", "deep/__init__.py", "deep/liveness.py", "bare/registration.py"}
    for name in new:
        (lifecycle / name).parent.mkdir(parents=True, exist_ok=True)
        (lifecycle / name).write_text("")
    wheel = _build_copy(copy, tmp_path / "wheel")
    missing = {f"nodewarm/controller/lifecycle/{n}" for n in new} - _payload(wheel)
    assert not missing, f"left out of the wheel: {sorted(missing)}"


def test_the_dev_wheel_holds_nodewarm_dev_only(dev):
    tree = package_files(REPO / "dev" / "src" / "nodewarm_dev")
    assert _payload(dev) == tree, f"missing {sorted(tree - _payload(dev))}, extra {sorted(_payload(dev) - tree)}"
    assert {n.split("/")[0] for n in _payload(dev)} == {"nodewarm_dev"}
    assert {"nodewarm_dev/testenv/build-kube.sh", "nodewarm_dev/demo/cli.py"} <= _payload(dev)


def test_the_dev_wheel_adds_the_demo_command(dev):
    eps = _entry_points(dev)
    assert eps.get("nodewarm.commands") == {"demo": "nodewarm_dev.demo.cli"}, eps
    assert _defines(dev, "nodewarm_dev.demo.cli", "register")     # what nodewarm/cli.py calls on a plugin


def _in_checkout(path: str) -> bool:
    """Under the checkout, not in one of its virtual environments (third-party packages live there)."""
    parts = Path(path).parts
    top = REPO.parts
    return parts[: len(top)] == top and len(parts) > len(top) and not parts[len(top)].startswith(".venv")


def test_nodewarm_X_is_the_only_way_in():
    """No folder at the checkout's top is a package, and from the checkout's top (where `python -c` and
    `python -m` put it first on sys.path) no part of nodewarm or nodewarm-dev resolves under a bare name: a
    folder of the same name there would, even without an __init__.py (a namespace package)."""
    packages = [p.name for p in REPO.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    assert not packages, f"packages at the checkout's top: {packages}"
    assert not [p.name for p in REPO.glob("*.py")], "modules at the checkout's top"
    # The editable installs put src/ and dev/src/ on sys.path: what else they hold is importable by a bare name.
    for src, package in ((REPO / "src", "nodewarm"), (REPO / "dev" / "src", "nodewarm_dev")):
        beside = [p.name for p in src.iterdir() if not p.name.endswith(".egg-info")]
        assert beside == [package], f"{src.relative_to(REPO)} holds {beside}, not {package} alone"
    names = sorted({p.stem for pkg in (REPO / "src" / "nodewarm", REPO / "dev" / "src" / "nodewarm_dev")
                    for p in pkg.iterdir() if p.name != "__init__.py" and "__pycache__" not in p.name})
    assert "bootstrap" in names and "controller" in names and "testenv" in names
    code = (
        "import importlib.util, json, sys\n"
        f"names = {names!r}\n"
        "found = {}\n"
        "for n in names:\n"
        "    spec = importlib.util.find_spec(n)\n"
        "    if spec:\n"
        "        found[n] = [spec.origin, *(spec.submodule_search_locations or [])]\n"
        "import nodewarm.bootstrap, nodewarm_dev.testenv\n"
        "print(json.dumps([found, nodewarm.bootstrap.__file__, nodewarm_dev.testenv.__file__]))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    found, bootstrap, testenv = json.loads(run.stdout)
    inside = {n: where for n, where in found.items() if any(w and _in_checkout(w) for w in where)}
    assert not inside, f"bare names that resolve inside the checkout: {inside}"
    assert bootstrap == str(REPO / "src/nodewarm/bootstrap/__init__.py")
    assert testenv == str(REPO / "dev/src/nodewarm_dev/testenv/__init__.py")
