#!/usr/bin/env python
"""vLLM's own compile-cache hash for a server argv, computed with vLLM's code, without booting an engine.

Runs in the serving environment (``.venv-serving``): ``python vllmhash.py < cases.json`` reads a JSON list of
cases ``{"argv": [...], "env": {...}, "vllm_version": "..."}`` (imports cost ~30 s here, a case ~1 s, so a test
asks once). For each it sets the env, parses the argv with the API server's own parser (``make_arg_parser``),
builds the ``VllmConfig`` the server would build (``AsyncEngineArgs.create_engine_config``: the model's
config.json is read, the CPU platform rewrites the compilation mode), and prints one line per case, MARK + JSON:

* ``dir``: the directory name vLLM's AOT path uses under ``torch_compile_cache/torch_aot_compile/``
  (decorators.py: sha256 of ``aot_compile_hash_factors(config)`` + ``_model_hash_key(forward)``), for the model's
  compiled module (LlamaModel here);
* ``config`` and ``env``: its two vLLM-side parts, ``VllmConfig.compute_hash()`` and the hash of
  ``envs.compile_factors()`` (what every vLLM compile-cache layout, AOT or not, hashes from the config and env).

A case's ``env`` is laid over this process's environment (``null`` removes a variable): vLLM reads its
``VLLM_*`` variables live, as the server would. ``vllm_version`` replaces ``vllm.__version__``: the one way to ask
what another vLLM version would hash to with a single install (compute_hash and the model hash key both read
that attribute).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

# vLLM and triton print to stdout too: a result line starts with this.
MARK = "VLLMHASH "


def _one(case: dict, base_env: dict[str, str]) -> dict:
    import vllm
    from vllm import envs
    from vllm.compilation.caching import aot_compile_hash_factors
    from vllm.compilation.decorators import _model_hash_key
    from vllm.config.utils import hash_factors
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.model_executor.models.llama import LlamaModel
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    os.environ.clear()
    os.environ.update(base_env)
    for k, v in (case.get("env") or {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    real = vllm.__version__
    vllm.__version__ = case.get("vllm_version") or real
    try:
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(case["argv"])
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config(UsageContext.OPENAI_API_SERVER)
        factors = aot_compile_hash_factors(config)
        factors.append(_model_hash_key(LlamaModel.forward))
        return {"dir": hashlib.sha256(str(factors).encode()).hexdigest(), "config": config.compute_hash(),
                "env": hash_factors(envs.compile_factors()), "model": config.model_config.model,
                "vllm": vllm.__version__}
    finally:
        vllm.__version__ = real


def compute(cases: list[dict], mounts: dict[str, str], env: dict[str, str], timeout: float = 600) -> list[dict]:
    """Caller side (any Python, stdlib only): run this script in the serving environment on ``cases`` and return
    its answers in order. ``mounts``: {path vLLM sees: directory on this machine}, each bind-mounted at its own
    path in a private mount namespace (as testenv/podrun does): the model (vLLM hashes the model string, so the
    rendered ``/models/P`` must be the path it sees) and the rendered cache root (vLLM writes there even
    without booting, which must not land on this machine's own /compile-cache). ``env``: the process
    environment (PATH included)."""
    import shlex
    import subprocess
    from pathlib import Path

    from .podrun import serving_venv

    made: list[Path] = []
    for target in mounts:
        for d in reversed([q for q in [Path(target), *Path(target).parents] if not q.exists()]):
            d.mkdir()
            made.append(d)
    script = ["set -e"] + [f"mount --bind {shlex.quote(src)} {shlex.quote(dst)}" for dst, src in mounts.items()]
    script.append(f"exec {shlex.quote(str(serving_venv() / 'bin' / 'python3'))} {shlex.quote(__file__)}")
    try:
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)],
                              input=json.dumps(cases), capture_output=True, text=True, env=env, timeout=timeout)
    finally:
        for d in reversed(made):
            try:
                d.rmdir()
            except OSError:
                pass
    out = [json.loads(line[len(MARK):]) for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or len(out) != len(cases):
        raise RuntimeError(f"vllmhash answered {len(out)} of {len(cases)} cases (rc {proc.returncode}):\n"
                           f"{proc.stderr[-4000:]}")
    return out


def main() -> int:
    cases = json.load(sys.stdin)
    base = dict(os.environ)
    for case in cases:
        print(MARK + json.dumps(_one(case, base)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
