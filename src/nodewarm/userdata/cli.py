"""`nodewarm package`: build the artifact that AL2023 nodes fetch, and say where it goes."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from .errors import UserDataInvalid

DESCRIPTION = """\
Build the nodewarm artifact that AL2023 nodes download at boot: nodewarm and every Python package it needs,
exactly as installed in this environment, the CPython they run on (interpreter, libpython, standard
library) and a launcher, in one reproducible tar.gz. Nothing is installed on the node. It prints the file,
its sha256, the glibc the nodes need and the upload command.

How a node uses it: the EC2NodeClass user data rendered by `nodewarm render` installs a systemd unit that
runs after nodeadm-run (NVMe RAID built, kubelet started). The unit downloads the artifact with
`aws s3 cp` using the node's instance profile (IMDSv2; no credentials in user data), refuses it unless its
sha256 is the pinned one, unpacks it and runs `nodewarm bootstrap run`.

Requirements:
  * Build on the nodes' CPU architecture, on a machine whose glibc is not newer than the nodes' (the
    interpreter and compiled packages such as cryptography are inside, linked against this glibc).
    AL2023 has glibc 2.34: build on AL2023 (e.g. an amazonlinux:2023 container) if this machine's is
    newer. The printed glibc is the highest any bundled binary requires; the launcher refuses, with
    both versions named, to run on another architecture or an older glibc.
  * Upload to a bucket the node role can read (s3:GetObject), e.g. the compile-cache bucket, and put the
    printed URI and sha256 into the profile. A new artifact changes the user data, so Karpenter replaces
    the NodePool's nodes (drift).
  * Bottlerocket and EKS Auto Mode do not use it: they run the bootstrap DaemonSet from an image.
"""

EPILOG = """\
examples:
  nodewarm package --upload-to s3://my-cache-bucket/nodewarm/artifacts/
  nodewarm package --output dist/ --extra streamer --json
"""


def register(sub) -> None:
    parser = sub.add_parser(
        "package", help="build the artifact AL2023 nodes fetch (prints its sha256 and where to upload it)",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--output", type=Path, default=Path("dist"),
                        help="directory to write the artifact into (default: dist)")
    parser.add_argument("--extra", action="append", default=[], metavar="NAME",
                        help="also bundle a nodewarm extra, e.g. streamer for the Run:ai model streamer "
                             "(repeatable; it must be installed here)")
    parser.add_argument("--upload-to", metavar="S3_PREFIX",
                        help="s3://bucket/prefix/ the nodes will fetch from; only used to print the exact "
                             "upload command and the artifact URI")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    prefix = args.upload_to
    if prefix is not None and not re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", prefix):
        raise UserDataInvalid(f"--upload-to {prefix!r} is not an s3://bucket/prefix/ URI")
    # Imported here: packaging is a build-side dependency, and every `nodewarm` start (on the node too) loads this.
    from .package import build, exceeds_al2023

    artifact = build(args.output, extras=args.extra)
    uri = f"{prefix.rstrip('/')}/{artifact.path.name}" if prefix else f"s3://<bucket>/<prefix>/{artifact.path.name}"
    if args.json:
        print(json.dumps({"path": str(artifact.path), "sha256": artifact.sha256, "size": artifact.size,
                          "python": artifact.python, "arch": artifact.arch, "glibc": artifact.glibc,
                          "artifact_uri": uri, "distributions": artifact.distributions}))
        return 0
    print(f"artifact: {artifact.path} ({artifact.size / 1e6:.1f} MB, python{artifact.python}, {artifact.arch})")
    print(f"sha256:   {artifact.sha256}")
    refused = " (AL2023 has 2.34 and will refuse it: see the warning above)" if exceeds_al2023(artifact.glibc) else ""
    print(f"glibc:    nodes need {artifact.glibc} or newer{refused}")
    print(f"upload:   aws s3 cp {artifact.path} {uri}")
    print(f"then set the artifact URI to {uri} and its sha256 to {artifact.sha256}")
    print("the node role needs s3:GetObject on it")
    return 0
