#!/usr/bin/env bash
# The GPU path of engine snapshots (docs/snapshots-gpu.md), checked on a GPU machine if one is ever lent.
# NOT RUN: no GPU machine was lent to the work that wrote this script; nothing it reports was seen yet.
#
# What it does, each step only where its tools exist (a missing one is reported as missing, never a failure):
#   1. facts: nvidia-smi (GPU, driver, persistence mode, MIG), `cuda-checkpoint --help` (and whether it has
#      --action: driver r555+), `criu --version` and `criu check`, and where CRIU's CUDA plugin (cuda_plugin.so)
#      is, if anywhere (CRIU loads plugins from --libdir, else $CRIU_LIBS_DIR, else its built-in default:
#      /usr/lib/criu for the CRIU setup builds; `make install-cuda_plugin` puts it in /usr/local/lib/criu);
#   2. if a vLLM with CUDA is installed (VLLM_PYTHON, else .venv-serving/bin/python3, else python3): vLLM on the
#      tiny Llama (dev/src/nodewarm_dev/testenv/tinymodel.py; nothing downloaded), on the host, no Kubernetes:
#        boot-fill  a first boot (fills the compile caches under $WORK/cache), then stopped
#        boot       a warm-cache boot: start -> /health -> first completion (and vLLM's engine init time)
#        checkpoint cuda-checkpoint --toggle of each of its CUDA processes (device memory into host memory),
#                   then `criu dump` of the process tree (CUDA_MODE=toggle, the default; CRIU runs with an empty
#                   --libdir so no plugin acts twice), or `criu dump` alone with the CUDA plugin doing the CUDA
#                   part (CUDA_MODE=plugin, where the plugin is found): seconds and image bytes
#        restore    `criu restore --restore-detached`, then --toggle of the same pids (toggle mode): restore
#                   start -> /health -> first completion; the ratio restore/boot
#      Where persistence mode is off, a helper process holds cuInit for the restore (a CUDA restore "requires
#      persistence mode to be enabled or cuInit to have been called"); the GPU's settings are never changed.
#      uvloop's io_uring, which CRIU cannot dump, is refused in a pod by nodewarm's seccomp profile; here the
#      engine gets UV_USE_IO_URING=0 and the script counts io_uring fds in the tree before the dump.
#      --gpu-memory-utilization defaults to 0.05 (GPU_MEM_UTIL): the images hold vLLM's whole share of the GPU
#      (docs/snapshots-gpu.md, "The size"), which at vLLM's 0.9 would not fit this disk.
#   3. everything into $OUT/snapshot-device.json (and the printed log into $OUT/snapshot-device.txt).
#
# Run from the repository root, as root (CRIU):  OUT=/tmp/out bash bench/snapshot_device.sh
# Settings: VLLM_PYTHON, NODEWARM_CRIU (criu binary), CUDA_MODE (toggle|plugin), GPU_MEM_UTIL, WORK (default a
# temporary folder; ~10 GB for the images on an H100 at 0.05), BOOT_TIMEOUT (s, default 300).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
exec > >(tee "$OUT/snapshot-device.txt") 2>&1
OWN_WORK=""
[ -n "${WORK:-}" ] || { WORK=$(mktemp -d /tmp/nw-snapdev-XXXXXX); OWN_WORK=1; }
mkdir -p "$WORK"
FACTS="$WORK/facts.tsv"
: >"$FACTS"
PORT=${PORT:-8123}
BOOT_TIMEOUT=${BOOT_TIMEOUT:-300}
GPU_MEM_UTIL=${GPU_MEM_UTIL:-0.05}
CUDA_MODE=${CUDA_MODE:-toggle}
ENGINE_PID="" KEEPER_PID=""

fact() { printf '%s\t%s\n' "$1" "${2//$'\n'/ }" >>"$FACTS"; echo "$1: $2"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

cleanup() {
  if [ -n "$ENGINE_PID" ] && kill -0 "$ENGINE_PID" 2>/dev/null; then
    kill -TERM -- "-$ENGINE_PID" 2>/dev/null; sleep 3; kill -KILL -- "-$ENGINE_PID" 2>/dev/null
  fi
  [ -n "$KEEPER_PID" ] && kill "$KEEPER_PID" 2>/dev/null
  rm -rf "$WORK/images" "$WORK/images-work"
  if [ -n "$OWN_WORK" ]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT

write_json() {
  local py
  py=$(command -v python3 || true)
  if [ -z "$py" ]; then echo "no python3: the facts stay in $FACTS"; cp "$FACTS" "$OUT/snapshot-device.tsv"; return; fi
  "$py" - "$FACTS" "$OUT/snapshot-device.json" <<'EOF'
import json, sys
doc = {}
for line in open(sys.argv[1]):
    k, _, v = line.rstrip("\n").partition("\t")
    for kind in (int, float):
        try:
            doc[k] = kind(v)
            break
        except ValueError:
            doc[k] = v
json.dump(doc, open(sys.argv[2], "w"), indent=1, sort_keys=True)
print("report:", sys.argv[2])
EOF
}

# --- 1. facts ----------------------------------------------------------------------------------------------------
fact machine.nproc "$(nproc)"
fact machine.loadavg "$(cut -d' ' -f1-3 /proc/loadavg)"
fact machine.cpuModel "$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
fact machine.kernel "$(uname -r)"
fact machine.uid "$(id -u)"

if command -v nvidia-smi >/dev/null; then
  fact nvidia.gpus "$(nvidia-smi --query-gpu=index,name,memory.total,driver_version,persistence_mode,mig.mode.current \
    --format=csv,noheader 2>&1 | paste -sd';')"
  fact nvidia.driver "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
  fact nvidia.persistence "$(nvidia-smi --query-gpu=persistence_mode --format=csv,noheader 2>/dev/null | head -1)"
else
  fact nvidia.gpus missing
fi
if [ -d /proc/driver/nvidia/gpus ]; then fact nvidia.procDriverGpus present; else fact nvidia.procDriverGpus missing; fi

CC=${CUDA_CHECKPOINT:-$(command -v cuda-checkpoint || true)}
if [ -n "$CC" ] && [ -x "$CC" ]; then
  help=$("$CC" --help 2>&1 | head -40)
  fact cudaCheckpoint.path "$CC"
  fact cudaCheckpoint.help "$help"
  if grep -q -- '--action' <<<"$help"; then fact cudaCheckpoint.hasAction yes; else fact cudaCheckpoint.hasAction no; fi
else
  CC="" ; fact cudaCheckpoint.path missing
fi

CRIU=${NODEWARM_CRIU:-}
for c in "$HOME/.cache/nodewarm/criu/criu" "$(command -v criu || true)" /usr/local/sbin/criu; do
  [ -z "$CRIU" ] && [ -n "$c" ] && [ -x "$c" ] && CRIU=$c
done
if [ -n "$CRIU" ]; then
  fact criu.path "$CRIU"
  fact criu.version "$("$CRIU" --version 2>&1 | head -2 | paste -sd' ')"
  check=$("$CRIU" check 2>&1 | tail -5); fact criu.checkRc "$("$CRIU" check >/dev/null 2>&1; echo $?)"
  fact criu.check "$check"
  libdir_builtin=$(strings "$CRIU" 2>/dev/null | grep -E '^/usr(/local)?/lib(64)?/criu/?$' | head -1)
  fact criu.builtinLibdir "${libdir_builtin:-unknown}"
else
  fact criu.path missing
fi
PLUGIN=""
for d in "${CRIU_LIBS_DIR:-}" /usr/lib/criu /usr/local/lib/criu /usr/lib64/criu "$(dirname "${CRIU:-/x}")"; do
  [ -n "$d" ] && [ -f "$d/cuda_plugin.so" ] && { PLUGIN="$d/cuda_plugin.so"; break; }
done
fact criu.cudaPlugin "${PLUGIN:-missing}"

# --- 2. boot vs restore ------------------------------------------------------------------------------------------
PY=${VLLM_PYTHON:-}
for p in .venv-serving/bin/python3 "$(command -v python3 || true)"; do
  [ -z "$PY" ] && [ -n "$p" ] && [ -x "$p" ] && PY=$p
done
vllm_ok="no python3"
[ -n "$PY" ] && vllm_ok=$("$PY" -c 'import torch, vllm; assert torch.cuda.is_available(), "no CUDA in torch"
print(vllm.__version__)' 2>&1 | tail -1)
missing=""
if [ -z "$PY" ] || ! "$PY" -c 'import torch, vllm; assert torch.cuda.is_available()' 2>/dev/null; then
  fact vllm "missing: no vLLM with CUDA at ${PY:-python3} ($vllm_ok)"
  missing+=" vllm-cuda"
fi
[ -n "$CRIU" ] || missing+=" criu"
[ -d /proc/driver/nvidia/gpus ] || missing+=" nvidia-driver"
if [ "$CUDA_MODE" = plugin ]; then [ -n "$PLUGIN" ] || missing+=" criu-cuda-plugin"
else [ -n "$CC" ] || missing+=" cuda-checkpoint"; fi
[ "$(id -u)" = 0 ] || missing+=" root"
if [ -n "$missing" ]; then
  fact bootVsRestore "skipped: missing$missing"
  write_json; exit 0
fi
fact vllm "$vllm_ok ($PY)"
fact mode "$CUDA_MODE"

MODEL="$WORK/model"
if ! "$PY" dev/src/nodewarm_dev/testenv/tinymodel.py "$MODEL" >"$WORK/tinymodel.log" 2>&1; then
  fact bootVsRestore "skipped: the tiny model could not be made: $(tail -3 "$WORK/tinymodel.log")"
  write_json; exit 0
fi
export VLLM_CACHE_ROOT="$WORK/cache/vllm" TORCHINDUCTOR_CACHE_DIR="$WORK/cache/inductor" \
  TRITON_CACHE_DIR="$WORK/cache/triton" XDG_CACHE_HOME="$WORK/cache/xdg" \
  VLLM_HOST_IP=127.0.0.1 GLOO_SOCKET_IFNAME=lo UV_USE_IO_URING=0
BASE="http://127.0.0.1:$PORT"

start_engine() {   # $1: log file. The engine in a session of its own (its pid is its process group's).
  setsid "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name tiny \
    --max-model-len 512 --port "$PORT" --gpu-memory-utilization "$GPU_MEM_UTIL" </dev/null >"$1" 2>&1 &
  ENGINE_PID=$!
}
wait_health() {    # until /health answers (0), the engine dies or the timeout passes (1)
  local deadline=$((SECONDS + BOOT_TIMEOUT))
  while ((SECONDS < deadline)); do
    curl -sf -m 2 "$BASE/health" >/dev/null && return 0
    kill -0 "$ENGINE_PID" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
complete() {
  curl -sf -m 60 "$BASE/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "tiny", "prompt": "The node is", "max_tokens": 12, "temperature": 0}'
}
stop_engine() {
  kill -TERM -- "-$ENGINE_PID" 2>/dev/null
  for _ in $(seq 60); do kill -0 "$ENGINE_PID" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- "-$ENGINE_PID" 2>/dev/null; ENGINE_PID=""
}
session_pids() { ps -o pid= -s "$1" | tr -d ' '; }
cuda_pids() {      # the session's processes holding a CUDA context
  local all
  all=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ')
  for p in $(session_pids "$1"); do grep -qx "$p" <<<"$all" && echo "$p"; done
}
init_s() { grep -oE 'init engine \(profile, create kv cache, warmup model\) took [0-9.]+' "$1" | tail -1 | grep -oE '[0-9.]+$'; }

boot() {           # $1: label
  local t0 log="$WORK/$1.log"
  t0=$(now); start_engine "$log"
  if ! wait_health; then fact "$1" "failed: $(tail -5 "$log")"; return 1; fi
  fact "$1.startToHealthSeconds" "$(since "$t0")"
  ANSWER=$(complete) || { fact "$1" "failed: no completion"; return 1; }
  fact "$1.startToFirstCompletionSeconds" "$(since "$t0")"
  fact "$1.engineInitSeconds" "$(init_s "$log")"
}

boot boot-fill || { write_json; exit 0; }
stop_engine
boot boot || { write_json; exit 0; }
fact boot.answer "$ANSWER"
fact boot.ioUringFds "$(for p in $(session_pids "$ENGINE_PID"); do ls -l "/proc/$p/fd" 2>/dev/null; done | grep -c io_uring)"

root=$ENGINE_PID
pids=$(cuda_pids "$root" | paste -sd' ')
fact checkpoint.cudaPids "${pids:-none}"
mkdir -p "$WORK/images" "$WORK/images-work" "$WORK/empty-libdir"
libdir=()
[ "$CUDA_MODE" = toggle ] && libdir=(--libdir "$WORK/empty-libdir")
CRIU_OPTS=(--tcp-established --file-locks --link-remap --ext-unix-sk -v4)
t0=$(now)
if [ "$CUDA_MODE" = toggle ]; then
  for p in $pids; do "$CC" --toggle --pid "$p" || fact checkpoint.toggleFailed "$p"; done
  fact checkpoint.toggleSeconds "$(since "$t0")"
fi
if "$CRIU" dump -t "$root" -D "$WORK/images" -W "$WORK/images-work" -o dump.log "${libdir[@]}" "${CRIU_OPTS[@]}"; then
  fact checkpoint.seconds "$(since "$t0")"
  fact checkpoint.imageBytes "$(du -sb "$WORK/images" | cut -f1)"
else
  fact checkpoint "failed: $(tail -5 "$WORK/images-work/dump.log" 2>/dev/null)"
  for p in $pids; do "$CC" --toggle --pid "$p" 2>/dev/null; done
  write_json; exit 0
fi
ENGINE_PID=""      # the dump ended the tree

if [ "$(nvidia-smi --query-gpu=persistence_mode --format=csv,noheader | head -1)" != Enabled ]; then
  "$PY" -c 'import ctypes, time; ctypes.CDLL("libcuda.so.1").cuInit(0); time.sleep(3600)' &
  KEEPER_PID=$!; sleep 2
  fact restore.cuInitKeeper yes
fi
t0=$(now)
if ! "$CRIU" restore -D "$WORK/images" -W "$WORK/images-work" -o restore.log --restore-detached \
    --pidfile "$WORK/restored.pid" "${libdir[@]}" "${CRIU_OPTS[@]}"; then
  fact restore "failed: $(tail -5 "$WORK/images-work/restore.log" 2>/dev/null)"
  write_json; exit 0
fi
ENGINE_PID=$(cat "$WORK/restored.pid")
fact restore.criuSeconds "$(since "$t0")"
if [ "$CUDA_MODE" = toggle ]; then
  for p in $pids; do "$CC" --toggle --pid "$p" || fact restore.toggleFailed "$p"; done
  fact restore.toggledSeconds "$(since "$t0")"
fi
if wait_health; then
  fact restore.startToHealthSeconds "$(since "$t0")"
  if RESTORED=$(complete); then
    fact restore.startToFirstCompletionSeconds "$(since "$t0")"
    fact restore.sameAnswer "$([ "$RESTORED" = "$ANSWER" ] && echo yes || echo no)"
    b=$(awk -F'\t' '$1 == "boot.startToFirstCompletionSeconds" { print $2 }' "$FACTS")
    r=$(awk -F'\t' '$1 == "restore.startToFirstCompletionSeconds" { print $2 }' "$FACTS")
    fact ratio.restoreOverBootToFirstCompletion "$(awk -v r="$r" -v b="$b" 'BEGIN { printf "%.3f", r / b }')"
  else
    fact restore "failed: /health answered, the completion did not"
  fi
else
  fact restore "failed: not serving after the restore: $(tail -3 "$WORK/images-work/restore.log" 2>/dev/null)"
fi
fact machine.loadavgEnd "$(cut -d' ' -f1-3 /proc/loadavg)"
write_json
