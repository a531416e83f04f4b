#!/usr/bin/env bash
# Build what a real node of the test environment needs (testenv/realnode.py; docs in that module):
#  - kubelet v1.20.2 from the same Debian source tree as the API server (build-kube.sh with
#    NODEWARM_KUBE_EXTRA_BINS=kubelet: same fixes, GOPATH mode, CGO_ENABLED=0, so it reuses the API server's Go cache);
#  - `pause`, a static C binary (gcc -static) that realnode.py packs into the local sandbox image (no registry here);
#  - Debian's containerd (1.6.20), runc and containernetworking-plugins, when missing.
# Idempotent: what is cached in ~/.cache/nodewarm/k8s is kept.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${NODEWARM_KUBE_BIN:-$HOME/.cache/nodewarm/k8s}
log() { echo "[build-kubelet] $*" >&2; }
# shellcheck source-path=SCRIPTDIR source=debsource.sh
. "$HERE/debsource.sh"

# No systemd here (or a unit not enabled): the packaged containerd service is never what realnode.py runs.
debsource_need build-kubelet containerd runc containernetworking-plugins iptables gcc libc6-dev

NODEWARM_KUBE_EXTRA_BINS="kubelet ${NODEWARM_KUBE_EXTRA_BINS:-}" bash "$HERE/build-kube.sh"

if [[ ! -x $OUT/pause ]]; then
  log "building the static pause binary"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  cat >"$tmp/pause.c" <<'C'
/* The sandbox's init: sleep until SIGINT/SIGTERM, reap children (as Kubernetes' build/pause/linux/pause.c). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void die(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction a = {0}, r = {0};
  a.sa_handler = die; sigaction(SIGINT, &a, NULL); sigaction(SIGTERM, &a, NULL);
  r.sa_handler = reap; r.sa_flags = SA_NOCLDSTOP; sigaction(SIGCHLD, &r, NULL);
  for (;;) pause();
}
C
  gcc -static -Os -s -o "$tmp/pause" "$tmp/pause.c"
  mv "$tmp/pause" "$OUT/pause"
fi
log "done: $(ls "$OUT")"
