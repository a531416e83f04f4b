#!/usr/bin/env bash
# Build CRIU >= 4.2 (checkpoint/restore of containers, which runc drives) from Debian sid's `criu` source package.
# Why not Debian's binary: bookworm's criu 3.17 fails `criu check` on this machine's kernel (its vDSO), and CRIU 4.1
# fails on TCP sockets on kernels >= 6.16; 4.2.1 (sid's source today) builds against bookworm's libraries and passes.
# Produces ${NODEWARM_CRIU_BIN:-~/.cache/nodewarm/criu}/criu, a copy of the built binary (linked against the
# Debian libraries installed below; nodewarm_dev.testenv.criu.criu_binary() finds it). The source and the build tree
# stay in ~/.cache/nodewarm/criu-src.
# One patch on top (criu-xtile-permission.patch): a restored process asks the kernel for AMX tile data again, as the
# permission is kernel state CRIU does not save; without it a vLLM engine that ran oneDNN's or Inductor's AMX kernels
# dies of SIGILL at its next request (docs/snapshots.md).
# Idempotent: exits at once when the cached binary runs, reports version >= 4.2 and was built with this patch
# (~30 s to build on 2 cores otherwise).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=debsource.sh
. "$HERE/debsource.sh"

OUT=${NODEWARM_CRIU_BIN:-$HOME/.cache/nodewarm/criu}
WORK=${NODEWARM_CRIU_WORK:-$HOME/.cache/nodewarm/criu-src}
MIN=4.2
PATCH=$HERE/criu-xtile-permission.patch
STAMP=$(sha256sum "$PATCH" | cut -c1-16)      # the patch the cached binary and the build tree carry
log() { echo "[build-criu] $*" >&2; }

# "Version: 4.2.1" from `criu --version`, or nothing when the binary is missing or does not run.
version_of() { "$1" --version 2>/dev/null | sed -n 's/^Version: *\([0-9][0-9.]*\).*/\1/p' | head -1 || true; }
new_enough() { [[ -n $1 && $(printf '%s\n' "$MIN" "$1" | sort -V | head -1) == "$MIN" ]]; }

have=""
[[ -x $OUT/criu ]] && have=$(version_of "$OUT/criu")
if new_enough "$have" && [[ $(cat "$OUT/criu.patch" 2>/dev/null) == "$STAMP" ]]; then
  echo "criu $have already built in $OUT"; exit 0
fi
if [[ -x $OUT/criu ]]; then
  log "the cached $OUT/criu ${have:+is $have, }not a working criu >= $MIN with this patch: building it again"
fi

# CRIU's own list (criu/Makefile.packages: uuid-dev is required, -luuid) plus what makes its optional features
# (libbsd, gnutls, nftables) as Debian's package has them.
debsource_need build-criu gcc make libc6-dev pkg-config xz-utils libprotobuf-dev libprotobuf-c-dev \
  protobuf-c-compiler protobuf-compiler python3-protobuf libnl-3-dev libnet1-dev libcap-dev libaio-dev libbsd-dev \
  libnftables-dev libgnutls28-dev uuid-dev patch

mkdir -p "$WORK" "$OUT"
orig=$(find "$WORK" -maxdepth 1 -name 'criu_*.orig.tar.*' | sort -V | tail -1)
if [[ -z $orig ]]; then
  log "fetching criu's source package (Debian sid)"
  orig=$(debsource_fetch criu sid "$WORK")
fi
ver=$(basename "$orig"); ver=${ver#criu_}; ver=${ver%.orig.tar.*}
TREE=$WORK/criu-$ver
if [[ ! -f $TREE/Makefile || $(cat "$TREE/.nodewarm-patch" 2>/dev/null) != "$STAMP" ]]; then
  log "unpacking $(basename "$orig") and applying $(basename "$PATCH")"
  rm -rf "$TREE" "$TREE.tmp" && mkdir -p "$TREE.tmp"
  tar -xf "$orig" -C "$TREE.tmp" --strip-components=1
  patch -s -p1 -d "$TREE.tmp" <"$PATCH"
  echo "$STAMP" >"$TREE.tmp/.nodewarm-patch"
  mv "$TREE.tmp" "$TREE"
fi

log "building criu $ver (make criu, ~30 s on 2 cores)"
make -C "$TREE" -j"$(nproc)" criu >"$WORK/build.log" 2>&1 || {
  tail -30 "$WORK/build.log" >&2
  log "FAILED: make criu in $TREE (whole log: $WORK/build.log)"
  exit 1
}
built=$(version_of "$TREE/criu/criu")
if ! new_enough "$built"; then
  log "FAILED: $TREE/criu/criu reports version '${built:-none}', need >= $MIN (the source was" \
      "$(basename "$orig"); remove $WORK to fetch sid's current one)"
  exit 1
fi
cp "$TREE/criu/criu" "$OUT/criu.tmp"
mv "$OUT/criu.tmp" "$OUT/criu"
echo "$STAMP" >"$OUT/criu.patch"
log "done: $OUT/criu, version $built (\`criu check\` as root says whether this kernel supports it)"
