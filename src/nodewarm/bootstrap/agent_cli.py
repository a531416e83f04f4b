"""`nodewarm bootstrap run`: the whole node agent, as the systemd unit and the DaemonSet start it."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

from nodewarm.api import snapshot
from nodewarm.api.agentpod import NODE_NAME_ENV, own_pod
from nodewarm.api.errors import NodewarmError

RUN_DESCRIPTION = """\
The node agent. Reads the WarmProfile named by --profile from the cluster (model, serving image, TP,
compile cache, region: none of it is in the node's user data, so changing it replaces no node), then
warms this node: pull and verify the weights onto the NVMe RAID (see `bootstrap weights --help`),
restore the compile caches for this node's key (see `bootstrap compile-cache restore --help`), label
the Node nodewarm.io/generation=<what it holds> and set the condition nodewarm.io/Warm with the
node's own identity (NodeRestriction lets a node set its conditions and labels, never its taints: the
controller lifts the startup taint when it sees Warm=True).

Then it keeps following the profile: a new generation (model, serving image, engine settings,
compile cache) is warmed on this node beside the old one when the NVMe has room, otherwise once no
pod of the old generation runs here; then the label moves and the rendered Deployment's rolling
update lands new pods here. --once warms and exits instead.

A compile-cache problem never fails the warm-up: the condition says "compile will be cold" and why.
A weights problem sets Warm=False with its reason (NotInstanceStore, InsufficientNVMe, S3...);
ProfileNotFound / InvalidProfile / ProfileForbidden when the profile cannot be read; any unexpected
failure InternalError, naming the exception type. A launcher failure recorded before this start
(artifact fetch, sha256, architecture, glibc: STATE_DIR/launch-failure) is reported first. The outcome is also
written to STATE_DIR/agent-result.json.

Credentials: Kubernetes from --kubeconfig, else $KUBECONFIG, else the kubelet's
/var/lib/kubelet/kubeconfig (AL2023 host), else the in-cluster ServiceAccount (DaemonSet); it needs
get/watch on warmprofiles (`nodewarm render` emits that RBAC). S3 from the standard AWS environment
(node role / Pod Identity on EKS); the region from spec.nodes.region, else the Node's
topology.kubernetes.io/region label, else instance metadata. The node name: --node-name, else
$NODE_NAME, else the hostname. In the DaemonSet's pod, $POD_NAMESPACE, $POD_NAME and $POD_UID name that
pod: it mounts the whole NVMe root, and the agent does not count it as a pod using the models there.

Exit status (--once): 0 warm; 1 not warm (the reason is on stderr and in the condition); 2 bad usage.
Without --once it runs until stopped.
"""


def _node_name(args: argparse.Namespace) -> str:
    return args.node_name or os.environ.get(NODE_NAME_ENV) or socket.gethostname()


def _follow_options(args: argparse.Namespace):
    from .followplan import FollowOptions

    runtime = None
    if args.runtime:
        from .compilecache import cachekey

        try:
            doc = json.loads(Path(args.runtime).read_text())
            runtime = (cachekey.probe_from_dict(doc["runtime"]), dict(doc["env"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise NodewarmError(f"--runtime {args.runtime}: not the runtime JSON `compile-cache key --runtime-only` "
                                f"writes ({type(e).__name__}: {e})", reason="InvalidArgument") from None
    # The DaemonSet's pod (its downward-API env): it mounts the whole NVMe root, and is no user of the models there.
    return FollowOptions(profile=args.profile, mount=Path(args.mount), node_name=_node_name(args),
                         load_check=not args.skip_load_check, stream_check=args.stream_check,
                         allow_non_nvme=args.allow_non_nvme,
                         runtime=runtime, once=args.once, state_dir=Path(args.state_dir),
                         gpu_wait_s=args.gpu_wait_seconds, agent_pod=own_pod(os.environ),
                         snapshot_runc_root=args.snapshot_runc_root, snapshot_criu=args.snapshot_criu)


def _report_not_started(args: argparse.Namespace, e: Exception) -> None:
    """The agent could not even be configured: say so on the node (best effort) rather than stay silent."""
    from nodewarm import logs

    from .kubeconn import agent_api
    from .nodestatus import report_warm

    reason = e.reason if isinstance(e, NodewarmError) else "InternalError"
    message = f"the node agent did not start: {type(e).__name__}: {' '.join(str(e).split())}"
    try:
        report_warm(agent_api(args.kubeconfig), _node_name(args), False, reason, message)
    except Exception as unreported:  # noqa: BLE001 - the original failure is what gets raised
        logs.get("bootstrap.agent").error("agent.not_started_unreported", reason=reason, error=str(unreported))


def _run(args: argparse.Namespace) -> int:
    import signal
    import threading

    from .follow import Follower
    from .kubeconn import agent_api

    try:
        opts = _follow_options(args)
    except Exception as e:
        _report_not_started(args, e)
        raise
    stop = threading.Event()

    def terminate(signum, _frame):
        # The pod is being deleted or the unit stopped: leave now, even from a blocking watch read. Files are
        # only ever renamed into place once verified, so nothing half-written is left behind.
        stop.set()
        raise SystemExit(0)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, terminate)
    follower = Follower(agent_api(args.kubeconfig), opts, stop)
    rc = follower.run()
    result = follower.last
    if args.json and result is not None:
        json.dump({**result.to_dict(), "generation": follower.held.generation if follower.held else None},
                  sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    if rc and result is not None and not result.warm:
        print(f"nodewarm: {result.reason}: {result.message}", file=sys.stderr)
    return rc


def register_bootstrap(bsub) -> None:
    p = bsub.add_parser("run", help="the node agent: weights + compile caches, then report Warm on this node",
                        description=RUN_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", required=True, help="the WarmProfile to warm for and follow")
    p.add_argument("--mount", required=True, help="the NVMe RAID mount (/mnt/k8s-disks/0 or /mnt/.ephemeral)")
    p.add_argument("--node-name", help="this node's name (default $NODE_NAME, else the hostname)")
    p.add_argument("--kubeconfig", help="credentials (default: see above)")
    p.add_argument("--once", action="store_true", help="warm once, report, and exit (no following)")
    p.add_argument("--allow-non-nvme", action="store_true", help="warm even when the mount is not NVMe instance store")
    p.add_argument("--skip-load-check", action="store_true",
                   help="skip the load check (each safetensors file's header checked against its size)")
    p.add_argument("--stream-check", action="store_true",
                   help="also stream the first safetensors file through runai-model-streamer with the vLLM pod's "
                        "settings (needs torch; the checksums and header checks already prove the bytes and format)")
    p.add_argument("--json", action="store_true", help="with --once: print the result (weights, compile cache) as JSON")
    p.add_argument("--runtime", help="the serving image's runtime JSON (`compile-cache key --runtime-only`)")
    p.add_argument("--state-dir", default=os.environ.get("NODEWARM_STATE_DIR", "/var/lib/nodewarm"),
                   help="launcher failure records in, agent-result.json out (default $NODEWARM_STATE_DIR, "
                        "else /var/lib/nodewarm)")
    p.add_argument("--snapshot-runc-root", default=snapshot.RUNC_ROOT, metavar="DIR",
                   help="with spec.serving.snapshot: runc's state root of containerd's CRI containers, where the "
                        "agent checkpoints the engine check's vLLM (default: AL2023's, %(default)s)")
    p.add_argument("--snapshot-criu", default=snapshot.CRIU_PATH, metavar="PATH",
                   help="with spec.serving.snapshot: CRIU >= 4.2 on this node (default %(default)s; without it no "
                        "snapshot is taken and the serving pod boots)")
    p.add_argument("--gpu-wait-seconds", type=float, default=None, metavar="S",
                   help="how long Warm waits (from the agent's start, beside the weights) for the Node to advertise "
                        "the nvidia.com/gpu the vLLM pod requests (default 180); past it the node reports Warm with a "
                        "GpusNotAdvertised warning: its device plugin most likely does not tolerate the startup taint")
    p.set_defaults(func=_run)
