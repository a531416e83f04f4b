#!/usr/bin/env bash
# Build kube-apiserver, kube-scheduler and kube-controller-manager v1.20.2 from Debian bookworm's `kubernetes` source
# package, offline except for the Debian archive. No registry ships these binaries, so this is the
# only way to get a real API server on a machine without Docker or internet.
# Idempotent: exits at once when the binaries are already cached.
# Recipe and the two required fixes: docs/testing.md, "The local API server".
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=debsource.sh
. "$HERE/debsource.sh"

OUT=${NODEWARM_KUBE_BIN:-$HOME/.cache/nodewarm/k8s}
WORK=${NODEWARM_KUBE_WORK:-$HOME/.cache/nodewarm/k8s-build}
BINS=(kube-apiserver kube-scheduler kube-controller-manager)
# Opt-in: more binaries of the same tree, built the same way (build-kubelet.sh sets NODEWARM_KUBE_EXTRA_BINS=kubelet).
read -r -a EXTRA <<<"${NODEWARM_KUBE_EXTRA_BINS:-}"
BINS+=("${EXTRA[@]}")

have_all=1
for b in "${BINS[@]}"; do [[ -x $OUT/$b ]] || have_all=0; done
if ((have_all)); then echo "kube binaries already built in $OUT"; exit 0; fi

log() { echo "[build-kube] $*" >&2; }
SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo

need=()
for p in golang-go etcd-server rsync golang-github-modern-go-reflect2-dev openssl make; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  log "installing Debian packages: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

mkdir -p "$WORK" "$OUT"
cd "$WORK"
if ! ls kubernetes_*.orig.tar.gz >/dev/null 2>&1; then
  # A private source list so the system's apt configuration is never touched (debsource.sh).
  log "fetching the kubernetes source package"
  debsource_fetch kubernetes bookworm "$WORK" >/dev/null
fi

GOPATH=$WORK/gopath
TREE=$GOPATH/src/k8s.io/kubernetes
if [[ ! -d $WORK/src/cmd/kube-apiserver ]]; then
  log "unpacking"
  rm -rf "$WORK/src" && mkdir -p "$WORK/src"
  tar -xzf kubernetes_*.orig.tar.gz -C "$WORK/src" --strip-components=1
fi
mkdir -p "$(dirname "$TREE")"
ln -sfn "$WORK/src" "$TREE"

# Fix 1: vendored reflect2 v1.0.1 segfaults under Go >= 1.18 on the first custom resource create.
rm -f "$TREE"/vendor/github.com/modern-go/reflect2/*.go
cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.go "$TREE/vendor/github.com/modern-go/reflect2/"

export GOPATH GO111MODULE=off GOPROXY=off CGO_ENABLED=0
export GOCACHE=${GOCACHE:-$HOME/.cache/nodewarm/go-build}
export KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean

cd "$TREE"
# Fix 2: the tarball lacks the generated OpenAPI definitions.
if [[ ! -f pkg/generated/openapi/zz_generated.openapi.go ]]; then
  log "generating OpenAPI definitions (make gen_openapi)"
  make gen_openapi >/dev/null
fi

V=k8s.io/kubernetes/vendor/k8s.io/component-base/version
LDFLAGS="-s -w -X $V.gitVersion=v1.20.2 -X $V.gitMajor=1 -X $V.gitMinor=20 -X $V.gitTreeState=clean"
for b in "${BINS[@]}"; do
  [[ -x $OUT/$b ]] && continue
  log "building $b (the first one takes ~10 min on 2 cores)"
  go build -ldflags "$LDFLAGS" -o "$OUT/$b.tmp" "./cmd/$b"
  mv "$OUT/$b.tmp" "$OUT/$b"
done
log "done: $(ls "$OUT")"
