"""`nodewarm bootstrap run`: the whole node agent, as the systemd unit and the DaemonSet start it."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

from nodewarm.errors import NodewarmError

from .cli import _positive_int

RUN_DESCRIPTION = """\
Warm this node, then report it: pull and verify the weights onto the NVMe RAID (see
`bootstrap weights --help`), restore the compile caches for this node's key (see
`bootstrap compile-cache restore --help`), and set the Node condition nodewarm.io/Warm with the node's
own identity (NodeRestriction lets a node set its conditions, never its taints: the controller lifts
the startup taint when it sees Warm=True).

A compile-cache problem never fails the warm-up: the condition says "compile will be cold" and why.
A weights problem sets Warm=False with its reason (NotInstanceStore, InsufficientNVMe, S3...); so does a
bad argument (InvalidArgument) and any unexpected failure (InternalError, naming the exception type).
A launcher failure recorded before this start (artifact fetch, Python install: STATE_DIR/launch-failure)
is reported first. The outcome is also written to STATE_DIR/agent-result.json.

Credentials: S3 from the standard AWS environment (node role / Pod Identity on EKS). Kubernetes from
--kubeconfig, else $KUBECONFIG, else the kubelet's /var/lib/kubelet/kubeconfig (AL2023 host), else the
in-cluster ServiceAccount (DaemonSet). The node name: --node-name, else $NODE_NAME, else the hostname.

Exit status: 0 warm; 1 not warm (the reason is on stderr and in the condition); 2 bad usage.
"""

KUBELET_KUBECONFIG = "/var/lib/kubelet/kubeconfig"


def _api_client(kubeconfig: str | None):
    from kubernetes import client, config

    path = kubeconfig or os.environ.get("KUBECONFIG") or (KUBELET_KUBECONFIG if os.path.exists(KUBELET_KUBECONFIG) else None)
    if path:
        return config.new_client_from_config(config_file=path)
    config.load_incluster_config()
    return client.ApiClient()


def serving_spec(args: argparse.Namespace):
    """The key's serving spec from `bootstrap run` options: the model is the path vLLM reads, /models/<profile>."""
    from nodewarm.nodeclasses.podlayout import model_path

    from .compilecache import cachekey

    engine = dict(item.partition("=")[::2] for item in args.engine_arg)
    return cachekey.ServingSpec(model=model_path(args.profile), revision=args.revision, tp=args.tp,
                                image=args.image, engine=engine)


def _node_name(args: argparse.Namespace) -> str:
    return args.node_name or os.environ.get("NODE_NAME") or socket.gethostname()


def _agent_config(args: argparse.Namespace):
    from . import agent
    from .compilecache import cachekey
    from .weights.loadcheck import StreamerTuning

    runtime = None
    if args.runtime:
        try:
            doc = json.loads(Path(args.runtime).read_text())
            runtime = (cachekey.probe_from_dict(doc["runtime"]), dict(doc["env"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise NodewarmError(f"--runtime {args.runtime}: not the runtime JSON `compile-cache key --runtime-only` "
                                f"writes ({type(e).__name__}: {e})", reason="InvalidArgument") from None
    spec = serving_spec(args)
    cfg = agent.AgentConfig(
        profile=args.profile, model_uri=args.model_uri, dest=Path(args.dest), mount=Path(args.mount),
        node_name=_node_name(args),
        compile_cache_uri=args.compile_cache_uri, verify_key=args.verify_key, spec=spec,
        allow_non_nvme=args.allow_non_nvme, load_check=not args.skip_load_check, runtime=runtime,
        streamer=StreamerTuning(args.streamer_concurrency, args.streamer_chunk_bytes), state_dir=Path(args.state_dir),
    )
    dest = Path(args.dest).resolve()
    if not (dest == Path(args.mount).resolve() or Path(args.mount).resolve() in dest.parents):
        raise NodewarmError(f"--dest {args.dest} is not inside --mount {args.mount}: the weights must land on "
                            "the NVMe RAID", reason="InvalidArgument")
    return cfg


def _report_not_started(args: argparse.Namespace, e: Exception) -> None:
    """The agent could not even be configured: say so on the node (best effort) rather than stay silent."""
    from nodewarm import logs

    from .nodestatus import report_warm

    reason = e.reason if isinstance(e, NodewarmError) else "InternalError"
    message = f"the node agent did not start: {type(e).__name__}: {' '.join(str(e).split())}"
    try:
        report_warm(_api_client(args.kubeconfig), _node_name(args), False, reason, message)
    except Exception as unreported:  # noqa: BLE001 - the original failure is what gets raised
        logs.get("bootstrap.agent").error("agent.not_started_unreported", reason=reason, error=str(unreported))


def _run(args: argparse.Namespace) -> int:
    from . import agent

    try:
        cfg = _agent_config(args)
    except Exception as e:
        _report_not_started(args, e)
        raise
    result = agent.run(cfg, _api_client(args.kubeconfig))
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    if not result.warm:
        print(f"nodewarm: {result.reason}: {result.message}", file=sys.stderr)
        return 1
    return 0


def register_bootstrap(bsub) -> None:
    p = bsub.add_parser("run", help="the node agent: weights + compile caches, then report Warm on this node",
                        description=RUN_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", required=True, help="WarmProfile name (the vLLM pod reads /models/<profile>)")
    p.add_argument("--model-uri", required=True, help="s3://bucket/prefix/ of the model")
    p.add_argument("--dest", required=True, help="where the weights go: a directory inside --mount")
    p.add_argument("--mount", required=True, help="the NVMe RAID mount (/mnt/k8s-disks/0 or /mnt/.ephemeral)")
    p.add_argument("--mode", choices=["karpenter", "automode"], default="karpenter")
    p.add_argument("--region", help="AWS region (exported as AWS_REGION when set)")
    p.add_argument("--node-name", help="this node's name (default $NODE_NAME, else the hostname)")
    p.add_argument("--kubeconfig", help="credentials to report with (default: see above)")
    p.add_argument("--allow-non-nvme", action="store_true", help="warm even when --dest is not on NVMe instance store")
    p.add_argument("--skip-load-check", action="store_true",
                   help="skip the runai-model-streamer load check (hosts without torch, e.g. the AL2023 artifact)")
    p.add_argument("--json", action="store_true", help="print the result (weights summary, compile cache) as JSON")
    p.add_argument("--state-dir", default=os.environ.get("NODEWARM_STATE_DIR", "/var/lib/nodewarm"),
                   help="launcher failure records in, agent-result.json out (default $NODEWARM_STATE_DIR, "
                        "else /var/lib/nodewarm)")
    p.add_argument("--streamer-concurrency", type=_positive_int, metavar="N",
                   help="the load check's streamer concurrency: the vLLM pod's model-loader-extra-config value")
    p.add_argument("--streamer-chunk-bytes", type=_positive_int, metavar="BYTES",
                   help="the load check's RUNAI_STREAMER_CHUNK_BYTESIZE: the vLLM pod's value")
    g = p.add_argument_group("compile cache (the key must match the serving pod exactly)")
    g.add_argument("--compile-cache-uri", help="compileCache.uri")
    g.add_argument("--verify-key", help="compileCache.verifyKey (ed25519 public key, base64 or PEM or a file)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    g.add_argument("--revision", default="", help="model revision")
    g.add_argument("--image", default="", help="serving image (digest preferred)")
    g.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE", help="vLLM config flag; repeatable")
    g.add_argument("--runtime", help="the serving image's runtime JSON (`compile-cache key --runtime-only`)")

    def run_with_region(args):
        if args.region:
            os.environ.setdefault("AWS_REGION", args.region)
            os.environ.setdefault("AWS_DEFAULT_REGION", args.region)
        return _run(args)

    p.set_defaults(func=run_with_region)
