"""CLI for compile caches: `nodewarm bootstrap compile-cache key|keygen|restore|verify-hit` and `nodewarm publish`.

(Over 300 lines: the argparse front end of every compile-cache command, mostly descriptions and flags; the commands
share their flags (the serving spec, --runtime, the cache folders) and the spec and key builders here, each command
a few lines over them.)

Thin shells over cachekey / signing / restore / hitcheck / publish. nodewarm/bootstrap/cli.py calls
``register_bootstrap`` with the bootstrap subparsers and ``register_top`` with the top-level ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from nodewarm.api.errors import NodewarmError
from nodewarm.api.servingspec import ServingSpec

# cachekey where it runs: `bootstrap run` registers these parsers too, and its start-up is on the critical path.
if TYPE_CHECKING:
    from . import cachekey

RUNTIME_HELP = ("JSON written by `nodewarm bootstrap compile-cache key --runtime-only` inside the serving image "
                "(key/publish default: probe this process, which must be the serving image; restore default: the "
                "image's signed runtime descriptor in the bucket)")

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
    h = p.add_argument_group("this node's hardware (always read here: GPU from NVML, /proc/driver/nvidia or the "
                             "Node's labels; CPU ISA from /proc/cpuinfo)")
    h.add_argument("--host-root", type=Path, default=Path("/"), help="where the host's /proc is (default /)")
    h.add_argument("--node-label", action="append", default=[], metavar="KEY=VALUE",
                   help="a label of this Node (node.kubernetes.io/instance-type, karpenter.k8s.aws/instance-gpu-name, "
                        "nvidia.com/gpu.product...); repeatable")


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


def _runtime(path: Path | None) -> tuple[cachekey.RuntimeProbe, dict[str, str]] | None:
    """The serving runtime from --runtime; None when not given."""
    from . import cachekey

    if path is None:
        return None
    try:
        doc = json.loads(path.read_text())
        return cachekey.probe_from_dict(doc["runtime"]), dict(doc["env"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise NodewarmError(f"--runtime {path}: {e}; write it with `compile-cache key --runtime-only`",
                            reason="InvalidRuntime") from None


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise NodewarmError(f"{flag} {item!r} is not KEY=VALUE", reason="InvalidArgument")
        out[k] = v
    return out


def _spec(args) -> ServingSpec:
    return ServingSpec(args.model, args.revision, args.tp, args.pp, args.image,
                                _pairs(args.engine_arg, "--engine-arg"))


def _factors(args) -> tuple[cachekey.Factors, cachekey.RuntimeProbe]:
    """Key factors where this process is the serving image (key, publish): its software, this node's hardware."""
    from . import cachekey, hardware

    probe, env = _runtime(args.runtime) or (cachekey.probe_runtime(), cachekey.serving_env(os.environ))
    hw = hardware.probe(args.host_root, _pairs(args.node_label, "--node-label"), env)
    return cachekey.build_factors(probe, hw, _spec(args), env), probe


def _print(doc: dict) -> None:
    json.dump(doc, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


def _run_key(args) -> int:
    from . import cachekey

    if args.runtime_only:
        _print({"runtime": dataclasses.asdict(cachekey.probe_runtime()), "env": cachekey.serving_env(os.environ)})
        return 0
    if not args.model:
        raise NodewarmError("--model is required unless --runtime-only", reason="InvalidArgument")
    factors, _ = _factors(args)
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

    result = restore.restore_for_node(args.uri, args.verify_key, _spec(args), _dirs(args), _runtime(args.runtime),
                                      host_root=args.host_root,
                                      node_labels=_pairs(args.node_label, "--node-label"))
    if args.baseline_out:
        hitcheck.save_baseline(args.baseline_out, result.as_baseline())
    if args.json:
        _print(result.to_dict())
    else:
        print(result.condition_message())
    if args.require and result.status != "restored":
        raise NodewarmError(result.message, reason=result.reason)
    return 0


def _run_verify_hit(args) -> int:
    from . import hitcheck

    baseline = hitcheck.load_baseline(args.baseline)
    result = hitcheck.verify_hit(_dirs(args).roots(), baseline.snapshot, restored=baseline.restored, log_path=args.log)
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
    (factors, probe), roots, producer = _factors(args), _dirs(args).roots(), publish.producer_info(os.environ)
    if args.ready_url:
        return _prove_and_publish(args, store, roots, factors, key, producer, settings, probe)
    if args.now:
        result = publish.publish_once(store, roots, factors, key, producer, settings, runtime=probe)
    else:
        result = publish.watch_and_publish(store, roots, factors, key, producer, settings, runtime=probe)
    if args.json:
        _print(dataclasses.asdict(result))
    else:
        print(f"{result.status}: {result.message}")
    if result.status == "timeout":
        raise NodewarmError(result.message, reason="PublishTimeout")
    return 0


def _prove_and_publish(args, store, roots, factors, key, producer, settings, probe) -> int:
    from . import hitcheck, servedcheck

    if args.baseline and args.baseline.is_file():
        baseline = hitcheck.load_baseline(args.baseline)
    else:       # the agent restored nothing here (no compile cache configured when it warmed): a cold node
        baseline = hitcheck.Baseline(hitcheck.snapshot(roots), False, "NoBaseline")
    report = None
    if args.node_name:
        from nodewarm.bootstrap.kubeconn import agent_api
        from nodewarm.bootstrap.nodestatus import report_compile_cache

        api = agent_api(args.kubeconfig)

        def report(outcome: str, reason: str, _message: str) -> None:
            report_compile_cache(api, args.node_name, outcome, reason)
    result = servedcheck.prove_and_publish(store, roots, factors, key, producer, baseline,
                                           servedcheck.http_ready(args.ready_url), settings, report, probe,
                                           started_from=lambda: _start_path(args.start_record))
    doc = {"outcome": result.outcome, "reason": result.reason, "message": result.message,
           "verdict": result.verdict.to_dict() if result.verdict else None,
           "published": dataclasses.asdict(result.published) if result.published else None}
    if args.json:
        _print(doc)
    else:
        print(f"{result.outcome}: {result.reason}: {result.message}")
    if result.outcome is None:
        raise NodewarmError(result.message, reason="PublishTimeout")
    return 0


def _start_path(record: Path | None) -> str | None:
    """Where vLLM's start script loaded the model from (local | s3 | None: no record, e.g. an older image)."""
    if record is None:
        return None
    try:
        return json.loads(record.read_text()).get("path")
    except (OSError, ValueError, AttributeError):
        return None


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
    p.add_argument("--ready-url", help="vLLM's health URL: once it answers, prove hit/miss against --baseline, "
                   "report it on the Node and republish on a miss (instead of waiting for a compile)")
    p.add_argument("--baseline", type=Path, help="the snapshot the node agent saved after its restore")
    p.add_argument("--start-record", type=Path,
                   help="the vLLM start script's record (JSON, path local|s3): a cold start (s3) is reported cold "
                        "and proves and publishes nothing")
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                   help="this Node, to record hit|miss|cold on (default $NODE_NAME)")
    p.add_argument("--kubeconfig", help="credentials for the Node write (default: $KUBECONFIG, else in-cluster)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_spec(p)
    _add_dirs(p)
    p.set_defaults(func=_run_publish)
