"""`nodewarm demo`: start local servers, apply a rendered WarmProfile, and (see run.py) warm nodes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = """\
Run nodewarm end to end on this machine, with no AWS account: a real kube-apiserver + etcd (and the
real kube-scheduler when built), a real S3 server on 127.0.0.1, Karpenter's part played as its docs
describe, the real bootstrap on each simulated node and the real controller.

Everything it starts is stopped at the end, also on Ctrl-C. Needs the setup done by scripts/setup.sh.
"""


def run(args: argparse.Namespace) -> int:
    from .run import DemoOptions, run_demo

    opts = DemoOptions(
        nodes=args.nodes, model_mb=args.model_mb, workdir=Path(args.workdir) if args.workdir else None,
        out_dir=Path(args.out), baseline=not args.no_baseline, keep=args.keep,
    )
    return run_demo(opts, sys.stdout)


def register(sub) -> None:
    d = sub.add_parser("demo", help="run the whole product locally (API server, S3, nodes, controller)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--nodes", type=int, default=3, help="nodes in the simulated scale-up (default 3)")
    d.add_argument("--model-mb", type=int, default=1024, help="size of the model-like safetensors set (default 1024)")
    d.add_argument("--out", default="out/demo", help="where timeline.json and timeline.png go (default out/demo)")
    d.add_argument("--workdir", help="scratch folder for servers and node disks (default: a temp dir)")
    d.add_argument("--no-baseline", action="store_true", help="skip the no-warm comparison run")
    d.add_argument("--keep", action="store_true", help="keep the scratch folder afterwards")
    d.set_defaults(func=run)
