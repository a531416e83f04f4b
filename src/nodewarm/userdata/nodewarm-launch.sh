#!/bin/bash
# nodewarm-launch: fetch the pinned nodewarm artifact, refuse it unless its sha256 matches, then run it.
# It runs inside the nodewarm-bootstrap unit (after nodeadm-run), never in cloud-init, so a slow or failing
# download cannot hold back kubelet. The aws CLI signs with the instance profile through IMDSv2: the user
# data carries no secret. Exit 3 means the artifact is wrong; the unit does not retry that.
# A failure here happens before the agent (and its Node report) exists: it is written to
# $NODEWARM_STATE_DIR/launch-failure, which the agent reports on the node as soon as one starts.
# NODEWARM_LAUNCH_STARTED (epoch seconds) is taken first, so the agent can time unit start -> first byte pulled.
NODEWARM_LAUNCH_STARTED=$(date +%s.%N)
export NODEWARM_LAUNCH_STARTED
set -euo pipefail
: "${NODEWARM_ARTIFACT_URI:?missing; it is set in /etc/nodewarm/bootstrap.env}"
: "${NODEWARM_ARTIFACT_SHA256:?missing; it is set in /etc/nodewarm/bootstrap.env}"
root="${NODEWARM_ROOT:-/opt/nodewarm}"
export NODEWARM_STATE_DIR="${NODEWARM_STATE_DIR:-/var/lib/nodewarm}"
dir="$root/artifacts/$NODEWARM_ARTIFACT_SHA256"

fail() {  # reason exit-status message: say it, leave the record (temp name, then rename), exit
  echo "nodewarm-launch: $3" >&2
  { mkdir -p "$NODEWARM_STATE_DIR" &&
    printf 'reason=%s\nstatus=%s\ntime=%s\n\n%s\n' "$1" "$2" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$3" \
      > "$NODEWARM_STATE_DIR/.launch-failure.tmp" &&
    mv -f "$NODEWARM_STATE_DIR/.launch-failure.tmp" "$NODEWARM_STATE_DIR/launch-failure"; } 2>/dev/null ||
    echo "nodewarm-launch: cannot write $NODEWARM_STATE_DIR/launch-failure" >&2
  exit "$2"
}

# The region is the node's own (IMDSv2), never the renderer's: the same user data serves every region.
if [ -z "${AWS_REGION:-}" ]; then
  imds="${NODEWARM_IMDS_ENDPOINT:-http://169.254.169.254}"
  if ! token=$(curl -sS -f -m 5 -X PUT "$imds/latest/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 60") ||
     ! AWS_REGION=$(curl -sS -f -m 5 -H "X-aws-ec2-metadata-token: $token" "$imds/latest/meta-data/placement/region"); then
    fail RegionUnknown 1 "cannot read the region from instance metadata ($imds)"
  fi
  export AWS_REGION AWS_DEFAULT_REGION="$AWS_REGION"
fi

if [ ! -x "$dir/bin/nodewarm" ]; then
  mkdir -p "$root/artifacts" || fail LaunchFailed 1 "cannot create $root/artifacts"
  tmp=$(mktemp -d "$root/artifacts/.fetch.XXXXXX") || fail LaunchFailed 1 "cannot create a temp dir in $root/artifacts"
  trap 'rm -rf "$tmp"' EXIT
  if ! aws s3 cp --only-show-errors "$NODEWARM_ARTIFACT_URI" "$tmp/artifact.tar.gz" 2>"$tmp/aws.err"; then
    fail ArtifactFetchFailed 1 "cannot fetch $NODEWARM_ARTIFACT_URI: $(tail -c 2000 "$tmp/aws.err")"
  fi
  got=$(sha256sum "$tmp/artifact.tar.gz" | cut -d' ' -f1)
  if [ "$got" != "$NODEWARM_ARTIFACT_SHA256" ]; then
    fail ArtifactRejected 3 "refusing $NODEWARM_ARTIFACT_URI: its sha256 is $got but the user data pins $NODEWARM_ARTIFACT_SHA256; upload the file nodewarm package built, or re-render with its sha256"
  fi
  mkdir "$tmp/tree"
  tar -xzf "$tmp/artifact.tar.gz" -C "$tmp/tree" --no-same-owner 2>"$tmp/tar.err" ||
    fail ArtifactUnpackFailed 1 "cannot unpack $NODEWARM_ARTIFACT_URI: $(tail -c 2000 "$tmp/tar.err")"
  mv -T "$tmp/tree" "$dir" || fail LaunchFailed 1 "cannot move the artifact into $dir"
  rm -rf "$tmp"
  trap - EXIT
fi
exec "$dir/bin/nodewarm" "$@"
