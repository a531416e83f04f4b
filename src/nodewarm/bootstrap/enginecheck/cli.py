"""`nodewarm engine-check`: the check pod's command (runner.py). Exit 0 when the engine served, 1 when it did not."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Boot vLLM on this node as the serving pod would, ask it one completion, stop it, and write what happened
as JSON to --result (the container's termination message, which the node agent reads).

Runs in the check pod that `nodewarm render` describes (a PodTemplate, spec.readiness.engineCheck) and the
controller creates on a node that asked. After -- comes the vLLM container's command and args, as rendered.
Fails with CompileCacheNotLoaded as soon as vLLM compiles what the node agent restored (and marks that bundle
stale with --uri), ModelDoesNotFit when vLLM says the weights or the KV cache do not fit, EngineBootFailed
when it exits otherwise, EngineCheckTimedOut after --timeout.

With --observe (spec.serving.snapshot) vLLM is the pod's serving container: wait for its /health, ask it,
judge, and leave it running for the node agent's checkpoint; nothing comes after --.

Example (what the rendered pod runs):
  nodewarm engine-check --port 8000 --served-model-name llama --timeout 600 \\
    --baseline /compile-cache/nodewarm-baseline.json --vllm-cache-root /compile-cache/vllm \\
    --inductor-dir /compile-cache/inductor --triton-dir /compile-cache/triton \\
    --pch-dir /compile-cache/tmp/torchinductor_root/precompiled_headers \\
    -- python3 /nodewarm/serve-start/serve_start.py --local /models/llama ... -- --model=/models/llama ...
"""


def register(sub: argparse._SubParsersAction) -> None:
    from nodewarm.api.enginecheck import add_runner_flags

    p = sub.add_parser("engine-check", help="boot vLLM once on this node and prove it serves (the check pod)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_runner_flags(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from nodewarm.api.enginecheck import runner_args
    from nodewarm.api.errors import NodewarmError

    from . import runner

    try:
        a = runner_args(args)
    except ValueError as e:
        raise NodewarmError(str(e)) from None
    result = runner.check(a)
    runner.write_result(a.result, result)
    runner.log.info("enginecheck.done", passed=result.passed, reason=result.reason, message=result.message,
                    boot_s=result.boot_s, first_token_s=result.first_token_s, compile_cache=result.compile_cache)
    return 0 if result.passed else 1
