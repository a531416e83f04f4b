# shellcheck shell=bash
# Fetching a Debian source package without touching the system's apt configuration. Sourced, not run:
#
#   . "$HERE/debsource.sh"
#   orig=$(debsource_fetch kubernetes bookworm "$WORK")     # prints the path of the upstream (orig) tarball
#
# build-kube.sh (bookworm's kubernetes) and build-criu.sh (sid's criu) use it: the one home of how this machine's
# Debian mirror is found. It also installs the Debian packages a build script needs (debsource_need).

# debsource_need LOG_PREFIX PACKAGE...: install those of the packages dpkg does not have (no recommends), as root
# or through sudo; nothing when all are there.
debsource_need() {
  local prefix=$1 p sudo=""
  shift
  local need=()
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  ((${#need[@]})) || return 0
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  echo "[$prefix] installing Debian packages: ${need[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

# The machine's own Debian mirror (deb822 `URIs:` or one-line `deb` entries; comments skipped; not the security
# archive), else deb.debian.org.
debsource_mirror() {
  local mirror
  mirror=$(grep -h -E '^(URIs:|deb )' /etc/apt/sources.list.d/* /etc/apt/sources.list 2>/dev/null \
           | grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -1 | tr -d ' ' || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  echo "${mirror%/}"
}

# debsource_fetch PACKAGE SUITE WORKDIR: download the source package PACKAGE of SUITE (main) into WORKDIR and print
# the path of its upstream tarball (PACKAGE_VERSION.orig.tar.*). A private source list (WORKDIR/src.list) and private
# list/state directories (WORKDIR/apt-lists), so the system's apt configuration is never read for sources nor
# changed. Only the upstream tarball is required: when another file of the package cannot be fetched (sid's
# debian.tar.xz is sometimes already gone from the mirror while its index still names it), that is a warning, not a
# failure. Files already in WORKDIR with the right hashes are not fetched again.
debsource_fetch() {
  local pkg=$1 suite=$2 work=$3 orig
  mkdir -p "$work/apt-lists/partial"
  echo "deb-src [trusted=yes] $(debsource_mirror) $suite main" >"$work/src.list"
  local apto=(-o Dir::Etc::SourceList="$work/src.list" -o Dir::Etc::SourceParts=/dev/null
              -o Dir::State::Lists="$work/apt-lists")
  apt-get "${apto[@]}" update -qq >&2 || return 1
  # --print-uris lines: 'URI' FILE SIZE HASH (apt's notices around them are not quoted).
  orig=$(apt-get "${apto[@]}" --print-uris source "$pkg" 2>/dev/null \
         | awk -v p="${pkg}_" -v q="'" 'substr($0, 1, 1) == q && index($2, p) == 1 && $2 ~ /\.orig\.tar\./ { print $2; exit }')
  if [[ -z $orig ]]; then
    echo "debsource: $suite has no source package $pkg with an upstream tarball" >&2
    return 1
  fi
  # apt's messages go to WORKDIR/apt-source.log and are shown only when the upstream tarball did not come.
  if ! (cd "$work" && apt-get "${apto[@]}" source --download-only "$pkg" >/dev/null 2>"$work/apt-source.log"); then
    if [[ ! -f $work/$orig ]]; then
      cat "$work/apt-source.log" >&2
      echo "debsource: could not fetch $orig of $pkg ($suite)" >&2
      return 1
    fi
    echo "debsource: $pkg ($suite): only the upstream tarball $orig came, all that is needed" \
         "(apt's errors: $work/apt-source.log)" >&2
  fi
  echo "$work/$orig"
}
