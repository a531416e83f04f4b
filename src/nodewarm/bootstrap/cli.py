"""`nodewarm bootstrap ...`: the node-side commands. Each subcommand is a thin shell over a library call:
`run` (agent_cli), `weights` (here), `compile-cache ...` and the top-level `publish` (compilecache.cli)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nodewarm.api.errors import NodewarmError

BOOTSTRAP_DESCRIPTION = """\
Node-side steps that warm a freshly scaled-up GPU node before the startup taint is lifted.
Run on the node (user data, bootstrap container or DaemonSet); each step is idempotent.
"""

WEIGHTS_DESCRIPTION = """\
Pull a model from S3 onto the node's NVMe instance store, verify every file, and prove the
safetensors parse (a header check of each; --stream-check: runai-model-streamer on one).

What it does, in order:
  1. DEST must be on NVMe instance storage: an md RAID0 of "Amazon EC2 NVMe Instance Storage" disks
     (AL2023: /mnt/k8s-disks/0, Bottlerocket / EKS Auto Mode: /mnt/.ephemeral) or one such disk.
     When DEST is under one of those mounts and it is not mounted yet, waits up to --mount-wait.
     On EBS or the root disk (Karpenter's silent fallback) it fails with NotInstanceStore, unless
     --allow-non-nvme (then the summary's storage.instance_store is false).
  2. Lists s3://BUCKET/PREFIX/ (every object; .bin/.pt/... copies are skipped when *.safetensors
     exist) and HEADs each object for ETag, VersionId and S3 checksums; an object's GETs (step 5)
     start as soon as its own HEAD is back.
  3. Plans against DEST/.nodewarm/manifest.json from earlier runs: unchanged files are not
     transferred; an object replaced at the same key (new ETag/VersionId) is fetched again; files of
     objects gone from S3, or of another model URI, and their partial downloads are deleted (never
     outside DEST, never through a symlink).
  4. Checks free space for the model plus headroom before writing a byte (InsufficientNVMe).
  5. Parallel ranged GETs across and within files into DEST/.nodewarm/partial/ (resumable per part:
     a part is resumed only if its bytes still match the CRC journaled with it), retries with backoff;
     each file is fsynced and verified (S3 checksum, else MD5 ETag) before it is renamed to its real
     name, and fetched again (up to 3 downloads) when it does not match. An object with neither
     (SSE-KMS without checksums) gets its SHA-256 recorded and is reported as NOT verified.
     Nothing half-written ever has a final name.
  6. As each *.safetensors lands: checks its header against its size (dtypes, shapes, offsets that
     tile the data exactly). With --stream-check (or --streamer-*) it also streams the first one through
     runai-model-streamer on the CPU, tuned like the vLLM pod's loader, and reports its read GB/s. The
     download already left every page in the page cache. No *.safetensors: fails (NoSafetensors).
A summary (per-phase seconds, bytes, throughput) is written to DEST/.nodewarm/summary.json.

Environment: the standard AWS variables, read by boto3: AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3),
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE, AWS_REGION or
AWS_DEFAULT_REGION, AWS_CA_BUNDLE; on EKS the node role or Pod Identity supplies credentials.

Exit status: 0 only when every object is present and verified in DEST (and loads, unless
--skip-load-check); 1 with a one-line "Reason: message" on stderr otherwise (reasons:
NotInstanceStore, InsufficientNVMe, S3AccessDenied, S3ObjectMissing, ObjectChanged, S3Unavailable,
VerifyFailed, NoSafetensors, LoadCheckFailed, LoadCheckUnavailable, LocalWriteFailed, UnsafePath,
InvalidModelSource);
2 for bad usage. A rerun with nothing changed transfers no object bytes.

Example:
  nodewarm bootstrap weights --uri s3://models/llama-3.1-8b/ --dest /mnt/k8s-disks/0/models/llama --json
"""


def _positive_int(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{s} is not a positive integer")
    return v


def _positive_float(s: str) -> float:
    v = float(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{s} is not a positive number")
    return v


def _add_weights(bsub) -> None:
    p = bsub.add_parser("weights", help="pull a model from S3 onto the NVMe RAID, verified and load-checked",
                        description=WEIGHTS_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--uri", required=True, help="s3://BUCKET/PREFIX/ holding the model files")
    p.add_argument("--dest", required=True, type=Path, help="directory on the NVMe instance store")
    p.add_argument("--allow-non-nvme", action="store_true",
                   help="proceed when DEST is not on NVMe instance storage (reported in the summary)")
    p.add_argument("--json", action="store_true", help="print the summary JSON on stdout (also on failure)")
    tune = p.add_argument_group("tuning (defaults derive from the model size)")
    tune.add_argument("--concurrency", type=_positive_int, help="parallel ranged GETs (default: from size, max 64)")
    tune.add_argument("--part-size-mib", type=_positive_int, help="bytes per ranged GET, MiB (default 8 or 16)")
    tune.add_argument("--request-timeout", type=_positive_float, default=120.0, metavar="S",
                      help="max seconds for one ranged GET (default 120)")
    tune.add_argument("--stall-timeout", type=_positive_float, default=10.0, metavar="S",
                      help="drop a connection that sends nothing for S seconds (default 10)")
    tune.add_argument("--low-speed-limit-mbps", type=float, default=1.0, metavar="MB/S",
                      help="drop a connection slower than this ... (default 1 MB/s)")
    tune.add_argument("--low-speed-time", type=_positive_float, default=10.0, metavar="S",
                      help="... for this many seconds (default 10)")
    tune.add_argument("--attempts", type=_positive_int, default=8, help="tries per request (default 8)")
    tune.add_argument("--headroom-gib", type=float, default=2.0,
                      help="free space to leave on the RAID beyond the model, at least (default 2 GiB)")
    tune.add_argument("--mount-wait", type=float, default=300.0, metavar="S",
                      help="seconds to wait for the NVMe mount to appear (default 300)")
    tune.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                      help="skip keys whose name or relative path match (repeatable)")
    tune.add_argument("--skip-load-check", action="store_true",
                      help="skip the header checks and the runai-model-streamer read")
    tune.add_argument("--stream-check", action="store_true",
                      help="also stream the first safetensors file through runai-model-streamer (needs torch); "
                           "implied by --streamer-*")
    tune.add_argument("--streamer-concurrency", type=_positive_int, metavar="N",
                      help="load check: the streamer concurrency the vLLM pod uses (model-loader-extra-config)")
    tune.add_argument("--streamer-chunk-bytes", type=_positive_int, metavar="BYTES",
                      help="load check: the vLLM pod's RUNAI_STREAMER_CHUNK_BYTESIZE")
    p.set_defaults(func=_run_weights)


def _weights_config(args: argparse.Namespace):
    # Here, not with the parser: `bootstrap run`, `compile-cache` and `--help` need no botocore to register.
    from .s3client import RetryPolicy
    from .weights import WeightsConfig
    from .weights.capacity import GiB, Headroom
    from .weights.loadcheck import StreamerTuning

    overrides: dict = {
        "request_timeout_s": args.request_timeout,
        "stall_timeout_s": args.stall_timeout,
        "low_speed_limit_bps": args.low_speed_limit_mbps * 1e6,
        "low_speed_time_s": args.low_speed_time,
        "retry": RetryPolicy(attempts=args.attempts),
    }
    if args.concurrency:
        overrides["concurrency"] = args.concurrency
    if args.part_size_mib:
        overrides["part_size"] = args.part_size_mib * 1024 * 1024
    return WeightsConfig(
        uri=args.uri, dest=args.dest, allow_non_nvme=args.allow_non_nvme, mount_wait_s=args.mount_wait,
        headroom=Headroom(minimum_bytes=int(args.headroom_gib * GiB)), pull_overrides=overrides,
        load_check=not args.skip_load_check, exclude=tuple(args.exclude),
        streamer=StreamerTuning(args.streamer_concurrency, args.streamer_chunk_bytes)
        if args.stream_check or args.streamer_concurrency or args.streamer_chunk_bytes else None,
    )


def _run_weights(args: argparse.Namespace) -> int:
    from .weights import warm_weights

    try:
        summary = warm_weights(_weights_config(args))
    except NodewarmError as e:
        if args.json and getattr(e, "summary", None) is not None:
            print(e.summary.to_json())
        raise
    if args.json:
        print(summary.to_json())
    else:
        print(f"nodewarm: {summary.message}", file=sys.stderr)
    return 0


def register(sub) -> None:
    from . import agent_cli
    from .compilecache import cli as cache_cli

    p = sub.add_parser("bootstrap", help="node-side warm-up: run (everything), weights, compile caches",
                       description=BOOTSTRAP_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = p.add_subparsers(dest="bootstrap_command", metavar="STEP")
    p.set_defaults(func=lambda _args: (p.print_help(), 2)[1])
    agent_cli.register_bootstrap(steps)
    _add_weights(steps)
    cache_cli.register_bootstrap(steps)
    cache_cli.register_top(sub)
