"""The one serving spec: what vLLM is started with, as the compile-cache key sees it.

The renderer (vLLM's arguments, the publisher sidecar's), the node agent (restore) and the publisher (its key)
all take it from ``serving_spec``, so a setting that changes compilation can never reach vLLM without reaching
the key. Every engine setting is in it under vLLM's own flag name (``_`` and ``-`` are the same to vLLM's
parser, so ``--max_model_len`` and ``--max-model-len 4096`` are one setting): dtype, max-model-len, and every
``serving.extraArgs`` flag (quantization, compilation-config, ...) except the few that only change how the HTTP
server runs. TP and PP are fields of their own; PP comes from ``--pipeline-parallel-size`` in extraArgs.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from nodewarm.errors import ProfileError
from nodewarm.profile import WarmProfile

from .podlayout import model_path

if TYPE_CHECKING:
    from nodewarm.bootstrap.compilecache.cachekey import ServingSpec

# vLLM's short spellings.
_SHORT = {"tp": "tensor-parallel-size", "pp": "pipeline-parallel-size", "dp": "data-parallel-size",
          "q": "quantization", "O": "compilation-config"}
# Flags with a field of their own: extraArgs may not set them a second time, differently.
_OWN_FIELD = {"model": "the profile's model", "tensor-parallel-size": "spec.serving.tensorParallelSize",
              "dtype": "spec.serving.dtype", "max-model-len": "spec.serving.maxModelLen"}
# Only how the HTTP server runs: never in vLLM's compile hash.
_SERVER_ONLY = frozenset({"host", "port", "served-model-name", "api-key", "disable-log-requests", "enable-log-requests",
                          "disable-log-stats", "uvicorn-log-level", "disable-uvicorn-access-log", "ssl-keyfile",
                          "ssl-certfile", "ssl-ca-certs", "root-path", "allowed-origins", "allowed-methods",
                          "allowed-headers", "middleware", "chat-template", "response-role"})
_DROPPED = frozenset({"enforce-eager"})     # the renderer never passes it (it turns torch.compile off)


def _value(text: str) -> str:
    """JSON values (compilation-config) in one canonical spelling; anything else as given."""
    try:
        return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return text


def normalize_extra_args(args: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``serving.extraArgs`` as {flag: value}: ``--a_b=1``, ``--a-b 1`` -> {"a-b": "1"}; ``--flag`` -> "true";
    ``--no-flag`` -> {"flag": "false"}. Server-only flags and ``--enforce-eager`` are left out."""
    tokens = list(args)
    out: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("-") or tok == "-":
            raise ProfileError("spec.serving.extraArgs", tok, "each entry is a vLLM flag (--name=value or --name "
                               "followed by its value)")
        name, eq, value = tok.lstrip("-").partition("=")
        if not tok.startswith("--"):
            # -O3 / -O.level=3 / -tp 2: vLLM's short spellings.
            short = next((s for s in sorted(_SHORT, key=len, reverse=True) if name.startswith(s)), None)
            if short is None:
                raise ProfileError("spec.serving.extraArgs", tok, "use the long --flag spelling")
            rest = name[len(short):]
            name = _SHORT[short]
            if rest and not eq:
                value, eq = (json.dumps({"level": int(rest)}) if short == "O" and rest.isdigit() else rest), "="
        name = name.replace("_", "-")
        if not eq:
            if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                value, i = tokens[i + 1], i + 1
            elif name.startswith("no-"):
                name, value = name[3:], "false"
            else:
                value = "true"
        i += 1
        if name in _SERVER_ONLY or name in _DROPPED:
            continue
        out[name] = _value(value)
    return dict(sorted(out.items()))


def serving_spec(p: WarmProfile) -> "ServingSpec":
    """The compile-cache key's serving spec for this profile (the model string is the path vLLM is started with)."""
    from nodewarm.bootstrap.compilecache.cachekey import ServingSpec

    s = p.serving
    extra = normalize_extra_args(s.extra_args)
    for flag, field in _OWN_FIELD.items():
        if flag in extra:
            raise ProfileError("spec.serving.extraArgs", f"--{flag}={extra[flag]}",
                               f"set it with {field} instead (extraArgs would start vLLM with it twice)")
    pp_text = extra.pop("pipeline-parallel-size", "1")
    if not pp_text.isdigit() or int(pp_text) < 1:
        raise ProfileError("spec.serving.extraArgs", f"--pipeline-parallel-size={pp_text}", "a positive integer")
    engine = {"dtype": s.dtype, **extra}
    if s.max_model_len:
        engine["max-model-len"] = str(s.max_model_len)
    return ServingSpec(model=model_path(p.name), revision=p.model.revision or "", tp=s.tensor_parallel_size,
                       pp=int(pp_text), image=s.image, engine=dict(sorted(engine.items())))


def spec_args(spec: "ServingSpec") -> tuple[str, ...]:
    """A spec as `nodewarm publish` / `compile-cache key|restore` options (their _spec reads it back whole)."""
    args = ["--model", spec.model, "--tp", str(spec.tp), "--pp", str(spec.pp)]
    for k, v in sorted(spec.engine.items()):
        args += ["--engine-arg", f"{k}={v}"]
    if spec.revision:
        args += ["--revision", spec.revision]
    if spec.image:
        args += ["--image", spec.image]
    return tuple(args)
