"""Who may import whom inside nodewarm, read from the source with `ast` (no module is imported to check it).

The rules: nodewarm.api, the contract every part shares, imports nothing but itself and the standard library, and
importing it loads no third-party module; no import circles, between modules or between the parts of LAYERS; and
no part imports a layer above its own (LAYERS below is the one statement of that order).

Every import statement counts, wherever it stands: at the top, inside a function (a lazy import defers the cost,
not the dependency: the circle or the upward reach is still in the code) and under `if TYPE_CHECKING:`. Those
count the same as the others, on purpose: an annotation that names a higher layer's type is that layer's
knowledge in a lower one, and a TYPE_CHECKING import is the usual way to hide a circle from the interpreter while
keeping it in the design, which is what the issue asks to remove. Modules imported by a name held in a string
(the CLI's TOP_LEVEL, through importlib) are not seen; the CLI is the top layer, so that hides no upward import.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.paths import REPO

SRC = REPO / "src"
ROOT = "nodewarm"

# The layers, lowest first. A module imports its own layer and those below, never one above. The contract (api) is
# shared by every part, so it can lean on nothing; the base modules (the user's profile, sizing, the instance table,
# logging, what nodewarm knows of Karpenter) are what the parts are built from; the parts (the renderer, user data,
# the node agent) use those; the controller drives the parts; `nodewarm status` and the CLI are the front ends over
# all of it. An upward import makes a low part carry a high one's imports (the agent's start-up pays for them) and is
# how circles start. An entry is a module or a package (with everything below it); "nodewarm" alone is the package's
# own __init__ (its version). A new top-level module or package must be placed here: the test says so.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("nodewarm", "nodewarm.api"),
    ("nodewarm.sizing", "nodewarm.instancetypes", "nodewarm.logs", "nodewarm.profile", "nodewarm.kubeapply",
     "nodewarm.karpenter"),
    ("nodewarm.nodeclasses", "nodewarm.userdata", "nodewarm.bootstrap"),
    ("nodewarm.controller",),
    ("nodewarm.status", "nodewarm.cli", "nodewarm.render_cli", "nodewarm.livediff"),
)
API = "nodewarm.api"
STDLIB = frozenset(sys.stdlib_module_names)


@dataclass(frozen=True)
class Edge:
    importer: str
    target: str          # a nodewarm module, or a top-level name outside nodewarm
    where: str           # path:line, for messages

    def __str__(self) -> str:
        return f"{self.importer} -> {self.target} ({self.where})"


@dataclass
class Graph:
    modules: dict[str, Path]
    internal: list[Edge]     # between nodewarm modules
    external: list[Edge]     # to anything else (target: its top-level name)
    unresolved: list[Edge]   # to a nodewarm module that does not exist

    def adjacency(self) -> dict[str, dict[str, Edge]]:
        out: dict[str, dict[str, Edge]] = defaultdict(dict)
        for e in self.internal:
            out[e.importer].setdefault(e.target, e)
        return out


def find_modules(src: Path) -> dict[str, Path]:
    out = {}
    for path in sorted((src / ROOT).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module a dotted name lands in: the name itself, or the longest module above it (an attribute)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def build_graph(src: Path) -> Graph:
    modules = find_modules(src)
    g = Graph(modules, [], [], [])
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(src)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                wanted = [(a.name, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    up = package.split(".")
                    base = ".".join(up[: len(up) - node.level + 1])
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module
                # `from X import y`: y is the submodule X.y when there is one, else a name in X.
                wanted = [(f"{base}.{a.name}", base) for a in node.names]
            else:
                continue
            for full, base in wanted:
                top = full.split(".")[0]
                if top != ROOT:
                    g.external.append(Edge(name, top, where))
                    continue
                if full not in modules and base not in modules:
                    g.unresolved.append(Edge(name, base, where))
                target = full if full in modules else _resolve(base, modules)
                if target != name:       # a package's __init__ naming itself (`from . import NAME`) is no edge
                    g.internal.append(Edge(name, target, where))
    return g


# -- the rules, as functions of a graph (so the tests below can show each one catching a bad import) ------------


def api_violations(g: Graph) -> list[str]:
    inside = lambda m: m == API or m.startswith(API + ".")
    out = [f"{e}: outside nodewarm.api" for e in g.internal if inside(e.importer) and not inside(e.target)]
    out += [f"{e}: not the standard library" for e in g.external if inside(e.importer) and e.target not in STDLIB]
    return out


def _cycles(nodes, adj: dict[str, dict[str, Edge]]) -> list[list[str]]:
    """One shortest circle through each strongly connected component (Tarjan), as a path a, b, ..., a."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in adj.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1 or v in adj.get(v, {}):
                comps.append(comp)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(nodes):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    out = []
    for comp in comps:
        start = min(comp)
        prev: dict[str, str] = {}
        queue = deque([start])
        while queue:
            v = queue.popleft()
            for w in sorted(adj.get(v, {})):
                if w == start:
                    path = [start]
                    while v != start:
                        path.append(v)
                        v = prev[v]
                    out.append([start, *reversed(path[1:]), start] if len(path) > 1 else [start, start])
                    queue.clear()
                    break
                if w in comp and w not in prev:
                    prev[w] = v
                    queue.append(w)
    return sorted(out)


def module_cycles(g: Graph) -> list[str]:
    adj = g.adjacency()
    return [" -> ".join(c) + "\n    " + "\n    ".join(str(adj[a][b]) for a, b in zip(c, c[1:]))
            for c in _cycles(g.modules, adj)]


def unit_of(module: str, layers=LAYERS) -> str | None:
    """The LAYERS entry a module belongs to: itself, or the longest package entry above it."""
    entries = [u for layer in layers for u in layer]
    if module == ROOT:
        return ROOT if ROOT in entries else None
    above = [u for u in entries if u != ROOT and (module == u or module.startswith(u + "."))]
    return max(above, key=len, default=None)


def layer_of(unit: str, layers=LAYERS) -> int:
    return next(i for i, layer in enumerate(layers) if unit in layer)


def unit_cycles(g: Graph, layers=LAYERS) -> list[str]:
    adj: dict[str, dict[str, Edge]] = defaultdict(dict)
    for e in g.internal:
        a, b = unit_of(e.importer, layers), unit_of(e.target, layers)
        if a and b and a != b:
            adj[a].setdefault(b, e)
    return [" -> ".join(c) + "\n    " + "\n    ".join(str(adj[a][b]) for a, b in zip(c, c[1:]))
            for c in _cycles(set(adj) | {b for v in adj.values() for b in v}, adj)]


def upward_imports(g: Graph, layers=LAYERS) -> list[str]:
    out = []
    for e in g.internal:
        a, b = unit_of(e.importer, layers), unit_of(e.target, layers)
        if a and b and layer_of(b, layers) > layer_of(a, layers):
            out.append(f"{e}: layer {layer_of(a, layers)} ({a}) imports layer {layer_of(b, layers)} ({b})")
    return list(dict.fromkeys(out))     # one line per statement, however many names it imports


def unplaced(g: Graph, layers=LAYERS) -> list[str]:
    return sorted(m for m in g.modules if unit_of(m, layers) is None)


def stale_entries(g: Graph, layers=LAYERS) -> list[str]:
    return [u for layer in layers for u in layer if not any(unit_of(m, layers) == u for m in g.modules)]


def api_import_loads(src: Path, modules: list[str]) -> tuple[list[str], str]:
    """Import the given modules in a fresh interpreter that has the standard library and src/ only (-S: no
    site-packages, -E: no PYTHONPATH). Returns the modules that import loaded beyond the standard library and
    nodewarm.api, and python -X importtime's report (which says who imported them)."""
    code = (
        f"import sys; sys.path.insert(0, {str(src)!r}); before = set(sys.modules)\n"
        f"import {', '.join(modules)}\n"
        "loaded = sorted(set(sys.modules) - before)\n"
        "import json; print(json.dumps(loaded))\n"
    )
    run = subprocess.run([sys.executable, "-S", "-E", "-X", "importtime", "-c", code],
                         capture_output=True, text=True, timeout=60)
    report = "\n".join(line for line in run.stderr.splitlines() if line.startswith("import time:"))
    if run.returncode:
        return [f"importing {', '.join(modules)} with the standard library alone failed:\n"
                + "\n".join(line for line in run.stderr.splitlines() if not line.startswith("import time:"))], report
    foreign = [m for m in json.loads(run.stdout)
               if not (m.split(".")[0] in STDLIB or m == ROOT or m == API or m.startswith(API + "."))]
    return foreign, report


# -- nodewarm's own source ------------------------------------------------------------------------------------


def _none(found: list[str], what: str, more: str = "") -> None:
    if found:
        pytest.fail(f"{len(found)} {what}:\n" + "\n".join(found) + more, pytrace=False)


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph(SRC)


def test_every_nodewarm_import_names_a_module_that_exists(graph):
    _none(list(dict.fromkeys(map(str, graph.unresolved))), "import(s) of a nodewarm module that does not exist")


def test_the_contract_imports_only_itself_and_the_standard_library(graph):
    _none(api_violations(graph), "import(s) from nodewarm.api beyond itself and the standard library")


def test_importing_the_contract_loads_no_third_party_module():
    api = sorted(m for m in find_modules(SRC) if m == API or m.startswith(API + "."))
    foreign, report = api_import_loads(SRC, api)
    _none(foreign, "module(s) loaded by importing nodewarm.api", "\n\npython -X importtime:\n" + report)


def test_no_import_circle_between_modules(graph):
    _none(module_cycles(graph), "import circle(s) between modules")


def test_no_import_circle_between_the_parts(graph):
    _none(unit_cycles(graph), "import circle(s) between the parts of LAYERS")


def test_no_part_imports_a_higher_layer(graph):
    _none(upward_imports(graph), "upward import(s)")


def test_every_module_has_a_layer(graph):
    _none(unplaced(graph), "module(s) in no layer: place them in LAYERS")


def test_the_layer_table_names_only_what_exists(graph):
    _none(stale_entries(graph), "LAYERS entr(ies) naming what src/nodewarm no longer holds")


# -- the checks above can fail: each catches a deliberately bad import in a scratch tree ------------------------


def _scratch(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "src"
    for rel, text in {"nodewarm/__init__.py": "", "nodewarm/api/__init__.py": "", **files}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    return src


def test_check_catches_the_contract_reaching_out(tmp_path):
    src = _scratch(tmp_path, {
        "nodewarm/api/names.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..profile import P\n",
        "nodewarm/api/views.py": "def f():\n    import yaml\n",
        "nodewarm/profile.py": "P = 1\n",
    })
    assert api_violations(build_graph(src)) == [
        "nodewarm.api.names -> nodewarm.profile (nodewarm/api/names.py:3): outside nodewarm.api",
        "nodewarm.api.views -> yaml (nodewarm/api/views.py:2): not the standard library",
    ]


def test_check_catches_a_third_party_module_loaded_by_the_contract(tmp_path):
    src = _scratch(tmp_path, {"nodewarm/api/names.py": "import thirdparty\n", "thirdparty.py": "import json\n"})
    foreign, report = api_import_loads(src, ["nodewarm.api.names"])
    assert foreign == ["thirdparty"] and "thirdparty" in report
    src = _scratch(tmp_path / "b", {"nodewarm/api/names.py": "import yaml\n"})
    (foreign,), _ = api_import_loads(src, ["nodewarm.api.names"])
    assert "standard library alone failed" in foreign and "No module named 'yaml'" in foreign


def test_check_catches_a_circle_and_reports_its_path(tmp_path):
    src = _scratch(tmp_path, {
        "nodewarm/profile.py": "def spec():\n    from .nodeclasses import servingspec\n",
        "nodewarm/nodeclasses/__init__.py": "",
        "nodewarm/nodeclasses/servingspec.py": "from nodewarm.nodeclasses.vllm import X\n",
        "nodewarm/nodeclasses/vllm.py": "from nodewarm import profile\nX = 1\n",
    })
    g = build_graph(src)
    assert [c.splitlines()[0] for c in module_cycles(g)] == [
        "nodewarm.nodeclasses.servingspec -> nodewarm.nodeclasses.vllm -> nodewarm.profile"
        " -> nodewarm.nodeclasses.servingspec"]
    assert [c.splitlines()[0] for c in unit_cycles(g)] == [
        "nodewarm.nodeclasses -> nodewarm.profile -> nodewarm.nodeclasses"]


def test_check_catches_a_circle_between_parts_with_none_between_modules(tmp_path):
    src = _scratch(tmp_path, {
        "nodewarm/bootstrap/__init__.py": "", "nodewarm/bootstrap/a.py": "from nodewarm.userdata import b\n",
        "nodewarm/userdata/__init__.py": "", "nodewarm/userdata/b.py": "",
        "nodewarm/userdata/c.py": "from ..bootstrap import d\n", "nodewarm/bootstrap/d.py": "",
    })
    g = build_graph(src)
    assert module_cycles(g) == []
    assert [c.splitlines()[0] for c in unit_cycles(g)] == [
        "nodewarm.bootstrap -> nodewarm.userdata -> nodewarm.bootstrap"]


def test_check_catches_an_upward_import_and_an_unplaced_module(tmp_path):
    src = _scratch(tmp_path, {
        "nodewarm/nodeclasses/__init__.py": "",
        "nodewarm/nodeclasses/render.py": "def f():\n    from nodewarm.controller.manifests import m\n",
        "nodewarm/controller/__init__.py": "", "nodewarm/controller/manifests.py": "m = 1\n",
        "nodewarm/newthing.py": "",
    })
    g = build_graph(src)
    assert upward_imports(g) == [
        "nodewarm.nodeclasses.render -> nodewarm.controller.manifests (nodewarm/nodeclasses/render.py:2):"
        " layer 2 (nodewarm.nodeclasses) imports layer 3 (nodewarm.controller)"]
    assert unplaced(g) == ["nodewarm.newthing"]
    assert "nodewarm.status" in stale_entries(g)


def test_check_resolves_relative_imports_and_catches_a_missing_module(tmp_path):
    src = _scratch(tmp_path, {
        "nodewarm/bootstrap/__init__.py": "from . import agent\n",
        "nodewarm/bootstrap/agent.py": "from ..api import names\nfrom ..api.names import X\nfrom .. import logs\n",
        "nodewarm/bootstrap/weights/__init__.py": "from ...api import gone\nfrom ..agent import run\n",
        "nodewarm/api/names.py": "X = 1\n", "nodewarm/logs.py": "import nodewarm.api.missing\n",
    })
    g = build_graph(src)
    assert sorted((e.importer, e.target) for e in g.internal) == [
        ("nodewarm.bootstrap", "nodewarm.bootstrap.agent"),
        ("nodewarm.bootstrap.agent", "nodewarm.api.names"),
        ("nodewarm.bootstrap.agent", "nodewarm.api.names"),
        ("nodewarm.bootstrap.agent", "nodewarm.logs"),
        ("nodewarm.bootstrap.weights", "nodewarm.api"),
        ("nodewarm.bootstrap.weights", "nodewarm.bootstrap.agent"),
        ("nodewarm.logs", "nodewarm.api"),
    ]
    assert [e.target for e in g.unresolved] == ["nodewarm.api.missing"]
