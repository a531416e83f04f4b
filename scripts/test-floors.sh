#!/usr/bin/env bash
# The suite once more at the floor versions: every dependency at the lowest version pyproject.toml allows
# (constraints/floors.txt), in its own venv (.venv-floors), so the declared floors are proven, not guessed.
# scripts/test.sh (the README's test command, what .ci/run runs) ends with it. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh               # Debian packages and the local kube-apiserver (cached after the first run)

log() { echo "[floors] $*" >&2; }
venv=.venv-floors
stamp=$venv/.nodewarm-floors
if [[ ! -f $stamp || pyproject.toml -nt $stamp || dev/pyproject.toml -nt $stamp || constraints/floors.txt -nt $stamp ]]; then
  log "building $venv at the floors of constraints/floors.txt"
  rm -rf "$venv"
  "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$venv/bin/python" -m pip install -q --no-compile "torch==2.13.0"      # --no-compile: as scripts/setup.sh
  "$venv/bin/python" -m pip install -q --no-compile -c constraints/floors.txt -e ".[torch,streamer]" -e ./dev
  touch "$stamp"
fi
# What pip resolved must be the floors themselves, not something newer that slipped in.
"$venv/bin/python" - <<'PY'
import sys
from importlib.metadata import version
from packaging.requirements import Requirement

wrong = []
for line in open("constraints/floors.txt"):
    line = line.split("#", 1)[0].strip()
    if line:
        req = Requirement(line)
        pinned = next(iter(req.specifier)).version
        if version(req.name) != pinned:
            wrong.append(f"{req.name} {version(req.name)} (floor {pinned})")
if wrong:
    sys.exit("[floors] not at the floor: " + ", ".join(wrong))
print("[floors] every dependency at its floor", file=sys.stderr)
PY
# Not the vllm tests: they boot vLLM from .venv-serving, whose packages are the same in both passes; the parts of
# them that run here (render, the agent's pull, the start script) are the rest of the suite's, run at the floors.
# Nor the realnode tests: their pods run the nodewarm image, whose dependencies are the image's, not these floors.
# Not the slow tests either: they are torch.compile runs (torch is the same 2.13.0 in both environments) and the
# probe demo, whose kube and S3 paths the other tests cover at the floors too; the suite runs them all.
source scripts/test-selection.sh
exec "$venv/bin/python" -m pytest "${LIGHT_WORKERS[@]}" --durations=30 -m "$LIGHT_TESTS" "$@"
