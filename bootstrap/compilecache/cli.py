"""CLI for compile caches: `nodewarm bootstrap compile-cache key|keygen|restore|verify-hit` and `nodewarm publish`.

Thin shells over cachekey / signing / restore / hitcheck / publish. bootstrap/cli.py calls
``register_bootstrap`` with the bootstrap subparsers and ``register_top`` with the top-level ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from nodewarm.errors import NodewarmError

from . import cachekey

RUNTIME_HELP = ("JSON written by `nodewarm bootstrap compile-cache key --runtime-only` inside the serving image "
                "(default: probe this process's torch/vllm/triton/GPU/CPU and environment)")

KEY_DESCRIPTION = """\
Print this node's compile-cache key: every factor (GPU name, CUDA, torch version and build hash,
triton, vllm version and path, python prefix, CPU vector ISA, model@revision, TP/PP, image digest,
vLLM engine flags, VLLM_*/TORCHINDUCTOR_* env), the readable S3 prefix and the key id.
Run with --runtime-only inside the serving image to capture the runtime for restore/publish --runtime.
"""

RESTORE_DESCRIPTION = """\
Restore the compile caches for this node's key from compileCache.uri. Verifies the ed25519
signature (--verify-key), every key factor, the archive's size and sha256 and every archive entry,
extracts into a staging dir and renames into place. Exit 0 both when restored and when compile will
be cold (the JSON says which, with a reason: CacheNotFound, CacheKeyMismatch, BundleUnsigned,
BundleTampered, UnsafeArchive, S3...); with --require, exit 1 when cold.
"""

VERIFY_DESCRIPTION = """\
After serving started: did it reuse the restored compile cache? Compares the cache dirs with the
baseline written by `restore --baseline-out` and reads vLLM's log (--log). Exit 0 hit, 3 miss,
4 unknown (no compile activity seen: is vLLM's cache dir the one given here? was --log given?).
"""

PUBLISH_DESCRIPTION = """\
Watch the compile-cache dirs (vLLM root, Inductor, Triton); when a compile has finished (new compiled
artifacts, then --quiet-seconds without file activity) pack them, sign them (--signing-key) and
upload once per key: first writer wins (If-None-Match: *, or a claim protocol on servers that
ignore preconditions). Exit 0 when published or when another node already published this key.
"""


def _add_spec(p: argparse.ArgumentParser, model_required: bool = True) -> None:
    g = p.add_argument_group("serving spec (what vLLM is started with)")
    g.add_argument("--model", required=model_required, help="the exact model string given to vLLM")
    g.add_argument("--revision", default="", help="model revision / version id")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    g.add_argument("--pp", type=int, default=1, help="pipeline-parallel size")
    g.add_argument("--image", default="", help="serving image digest (sha256:...)")
    g.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a vLLM flag that feeds its config hash (dtype, max_model_len, compile sizes...); repeatable")
    g.add_argument("--runtime", type=Path, help=RUNTIME_HELP)


def _add_dirs(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cache dirs (default: from VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, "
                                "TMPDIR and USER)")
    g.add_argument("--vllm-cache-root", type=Path, help="VLLM_CACHE_ROOT as the vLLM pod sees it on this node")
    g.add_argument("--inductor-dir", type=Path, help="TORCHINDUCTOR_CACHE_DIR, when set outside the vLLM root")
    g.add_argument("--triton-dir", type=Path, help="TRITON_CACHE_DIR, when set outside the vLLM root")
    g.add_argument("--pch-dir", type=Path, help="Inductor's precompiled headers: "
                   "$TMPDIR/torchinductor_$USER/precompiled_headers of the serving process")


def _dirs(args):
    from .bundle import CacheDirs

    given = CacheDirs(args.vllm_cache_root, args.inductor_dir, args.triton_dir, args.pch_dir)
    explicit = any((args.vllm_cache_root, args.inductor_dir, args.triton_dir, args.pch_dir))
    return given if explicit else CacheDirs.from_env(os.environ)


def _runtime(path: Path | None) -> tuple[cachekey.RuntimeProbe, dict[str, str]]:
    if path is None:
        return cachekey.probe_runtime(), cachekey.relevant_env(os.environ)
    try:
        doc = json.loads(path.read_text())
        return cachekey.probe_from_dict(doc["runtime"]), dict(doc["env"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise NodewarmError(f"--runtime {path}: {e}; write it with `compile-cache key --runtime-only`",
                            reason="InvalidRuntime") from None


def _spec(args) -> cachekey.ServingSpec:
    engine = {}
    for item in args.engine_arg:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise NodewarmError(f"--engine-arg {item!r} is not KEY=VALUE", reason="InvalidArgument")
        engine[k] = v
    return cachekey.ServingSpec(args.model, args.revision, args.tp, args.pp, args.image, engine)


def _factors(args) -> cachekey.Factors:
    probe, env = _runtime(args.runtime)
    return cachekey.build_factors(probe, _spec(args), env)


def _print(doc: dict) -> None:
    json.dump(doc, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


def _run_key(args) -> int:
    if args.runtime_only:
        _print({"runtime": dataclasses.asdict(cachekey.probe_runtime()), "env": cachekey.relevant_env(os.environ)})
        return 0
    if not args.model:
        raise NodewarmError("--model is required unless --runtime-only", reason="InvalidArgument")
    factors = _factors(args)
    root = ""
    if args.uri:
        from .cachestore import parse_uri

        root = parse_uri(args.uri).prefix
    prefix = cachekey.prefix(factors, root)
    _print({"prefix": prefix, "keyId": cachekey.key_id(factors), "factors": factors.to_dict()})
    return 0


def _run_keygen(args) -> int:
    from . import signing

    pair = signing.generate(args.out)
    _print({"signingKey": str(pair.private_path), "verifyKey": pair.public, "keyId": pair.key_id})
    return 0


def _run_restore(args) -> int:
    from . import hitcheck, restore

    probe, env = _runtime(args.runtime)
    result = restore.restore_for_node(args.uri, args.verify_key, _spec(args), _dirs(args), probe, env)
    if args.baseline_out:
        hitcheck.save_baseline(args.baseline_out, result.baseline, restored=result.status == "restored")
    if args.json:
        _print(result.to_dict())
    else:
        print(result.condition_message())
    if args.require and result.status != "restored":
        raise NodewarmError(result.message, reason=result.reason)
    return 0


def _run_verify_hit(args) -> int:
    from . import hitcheck

    baseline, restored = hitcheck.load_baseline(args.baseline)
    result = hitcheck.verify_hit(_dirs(args).roots(), baseline, restored=restored, log_path=args.log)
    if args.json:
        _print(result.to_dict())
    else:
        print(f"{result.status}: {result.reason}: {result.message}")
    return {"hit": 0, "miss": 3, "unknown": 4}[result.status]


def _run_publish(args) -> int:
    from . import publish, signing
    from .cachestore import CacheStore, parse_uri

    key = signing.load_private(args.signing_key)
    settings = publish.PublishSettings(quiet_s=args.quiet_seconds, timeout_s=args.timeout,
                                       settle_s=args.claim_settle_seconds)
    store = CacheStore(parse_uri(args.uri))
    factors, roots, producer = _factors(args), _dirs(args).roots(), publish.producer_info(os.environ)
    if args.now:
        result = publish.publish_once(store, roots, factors, key, producer, settings)
    else:
        result = publish.watch_and_publish(store, roots, factors, key, producer, settings)
    if args.json:
        _print(dataclasses.asdict(result))
    else:
        print(f"{result.status}: {result.message}")
    if result.status == "timeout":
        raise NodewarmError(result.message, reason="PublishTimeout")
    return 0


def register_bootstrap(bsub: argparse._SubParsersAction) -> None:
    cc = bsub.add_parser("compile-cache", help="compile caches: key, keygen, restore, verify-hit")
    sub = cc.add_subparsers(dest="cc_command", metavar="SUBCOMMAND", required=True)

    p = sub.add_parser("key", help="print this node's compile-cache key", description=KEY_DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runtime-only", action="store_true", help="print only the runtime probe and env (for --runtime)")
    p.add_argument("--uri", help="compileCache.uri, to print the full prefix")
    _add_spec(p, model_required=False)  # --runtime-only needs no model
    p.set_defaults(func=_run_key)

    p = sub.add_parser("keygen", help="create an ed25519 signing key; prints the verify key for the profile")
    p.add_argument("--out", type=Path, required=True, help="file to create (mode 0600) for the signing key")
    p.set_defaults(func=_run_keygen)

    p = sub.add_parser("restore", help="restore compile caches for this node's key", description=RESTORE_DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--uri", required=True, help="compileCache.uri: s3://BUCKET/PREFIX")
    p.add_argument("--verify-key", required=True, help="compileCache.verifyKey: base64 ed25519 key, PEM, or a file")
    p.add_argument("--baseline-out", type=Path, help="write the post-restore snapshot here, for verify-hit")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--require", action="store_true", help="exit 1 unless the cache was restored")
    _add_spec(p)
    _add_dirs(p)
    p.set_defaults(func=_run_restore)

    p = sub.add_parser("verify-hit", help="after serving starts: did it reuse the restored cache?",
                       description=VERIFY_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="file written by restore --baseline-out")
    p.add_argument("--log", type=Path, help="vLLM's log file (e.g. the pod's container log on the node)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_dirs(p)
    p.set_defaults(func=_run_verify_hit)


def register_top(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("publish", help="publish this node's compile caches once (first writer wins)",
                       description=PUBLISH_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--uri", required=True, help="compileCache.uri: s3://BUCKET/PREFIX")
    p.add_argument("--signing-key", required=True, type=Path, help="ed25519 private key file (PEM), from a secret")
    p.add_argument("--now", action="store_true", help="publish what is on disk now instead of watching")
    p.add_argument("--quiet-seconds", type=float, default=30.0, help="quiet period that ends a compile (default 30)")
    p.add_argument("--timeout", type=float, help="give up watching after this many seconds (default: never)")
    p.add_argument("--claim-settle-seconds", type=float, default=5.0,
                   help="claim protocol wait on servers without conditional writes (default 5)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_spec(p)
    _add_dirs(p)
    p.set_defaults(func=_run_publish)
