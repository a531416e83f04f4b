#!/usr/bin/env bash
# The clean-clone check (docs/testing.md, "The clean-clone check"): a clone of this checkout's HEAD, in a folder of
# its own with nothing beside it, runs the README's first command (`bash scripts/setup.sh`, then `nodewarm demo`)
# to the demo's first answer. It runs in a private mount namespace in which the folder around this checkout is an
# empty tmpfs, so a script, test environment or demo that still reads a file beside the checkout (upstream CRDs,
# reference notes, another checkout's venv) fails here instead of working by accident. What it may reuse are the
# machine's caches, as a new user's second clone would: the built API-server binaries (~/.cache/nodewarm/k8s), the
# helm/kubectl layer and pip's cache. scripts/test.sh runs it between the suite and the floors pass.
#   NODEWARM_STANDALONE_DEMO="ARGS"  what the demo runs (default: --nodes 1 --no-baseline --nodes-as played: real
#                                    vLLM, node A's cold compile, then one warmed node's first completion. The nodes
#                                    are played: this check is about the files a clone reads, and the demo on real
#                                    nodes, which pushes a 4 GB image and boots kubelets, already runs in the suite,
#                                    tests/dev/test_demo.py; here it cost 7 more minutes of CI, 2026-12-06)
#   NODEWARM_STANDALONE_KEEP=1       keep the copy and its logs afterwards
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd -P)

log() { echo "[standalone] $*" >&2; }

if [[ ${1:-} != --inside ]]; then
  [[ -z $(git status --porcelain --untracked-files=no) ]] ||
    log "note: uncommitted changes are not in the copy (it is a clone of HEAD, as CI's and a new user's is)"
  # The copy goes where nothing of this checkout's folder is: that whole folder is hidden while it runs (a CI
  # clone finds the upstream CRDs and notes beside it).
  parent=$(dirname "$repo")
  [[ $parent != / ]] || { log "the checkout's folder is /, which cannot be hidden: clone it into a folder"; exit 2; }
  base=""
  for tmp in ${TMPDIR:-} /tmp /var/tmp "$HOME"; do
    [[ -n $tmp && -d $tmp ]] || continue
    tmp=$(cd "$tmp" && pwd -P)
    [[ $tmp == "$parent" || $tmp == "$parent"/* ]] && continue
    base=$(mktemp -d "$tmp/nodewarm-standalone.XXXXXX") && break
  done
  [[ -n $base ]] || { log "no temporary folder outside $parent (set TMPDIR to one)"; exit 2; }
  copy=$base/nodewarm
  git clone -q --no-hardlinks "$repo" "$copy"
  git -C "$copy" remote remove origin          # the copy knows nothing of where it came from
  # Root can make a mount namespace as it is; anyone else gets one inside a user namespace mapped to root.
  ns=(unshare --mount --propagation private)
  [[ $(id -u) -eq 0 ]] || ns=(unshare --user --map-root-user --mount --propagation private)
  start=$(date +%s)
  rc=0
  env -u NODEWARM_CRDS_DIR -u NODEWARM_SERVING_VENV -u VIRTUAL_ENV -u PYTHONPATH \
    "${ns[@]}" bash "$copy/scripts/check-standalone.sh" --inside "$copy" "$parent" || rc=$?
  log "$( ((rc == 0)) && echo passed || echo "FAILED (exit $rc)") in $(( $(date +%s) - start )) s; copy: $copy"
  if [[ ${NODEWARM_STANDALONE_KEEP:-} != 1 && $rc -eq 0 ]]; then
    rm -rf "$base"
  fi
  exit "$rc"
fi

# --- inside the private mount namespace, from the copy's own script ---------------------------------------------
copy=$2 hidden=$3
mount -t tmpfs -o size=1m,mode=0555 nodewarm-standalone-hidden "$hidden"
log "hidden: $hidden (an empty folder from here on)"
cd "$copy"
logs=$copy/out/standalone
mkdir -p "$logs"

t0=$(date +%s)
if ! bash scripts/setup.sh >"$logs/setup.log" 2>&1; then
  tail -n 40 "$logs/setup.log" >&2
  log "scripts/setup.sh failed in the copy (log: $logs/setup.log)"
  exit 1
fi
t1=$(date +%s)
log "setup.sh in the copy: $((t1 - t0)) s"

# shellcheck disable=SC2086  # the demo's arguments are words on purpose
if ! .venv/bin/nodewarm demo ${NODEWARM_STANDALONE_DEMO:---nodes 1 --no-baseline --nodes-as played} --out "$logs/demo" \
    >"$logs/demo.txt" 2>&1; then
  tail -n 60 "$logs/demo.txt" >&2
  log "nodewarm demo failed in the copy (output: $logs/demo.txt, logs: $logs/demo/demo-log.jsonl)"
  exit 1
fi
t2=$(date +%s)
# The demo's own words that a completion was answered; an exit code alone could hide a demo that served nothing.
if ! grep -q "first completion" "$logs/demo.txt" || ! grep -q "^Ordering: OK" "$logs/demo.txt"; then
  tail -n 60 "$logs/demo.txt" >&2
  log "the demo exited 0 without a first completion and an ordering verdict"
  exit 1
fi
grep -E "first completion|^Ordering" "$logs/demo.txt" | head -n 8 >&2
log "nodewarm demo in the copy: $((t2 - t1)) s"
