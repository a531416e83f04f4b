#!/bin/bash
# nodewarm-launch: fetch the pinned nodewarm artifact, refuse it unless its sha256 matches, then run it.
# It runs inside the nodewarm-bootstrap unit (after nodeadm-run), never in cloud-init, so a slow or failing
# download cannot hold back kubelet. The aws CLI signs with the instance profile through IMDSv2: the user
# data carries no secret. Exit 3 means the artifact is wrong; the unit does not retry that.
set -euo pipefail
: "${NODEWARM_ARTIFACT_URI:?missing; it is set in /etc/nodewarm/bootstrap.env}"
: "${NODEWARM_ARTIFACT_SHA256:?missing; it is set in /etc/nodewarm/bootstrap.env}"
root="${NODEWARM_ROOT:-/opt/nodewarm}"
# The region is the node's own (IMDSv2), never the renderer's: the same user data serves every region.
if [ -z "${AWS_REGION:-}" ]; then
  imds="${NODEWARM_IMDS_ENDPOINT:-http://169.254.169.254}"
  token=$(curl -sS -f -m 5 -X PUT "$imds/latest/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 60")
  AWS_REGION=$(curl -sS -f -m 5 -H "X-aws-ec2-metadata-token: $token" "$imds/latest/meta-data/placement/region")
  export AWS_REGION AWS_DEFAULT_REGION="$AWS_REGION"
fi
dir="$root/artifacts/$NODEWARM_ARTIFACT_SHA256"
if [ ! -x "$dir/bin/nodewarm" ]; then
  mkdir -p "$root/artifacts"
  tmp=$(mktemp -d "$root/artifacts/.fetch.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  aws s3 cp --only-show-errors "$NODEWARM_ARTIFACT_URI" "$tmp/artifact.tar.gz"
  got=$(sha256sum "$tmp/artifact.tar.gz" | cut -d' ' -f1)
  if [ "$got" != "$NODEWARM_ARTIFACT_SHA256" ]; then
    echo "nodewarm-launch: refusing $NODEWARM_ARTIFACT_URI: its sha256 is $got but the user data pins" \
      "$NODEWARM_ARTIFACT_SHA256; upload the file nodewarm package built, or re-render with its sha256" >&2
    exit 3
  fi
  mkdir "$tmp/tree"
  tar -xzf "$tmp/artifact.tar.gz" -C "$tmp/tree" --no-same-owner
  mv -T "$tmp/tree" "$dir"
  rm -rf "$tmp"
  trap - EXIT
fi
exec "$dir/bin/nodewarm" "$@"
