#!/usr/bin/env bash
# Build the `nodewarm` image (deploy/images/nodewarm/Containerfile: the controller, the node agent DaemonSet and
# the other `nodewarm` commands; no torch, no vLLM) from this checkout, with buildah. Idempotent and cached:
#   - this checkout's wheel is built every run (~3 s) and the image rebuilt only when the wheel's contents, its
#     declared dependencies, the Containerfile or the base image changed (the key is the image's label
#     io.nodewarm.build-key); the last line on stdout is the image reference either way
#   - the dependency wheels are resolved from PyPI once per set of declared requirements (pip download, binary
#     wheels only) and kept in the cache; the build itself runs with no network (pip install --no-index)
#   - the base, unless --base names one, is a local Debian bookworm (essential + python3 + python3-venv) made once
#     with mmdebstrap and imported as localhost/nodewarm-base:bookworm: no image registry is needed at all
#   - missing Debian packages (buildah, podman, mmdebstrap, docker-registry, skopeo, crun, runc, uidmap) are
#     installed with apt-get, as scripts/setup.sh does
#
# Usage: scripts/build-images.sh [--base IMAGE] [--name REPO] [--push REPO [--insecure]] [--refresh-deps]
#        scripts/build-images.sh --context DIR     # only write the build context (wheels/), for docker build
#   --base IMAGE   build on IMAGE instead of the local Debian base (e.g. docker.io/library/python:3.11-slim)
#   --name REPO    the local image name (default localhost/nodewarm); the tag is the checkout's version
#   --push REPO    then push REPO:VERSION (e.g. 127.0.0.1:5000/nodewarm, 123456789012.dkr.ecr.../nodewarm)
#   --insecure     push over plain HTTP / without TLS verification (a local test registry)
#   --refresh-deps resolve the dependency wheels from PyPI again (newest releases within pyproject's ranges)
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
base="" name=localhost/nodewarm push="" tls_verify=true refresh_deps=false context_only=""
while (($#)); do
  case $1 in
    --base) base=${2:?--base IMAGE}; shift 2 ;;
    --name) name=${2:?--name REPO}; shift 2 ;;
    --push) push=${2:?--push REPO}; shift 2 ;;
    --insecure) tls_verify=false; shift ;;
    --refresh-deps) refresh_deps=true; shift ;;
    --context) context_only=${2:?--context DIR}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

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

# --- the base image ----------------------------------------------------------------------------------------------
# The recipe: Debian bookworm's Essential set + python3 + python3-venv (its ensurepip makes the venv), without docs,
# man pages and translations; bookworm-updates and the security suite included. The merged-usr hook lays out the
# merged /usr itself (usr-is-merged) instead of installing usrmerge, which pulls in perl (~45 MB). Its digest labels the image, so a
# change to this recipe builds a new base.
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
# shellcheck disable=SC2054,SC2016  # commas inside --include; "$1" is the hook's own argument
BASE_ARGS=(--mode=root --variant=essential --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr --include=python3,python3-venv --aptopt='Acquire::Languages "none"'
           --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
           --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*'
           --dpkgopt='path-exclude=/usr/share/info/*' --customize-hook='rm -rf "$1"/var/cache/apt "$1"/var/lib/apt/lists'
           bookworm)
BASE_SOURCES=("deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" "deb $SECURITY bookworm-security main")
label() { podman image inspect --format "{{index .Labels \"$2\"}}" "$1" 2>/dev/null || true; }

if [[ -z $base ]]; then
  base=$BASE_REF
  recipe_key=$(printf '%s\n' "${BASE_ARGS[@]}" "${BASE_SOURCES[@]}" | sha256sum | cut -c1-16)
  if [[ $(label "$base" io.nodewarm.base-recipe) != "$recipe_key" ]]; then
    log "building the base $base with mmdebstrap (Debian bookworm + python3)"
    t0=$SECONDS
    quietly mmdebstrap "${BASE_ARGS[@]}" "$work/base.tar" "${BASE_SOURCES[@]}" || die "mmdebstrap failed"
    old=$(podman image inspect --format '{{.Id}}' "$base" 2>/dev/null || true)
    podman import -q --change 'CMD ["/bin/bash"]' --change "LABEL io.nodewarm.base-recipe=$recipe_key" \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      "$work/base.tar" "$base" >/dev/null
    [[ -z $old ]] || podman rmi -f "$old" >/dev/null 2>&1 || true
    rm -f "$work/base.tar"
    log "base built in $((SECONDS - t0)) s"
  fi
else
  podman image exists "$base" || podman pull -q "$base" >/dev/null
fi
base_id=$(podman image inspect --format '{{.Id}}' "$base")

# --- the OCI runtime: a container must run here (buildah's RUN steps, podman run) --------------------------------
# Two things stop the defaults on some machines (both seen on this project's VMs): crun 1.8 (Debian 12) refuses a
# hybrid cgroup v1/v2 host ("cgroups in hybrid mode not supported"), and without CAP_SYS_RESOURCE the runtime cannot
# raise RLIMIT_NOFILE/NPROC to podman's rootful default of 1048576 ("setrlimit ... Operation not permitted").
# Where the defaults fail and /etc/containers/containers.conf is absent, write one: runc, and the limits this
# process may set (open files: its hard limit; processes: at most 32768, the most conmon keeps).
runs() { podman run --rm --network none "$1" true >/dev/null 2>&1; }
if ! runs "$base"; then
  [[ ! -e /etc/containers/containers.conf ]] \
    || die "podman cannot run a container with /etc/containers/containers.conf as it is: $(podman run --rm --network none "$base" true 2>&1 | tail -1)"
  nofile=$(ulimit -Hn) nproc=$(ulimit -Hu)
  [[ $nofile == unlimited ]] && nofile=1048576
  [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
  runtime=crun
  [[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]] || runtime=runc
  log "podman cannot run a container with the defaults: writing /etc/containers/containers.conf (runtime $runtime, nofile $nofile, nproc $nproc)"
  mkdir -p /etc/containers
  printf '# Written by nodewarm scripts/build-images.sh: the defaults did not run a container on this machine.\n[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n\n[engine]\nruntime = "%s"\n' \
    "$nofile" "$nofile" "$nproc" "$nproc" "$runtime" > /etc/containers/containers.conf
  runs "$base" || die "podman still cannot run a container: $(podman run --rm --network none "$base" true 2>&1 | tail -1)"
fi

# --- the image ---------------------------------------------------------------------------------------------------
ref="$name:$version"
build_key=$(printf '%s\n' "$wheel_key" "$deps_key" "$(sha256sum < "$CONTAINERFILE")" "$base_id" | sha256sum | cut -c1-16)
if [[ $(label "$ref" io.nodewarm.build-key) == "$build_key" ]]; then
  log "$ref is up to date (build key $build_key)"
else
  log "building $ref on $base (build key $build_key)"
  t0=$SECONDS
  old=$(podman image inspect --format '{{.Id}}' "$ref" 2>/dev/null || true)
  buildah bud --quiet --network none --pull=never --layers=false \
    --build-arg "BASE=$base" --build-arg "VERSION=$version" \
    --label "io.nodewarm.build-key=$build_key" --label "io.nodewarm.wheel=$wheel_key" \
    -f "$CONTAINERFILE" -t "$ref" "$context" >&2
  # The image it replaced, when nothing else names it (never a blanket prune: other images are not ours).
  new=$(podman image inspect --format '{{.Id}}' "$ref")
  if [[ -n $old && $old != "$new" ]]; then podman rmi "$old" >/dev/null 2>&1 || true; fi
  log "built $ref in $((SECONDS - t0)) s"
fi

if [[ -n $push ]]; then
  log "pushing $ref to $push:$version"
  buildah push --quiet --tls-verify="$tls_verify" "$ref" "docker://$push:$version" >&2
fi
echo "$ref"
