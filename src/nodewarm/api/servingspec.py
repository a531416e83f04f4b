"""The one serving spec: what vLLM is started with, as the compile-cache key sees it.

The renderer (vLLM's arguments, the publisher sidecar's), the node agent (restore) and the publisher (its key)
all take it from ``serving_spec``, so a setting that changes compilation can never reach vLLM without reaching
the key. Every engine setting is in it under vLLM's own flag name (``_`` and ``-`` are the same to vLLM's
parser, so ``--max_model_len`` and ``--max-model-len 4096`` are one setting): dtype, max-model-len, and every
``serving.extraArgs`` flag (quantization, compilation-config, ...) except the few that only change how the HTTP
server runs. TP is a field of its own. PP has no field (the profile schema has none): it comes from
``--pipeline-parallel-size`` in extraArgs, the only place it is set, so vLLM still gets it once, and the pod
requests TP x PP GPUs.

A flag the profile itself sets (model, TP, port, ...) is refused in extraArgs in any spelling: vLLM's parser lets
the last occurrence win, so a repeat would silently override the field (and ``--port``/``--host`` would break the
Service and the probes). "Any spelling" is vLLM's (0.32's server parser; tests/engine/test_vllm_argv.py holds this
module to it): ``_``/``-`` alike, a unique prefix of a long flag (argparse's abbreviations: ``--max-model=8`` is
``--max-model-len=8``), a dotted key into a JSON flag (``--model-loader-extra-config.concurrency=4`` replaces the
profile's loader config), its short options, and ``--config FILE`` (flags from a file nodewarm never sees).
``--enforce-eager`` is refused unless ``spec.serving.allowEager``; when allowed the key has ``enforce-eager=true``
(eager code is not the compiled code). How the renderer spells the flags for vLLM is nodewarm/nodeclasses/vllmargs.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

from .errors import ProfileError
from .podlayout import model_path
from .warmprofile import WarmProfile

FIELD = "spec.serving.extraArgs"
# vLLM's short options, each only as the whole token (argparse matches a single-dash option whole: "-tp2" is no
# spelling of -tp).
_SHORT = {"tp": "tensor-parallel-size", "pp": "pipeline-parallel-size", "dp": "data-parallel-size",
          "q": "quantization", "cc": "compilation-config"}
# -O is vLLM's own shorthand, rewritten by its parser before argparse sees it: -O3, -O=3 and -O 3 (0-3 only) are
# --optimization-level=3 (not a compilation-config level).
OPTIMIZATION_LEVEL = "optimization-level"
# Flags the rendered pod already passes (or whose job a profile field does): where to set each instead.
_PROFILE_SETS = {
    "model": "set spec.model.uri: vLLM serves the copy nodewarm put on the node's NVMe",
    "served-model-name": "the model is served under the profile's metadata.name; rename the profile",
    "tensor-parallel-size": "set spec.serving.tensorParallelSize",
    "max-model-len": "set spec.serving.maxModelLen",
    "dtype": "set spec.serving.dtype",
    "port": "set spec.serving.port (the Service and the probes use it)",
    "host": "remove it: vLLM listens on 0.0.0.0 so the Service and the kubelet's probes reach it",
    "load-format": "remove it: nodewarm loads the weights with runai_streamer from the node's NVMe",
    "model-loader-extra-config": "remove it: the streamer is tuned from spec.serving.chunkSizeGB and each "
                                 "model's sizeGB (concurrency)",
    # The pod requests TP x PP GPUs; data parallelism inside it would need more than it gets.
    "data-parallel-size": "scale out with spec.serving.replicas (one pod serves one data-parallel rank)",
    "config": "write the flags themselves into spec.serving.extraArgs: a config file's flags would reach vLLM "
              "without nodewarm seeing them (they could override the profile's, and the compile-cache key "
              "would not know them)",
}
# Passed to vLLM, never in its compile hash: how the HTTP server runs, and engine settings vLLM's own hash leaves
# out (prefix caching, the sampling seed, the memory fraction; tests/engine/test_engine_cachekey.py checks these against
# vLLM's hash). Keying on them would only keep nodes from sharing caches vLLM shares.
_SERVER_ONLY = frozenset({"api-key", "disable-log-requests", "enable-log-requests", "disable-log-stats",
                          "uvicorn-log-level", "disable-uvicorn-access-log", "ssl-keyfile", "ssl-certfile",
                          "ssl-ca-certs", "root-path", "allowed-origins", "allowed-methods", "allowed-headers",
                          "middleware", "chat-template", "response-role",
                          "enable-prefix-caching", "seed", "gpu-memory-utilization"})
EAGER = "enforce-eager"


@dataclass(frozen=True)
class ServingSpec:
    """How the model is served: everything in vLLM's config hash that the profile knows."""

    model: str                # the exact model string vLLM gets (an S3 URL and a local path differ)
    revision: str = ""
    tp: int = 1
    pp: int = 1
    image: str = ""           # serving image digest: pins torch/vllm/triton builds and install paths
    engine: Mapping[str, str] = field(default_factory=dict)  # dtype, max_model_len, compile sizes, ...


@dataclass(frozen=True)
class ExtraArg:
    """One ``serving.extraArgs`` flag: vLLM's long name (``-`` spelling up to a dotted key), its value, the tokens
    as written."""
    name: str
    value: str          # "true" for a bare --flag, "false" for --no-flag (and for those values, any case)
    tokens: tuple[str, ...]

    @property
    def flag(self) -> str:
        """The flag itself: ``compilation-config`` for ``--compilation-config.mode=3``."""
        return self.name.partition(".")[0]


def _value(text: str) -> str:
    """JSON values (compilation-config) in one canonical spelling; anything else as given."""
    try:
        return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return text


def _is_flag(tok: str) -> bool:
    """``--x`` and vLLM's short ``-O3``/``-tp``; ``-1`` is a value (a negative number)."""
    return tok.startswith("--") or (tok.startswith("-") and tok[1:2].isalpha())


def parse_extra_args(args: tuple[str, ...] | list[str]) -> list[ExtraArg]:
    """``--a_b=1``, ``--a-b 1`` -> ExtraArg("a-b", "1"); ``--flag`` -> "true"; ``--no-flag`` -> ("flag", "false");
    ``-tp 2`` / ``-O3``: vLLM's short spellings under their long names."""
    tokens = list(args)
    out: list[ExtraArg] = []
    i = 0
    while i < len(tokens):
        tok, start = tokens[i], i
        if not tok.startswith("-") or tok == "-":
            raise ProfileError(FIELD, tok, "each entry is a vLLM flag (--name=value or --name followed by its value)")
        if tok.startswith("--"):
            name, eq, value = tok[2:].partition("=")
        elif tok.startswith("-O"):
            name, eq, value = OPTIMIZATION_LEVEL, "=", tok[2:].removeprefix("=")
            if not value:
                if i + 1 < len(tokens) and tokens[i + 1] in ("0", "1", "2", "3"):
                    value, i = tokens[i + 1], i + 1
                else:
                    raise ProfileError(FIELD, tok, "-O takes its level: -O3 (or --optimization-level=3)")
        else:
            short, eq, value = tok[1:].partition("=")
            if short not in _SHORT:
                raise ProfileError(FIELD, tok, "use the long --flag spelling (vLLM's short options nodewarm knows: "
                                               + ", ".join(f"-{s}" for s in _SHORT) + ", -O<level>)")
            name = _SHORT[short]
        # vLLM's parser: "_" and "-" are one up to the first "."; after it comes a key of the flag's JSON value.
        head, dot, key = name.partition(".")
        name = head.replace("_", "-") + dot + key
        if not eq:
            if i + 1 < len(tokens) and not _is_flag(tokens[i + 1]):
                value, i = tokens[i + 1], i + 1
            elif name.startswith("no-"):
                name, value = name[3:], "false"
            else:
                value = "true"
        i += 1
        if value.lower() in ("true", "false"):
            value = value.lower()
        out.append(ExtraArg(name, value, tuple(tokens[start:i])))
    return out


def _abbreviates(name: str, flag: str) -> bool:
    """vLLM's parser (argparse, allow_abbrev) reads a unique prefix of a long flag as that flag."""
    return flag.startswith(name) and name != flag


def _eager_on(arg: ExtraArg) -> bool:
    v = arg.value.lower()
    if v not in ("true", "false"):
        raise ProfileError(FIELD, " ".join(arg.tokens), "--enforce-eager takes no value (or true/false)")
    return v == "true"


def checked_extra_args(p: WarmProfile) -> list[ExtraArg]:
    """``serving.extraArgs`` parsed, refusing every flag the profile sets itself and eager mode unless allowed."""
    parsed = parse_extra_args(p.serving.extra_args)
    for a in parsed:
        owned = next((f for f in _PROFILE_SETS if a.flag == f or _abbreviates(a.flag, f)), None)
        if owned:
            what = "sets" if owned == "config" else "already passes"
            raise ProfileError(FIELD, " ".join(a.tokens), f"nodewarm {what} --{owned}"
                               + (f" (vLLM reads --{a.flag} as --{owned})" if a.flag != owned else "")
                               + f"; {_PROFILE_SETS[owned]}")
        if _abbreviates(a.flag, EAGER):
            raise ProfileError(FIELD, " ".join(a.tokens), f"vLLM reads --{a.flag} as --{EAGER}: spell it out")
        if a.name == EAGER and _eager_on(a) and not p.serving.allow_eager:
            raise ProfileError(FIELD, " ".join(a.tokens),
                               "eager mode turns torch.compile off, so the compile cache nodewarm restores goes "
                               "unused; remove it, or set spec.serving.allowEager: true to serve eager anyway")
    return parsed


def eager(parsed: list[ExtraArg]) -> bool:
    """Whether vLLM runs eager: the last --enforce-eager / --no-enforce-eager wins, as in vLLM's parser."""
    flags = [a for a in parsed if a.name == EAGER]
    return bool(flags) and _eager_on(flags[-1])


def normalize_extra_args(parsed: list[ExtraArg]) -> dict[str, str]:
    """The engine settings of checked extraArgs as {flag: value} for the key: server-only flags left out, eager
    only when on (off is vLLM's default: the same compiled code as no flag at all)."""
    out = {a.name: _value(a.value) for a in parsed if a.name not in _SERVER_ONLY and a.name != EAGER}
    if eager(parsed):
        out[EAGER] = "true"
    return dict(sorted(out.items()))


def serving_spec(p: WarmProfile) -> ServingSpec:
    """The compile-cache key's serving spec for this profile (the model string is the path vLLM is started with)."""
    s = p.serving
    extra = normalize_extra_args(checked_extra_args(p))
    pp_text = extra.pop("pipeline-parallel-size", "1")
    if not pp_text.isdigit() or int(pp_text) < 1:
        raise ProfileError(FIELD, f"--pipeline-parallel-size={pp_text}", "a positive integer")
    engine = {"dtype": s.dtype, **extra}
    if s.max_model_len:
        engine["max-model-len"] = str(s.max_model_len)
    return ServingSpec(model=model_path(p.name), revision=p.model.revision or "", tp=s.tensor_parallel_size,
                       pp=int(pp_text), image=s.image, engine=dict(sorted(engine.items())))
