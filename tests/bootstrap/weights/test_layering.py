"""The verified pull knows nothing of peers: no module of weights/ imports peers/ (peers import weights, never back).

The pull is handed its other source of parts and its holdings sink (weights/sharing.py); peers/ implements them.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys

import nodewarm.bootstrap.weights as weights


def test_no_module_of_weights_imports_peers():
    modules = sorted(f"{weights.__name__}.{m.name}" for m in pkgutil.iter_modules(weights.__path__))
    assert f"{weights.__name__}.s3pull" in modules and f"{weights.__name__}.pipeline" in modules
    # A fresh interpreter: this one may have imported peers for other tests already.
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}:\n"
            "    importlib.import_module(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('nodewarm.bootstrap.peers'))))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_no_module_of_weights_names_peers_in_an_import_not_even_for_type_checking():
    import ast
    from pathlib import Path

    found = []
    for path in sorted(Path(weights.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 2:  # relative to bootstrap/, weights' parent
                names = [f"nodewarm.bootstrap.{node.module}"] if node.module else \
                    [f"nodewarm.bootstrap.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            found += [f"{path.name}:{node.lineno} {n}" for n in names
                      if n == "nodewarm.bootstrap.peers" or n.startswith("nodewarm.bootstrap.peers.")]
    assert found == []
