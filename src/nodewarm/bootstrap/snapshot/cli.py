"""``python -m nodewarm.bootstrap.snapshot.cli``: take a snapshot of a running container by hand (the agent's own
step calls ``checkpoint.checkpoint``). Run it as root in the mount namespace of the node's containerd."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nodewarm.bootstrap.snapshot.checkpoint import CheckpointFailed, checkpoint
from nodewarm.bootstrap.snapshot.store import Store
from nodewarm.bootstrap.snapshot.tools import Tools

EPILOG = """example (containerd's runc root for Kubernetes pods, the container id from the pod's status):
  python -m nodewarm.bootstrap.snapshot.cli checkpoint --store /mnt/k8s-disks/0/nodewarm/snapshots \\
      --runc-root /run/containerd/runc/k8s.io --criu /usr/local/sbin/criu 4f1c...e9

The container stops once it is dumped. A container of the snapshot RuntimeClass with the same key then starts
from the snapshot (docs/snapshots.md)."""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nodewarm.bootstrap.snapshot.cli",
                                description="Engine snapshots on this node.", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("checkpoint", help="checkpoint a running container into the store (it stops)")
    c.add_argument("container_id")
    c.add_argument("--store", required=True, type=Path, help="the snapshot store (root-only; made if missing)")
    c.add_argument("--runc-root", required=True, help="runc's state root of the container (containerd's runc Root "
                                                      "plus the namespace, k8s.io)")
    c.add_argument("--runc", default="runc", help="the real runc (default: on PATH)")
    c.add_argument("--criu", default="criu", help="CRIU 4.2 or later (default: on PATH)")
    args = p.parse_args(argv)
    store = Store(args.store).open()
    try:
        taken = checkpoint(store, Tools(args.runc, args.criu, store.criu_config), args.runc_root, args.container_id)
    except CheckpointFailed as e:
        print(f"checkpoint failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"slot": taken.snapshot.path.name, "path": str(taken.snapshot.path),
                      "seconds": round(taken.seconds, 3), "imageBytes": taken.image_bytes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
