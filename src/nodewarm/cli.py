"""The `nodewarm` command. Each part of the product registers its own subcommands here."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__, logs
from .api.errors import NodewarmError

# Each module exposes register(subparsers), adding parsers whose `func(args) -> int` runs.
# Order is the order shown in --help.
TOP_LEVEL = [
    "nodewarm.render_cli",        # render
    "nodewarm.karpenter.drift_cli",  # drift hash
    "nodewarm.bootstrap.cli",     # bootstrap weights | compile-cache | run ; publish
    "nodewarm.bootstrap.enginecheck.cli",  # engine-check (the check pod's command)
    "nodewarm.controller.cli",    # controller
    "nodewarm.userdata.cli",      # package
    "nodewarm.status.cli",        # status
]
# Distributions beside nodewarm add commands under this entry-point group (nodewarm-dev in dev/: `demo`); each
# names a module with register(subparsers), shown in --help after the product's own.
PLUGIN_GROUP = "nodewarm.commands"

DESCRIPTION = """\
nodewarm makes a freshly scaled-up Karpenter / EKS Auto Mode GPU node serve vLLM in seconds:
the node pulls the model from S3 onto its NVMe RAID and restores the torch.compile caches while a
startup taint keeps pods away; the controller lifts the taint once the node reports Warm.

Typical flow:
  nodewarm render -f profile.yaml | kubectl apply --server-side -f -   # NodeClass, NodePool, vLLM
  nodewarm package --upload-to s3://cache-bucket/nodewarm/            # the artifact nodes fetch
  nodewarm controller                                                  # in the cluster
  nodewarm demo                                                        # everything, locally, no AWS
                                                                       # (with nodewarm-dev, from dev/)
"""


# The node agent's commands, registered alone when they are the command given: the agent's start-up is on
# the warm-up's critical path, and the other parts' modules (render, controller, demo, status) cost ~0.3 s
# of imports it never uses (python -X importtime). tests/bootstrap/test_weights_cli.py checks these against TOP_LEVEL.
AGENT_COMMANDS = {"bootstrap": "nodewarm.bootstrap.cli", "publish": "nodewarm.bootstrap.cli",
                  "engine-check": "nodewarm.bootstrap.enginecheck.cli"}


def _command(argv: list[str]) -> str | None:
    """The first positional argument: the top-level command (None for --help, --version or none)."""
    args = iter(argv)
    for a in args:
        if a == "--log-level":
            next(args, None)
        elif not a.startswith("-"):
            return a
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nodewarm", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"nodewarm {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    only = AGENT_COMMANDS.get(_command(argv)) if argv is not None else None
    for name in [only] if only else TOP_LEVEL + _plugins():
        importlib.import_module(name).register(sub)
    return parser


def _plugins() -> list[str]:
    from importlib.metadata import entry_points

    return [ep.value for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda ep: ep.name)]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    logs.setup(args.log_level)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except NodewarmError as e:
        print(f"nodewarm: {e.one_line()}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("nodewarm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
