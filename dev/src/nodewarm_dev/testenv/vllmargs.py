#!/usr/bin/env python
"""What vLLM's own server argument parser makes of argument lists: run in the serving environment (it imports
vLLM), as ``python vllmargs.py < request.json``; tests/engine/test_vllm_argv.py drives it.

Request: ``{"module": [ARGS, ...], "serve": [ARGS, ...]}``. ``module``: parsed as ``python3 -m
vllm.entrypoints.openai.api_server ARGS`` parses them (FlexibleArgumentParser + make_arg_parser); ``serve``: as
``vllm serve ARGS`` does (the CLI's top-level parser with its serve subcommand, which moves ``--model`` to the
positional model). Answer: the same lists, each ``{"ns": {dest: value}}`` or ``{"error": message}``; plus
``"options"``: every option string of the server parser and its dest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import io
import json
import sys


def _plain(value):
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value):       # vLLM's config objects (compilation_config, ...)
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return str(value)


def _parse(parser, argv: list[str]) -> dict:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
    except SystemExit:
        return {"error": err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "exit"}
    except ValueError as e:
        return {"error": str(e)}
    return {"ns": {k: _plain(v) for k, v in vars(ns).items() if not callable(v)}}


def main() -> int:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    request = json.load(sys.stdin)
    module = make_arg_parser(FlexibleArgumentParser())
    cli = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(cli.add_subparsers(dest="subparser"))
    out = {"module": [_parse(module, a) for a in request.get("module", [])],
           "serve": [_parse(cli, ["serve", *a]) for a in request.get("serve", [])],
           "options": {s: a.dest for a in module._actions for s in a.option_strings}}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
