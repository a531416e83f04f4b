"""vLLM's and the publisher's command lines, as the renderer spells them from the serving spec (api.servingspec).

vLLM gets each extraArgs flag as one token, ``--name=value`` (``--name``/``--no-name`` for true/false): a value
written as the next token can then never be read as vLLM's positional model argument instead
(``--enable-prefix-caching false`` is, to vLLM, prefix caching on and the model "false"). ``--enforce-eager``, when
allowed, reaches vLLM as exactly ``--enforce-eager``.
"""

from __future__ import annotations

from nodewarm.api.servingspec import EAGER, ExtraArg, ServingSpec, checked_extra_args, eager
from nodewarm.api.warmprofile import WarmProfile


def spelled(arg: ExtraArg) -> str:
    """The one token vLLM gets: ``--name=value``, or ``--name``/``--no-name`` for true/false (vLLM's boolean
    flags take no value: ``--enable-prefix-caching=true`` is an error to it)."""
    if arg.value in ("true", "false") and "." not in arg.name:
        return f"--{arg.name}" if arg.value == "true" else f"--no-{arg.name}"
    return f"--{arg.name}={arg.value}"


def vllm_extra_args(p: WarmProfile) -> list[str]:
    """The extraArgs as vLLM gets them: one token per flag (``spelled``), except eager mode, spelled the one
    way every vLLM parses and only when on (``--no-enforce-eager`` is unknown to old ones)."""
    parsed = checked_extra_args(p)
    out = [spelled(a) for a in parsed if a.name != EAGER]
    return out + (["--enforce-eager"] if eager(parsed) else [])


def spec_args(spec: ServingSpec) -> tuple[str, ...]:
    """A spec as `nodewarm publish` / `compile-cache key|restore` options (their _spec reads it back whole)."""
    args = ["--model", spec.model, "--tp", str(spec.tp), "--pp", str(spec.pp)]
    for k, v in sorted(spec.engine.items()):
        args += ["--engine-arg", f"{k}={v}"]
    if spec.revision:
        args += ["--revision", spec.revision]
    if spec.image:
        args += ["--image", spec.image]
    return tuple(args)
