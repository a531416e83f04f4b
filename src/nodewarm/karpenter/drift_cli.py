"""`nodewarm drift hash`: the drift hash Karpenter would stamp on each NodePool and EC2NodeClass of a file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from nodewarm import logs
from nodewarm.api.errors import NodewarmError

from . import drifthash
from .apis import DEFAULT_EC2NODECLASS_VERSION, EC2NODECLASS_VERSIONS

LOG = logs.Logger("drift")

HELP = """\
Print, for every NodePool and EC2NodeClass in FILE (YAML, several documents allowed, '-' for stdin), the drift
hash Karpenter stamps on it and copies onto each NodeClaim it launches:

  KIND NAME HASH-VERSION HASH

A NodeClaim whose karpenter.sh/nodepool-hash (or karpenter.k8s.aws/ec2nodeclass-hash) differs from its object's,
at the same -hash-version, is Drifted and gets replaced. Compare with a live NodeClaim:
  kubectl get nodeclaim NAME -o jsonpath='{.metadata.annotations}'

The EC2NodeClass hash covers the cluster CA bundle Karpenter uses: pass --ca-bundle with the cluster's CA, either
the PEM (the ca.crt Karpenter's pod mounts) or the base64 string (aws eks describe-cluster --query
cluster.certificateAuthority.data, or Karpenter's CLUSTER_CA_BUNDLE). Without it the value is for an empty bundle:
good for comparing two files, not equal to what your cluster stamps. Other kinds in FILE are skipped.
"""


def register(sub) -> None:
    p = sub.add_parser("drift", help="Karpenter's drift hashes for NodePools and EC2NodeClasses",
                       description="What Karpenter's drift detection computes, offline.")
    dsub = p.add_subparsers(dest="drift_command", metavar="SUBCOMMAND", required=True)
    h = dsub.add_parser("hash", help="print the drift hash Karpenter would stamp on each object", description=HELP,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    h.add_argument("-f", "--file", required=True, help="YAML with NodePool / EC2NodeClass documents ('-': stdin)")
    h.add_argument("--ca-bundle", metavar="FILE", help="the cluster CA: PEM, or the base64 of it")
    h.add_argument("--hash-version", default=DEFAULT_EC2NODECLASS_VERSION, choices=EC2NODECLASS_VERSIONS,
                   help="EC2NodeClass hash version: v5 = Karpenter v1.14 (default), v6 = main")
    h.set_defaults(func=run_hash)


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except OSError as e:
        raise NodewarmError(f"--file {path}: {e.strerror}", "FileUnreadable") from None


def hash_lines(text: str, ca_bundle: str | None, version: str) -> list[str]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as e:
        raise NodewarmError(f"--file is not YAML: {e}", "InvalidYAML") from None
    out = []
    for d in docs:
        if not isinstance(d, dict) or d.get("kind") not in ("NodePool", "EC2NodeClass"):
            continue
        s = drifthash.stamped_hash(d, ca_bundle, version)
        for f in s.unknown_fields:
            LOG.warning("drift.unknown_field", kind=s.kind, name=s.name, field=f,
                                               meaning="not a field of Karpenter's type here: the API server drops "
                                                       "it, and if it is newer than this model the hash may differ")
        out.append(f"{s.kind} {s.name or '-'} {s.version} {s.value}")
    return out


def run_hash(args) -> int:
    ca = None
    if args.ca_bundle:
        try:
            ca = drifthash.encode_ca_bundle(Path(args.ca_bundle).read_bytes())
        except OSError as e:
            raise NodewarmError(f"--ca-bundle {args.ca_bundle}: {e.strerror}", "FileUnreadable") from None
    lines = hash_lines(_read(args.file), ca, args.hash_version)
    if ca is None and any(line.startswith("EC2NodeClass ") for line in lines):
        LOG.warning("drift.no_ca_bundle", meaning="EC2NodeClass hashes computed for an empty "
                                           "CA bundle; pass --ca-bundle for the value your cluster stamps")
    for line in lines:
        print(line)
    return 0
