#!/usr/bin/env bash
# Set up everything nodewarm's tests, benchmarks and demo need on a fresh Debian 12 machine.
# Idempotent: each step is skipped when its result is already there.
#   - Debian packages (Go + etcd to build/run the API server; fs tools, shellcheck, systemd, binutils for tests)
#   - kube-apiserver + kube-scheduler v1.20.2 built from Debian's source (testenv/build-kube.sh, ~10 min once)
#   - a virtualenv in .venv with nodewarm and its extras (torch==2.13.0 CPU, the Run:ai streamer, test servers)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[setup] $*" >&2; }
SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo

APT_PKGS=(golang-go etcd-server rsync golang-github-modern-go-reflect2-dev openssl make curl
          e2fsprogs xfsprogs util-linux shellcheck systemd binutils)
missing=()
for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

bash testenv/build-kube.sh

PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  log "creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.nodewarm-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
  log "installing nodewarm and its extras into .venv (torch is pinned to the 2.13.0 CPU build)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  # torch first and pinned: anything that pulls an unpinned torch must find this one already there.
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[torch,streamer,demo,test]"
  touch "$stamp"
fi
log "ready: .venv/bin/nodewarm --help"
