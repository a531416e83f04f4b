"""`nodewarm controller`: run the in-cluster controller (or audit what it would do)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from . import credentials

HELP = """\
Watch NodeClaims, Nodes, NodePools, NodeClasses and WarmProfiles, and for every NodePool bound to a
WarmProfile:
  inject    server-side apply (field manager "nodewarm") of only nodewarm's fields: EC2NodeClass
            instanceStorePolicy RAID0 + the bootstrap user-data part merged with your own MIME parts,
            or the Auto Mode NodeClass ephemeralStorage.size, and the NodePool startup taint.
            Applied only when something differs (a change to userData/instanceStorePolicy drifts
            every node of the class, so it converges once and never flaps).
  gate      when a node reports condition nodewarm.io/Warm=True, remove only the readiness taint
            (guarded JSON patch) and label the node with its profile, model and compile-cache result.
  deadline  past spec.readiness.deadline (>= 1m) without Warm, after re-reading the node live: untaint
            (label cold and the profile's generation: the vLLM pod lands and streams from S3 or waits
            for the node's copy), replace (delete the NodeClaim; at most --replace-budget per NodePool per
            --replace-window-seconds, backing off exponentially, never for failures a new node would
            repeat such as NotInstanceStore) or keep (record + event; a late Warm still lifts the taint),
            per spec.readiness.onDeadline.
  devices   DaemonSets that are device plugins (they mount /var/lib/kubelet/device-plugins) and may
            run on the profile's nodes must tolerate the startup taint, or the node advertises no GPUs
            before the lift: condition DevicePluginsTolerate on the WarmProfile, with the DaemonSet named.
Every decision is a Kubernetes Event on the Node and the NodeClaim, a log line and a metric; what
was decided is recorded on the Node (annotation nodewarm.io/state), so a restart does nothing twice.

examples:
  nodewarm controller --kubeconfig ~/.kube/config --dry-run --once   # audit: what would change, then exit
  nodewarm controller --leader-elect --lease-namespace nodewarm      # in the cluster (2 replicas)
  nodewarm controller --profile profile.yaml                         # profiles from files, no CRD needed
"""


def register(sub) -> None:
    p = sub.add_parser("controller", help="run the controller: inject NodeClass fields, lift taints of warm nodes",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster ServiceAccount, else $KUBECONFIG or "
                                        "~/.kube/config)")
    p.add_argument("--profile", action="append", default=[], metavar="FILE",
                   help="a WarmProfile YAML file to serve in addition to WarmProfile objects (repeatable)")
    p.add_argument("--no-watch-profiles", action="store_true",
                   help="do not watch warmprofiles.nodewarm.io objects (use only --profile files)")
    p.add_argument("--dry-run", action="store_true",
                   help="audit mode: log what would be applied or decided, write nothing (no events either)")
    p.add_argument("--once", action="store_true",
                   help="reconcile everything once, print a JSON summary on stdout, exit (no leader election)")
    p.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0: any free port; "
                                                                  "-1: off; default 8080)")
    p.add_argument("--health-port", type=int, default=8081, help="/healthz and /readyz port (0: any; -1: off; "
                                                                 "default 8081)")
    p.add_argument("--bind-address", default="0.0.0.0", help="address the HTTP endpoints listen on")
    p.add_argument("--leader-elect", action="store_true",
                   help="take part in leader election on a coordination.k8s.io Lease: run 2 replicas, one acts")
    p.add_argument("--lease-namespace", default="nodewarm", help="namespace of the Lease (default nodewarm)")
    p.add_argument("--lease-name", default="nodewarm-controller", help="name of the Lease")
    p.add_argument("--identity", help="this replica's name in the Lease (default: hostname + random suffix)")
    p.add_argument("--workers", type=int, default=4, help="NodeClaims reconciled concurrently (default 4)")
    p.add_argument("--instance-source", choices=("offline", "ec2"), default="offline",
                   help="where NVMe sizes for Auto Mode ephemeralStorage come from (default: built-in table)")
    p.add_argument("--replace-budget", type=int, default=3,
                   help="onDeadline=replace: most NodeClaims replaced per NodePool per window (default 3); when "
                        "spent, the WarmProfile shows ReplacementsPaused=True")
    p.add_argument("--replace-window-seconds", type=float, default=3600.0,
                   help="the replace budget's window (default 3600)")
    p.add_argument("--resync-seconds", type=float, default=300.0, help="re-check everything this often (default 300)")
    p.add_argument("--watch-timeout-seconds", type=int, default=300,
                   help="server-side watch timeout; watches resume from the last resourceVersion (default 300)")
    p.set_defaults(func=run)


def options_from(args: argparse.Namespace):
    from nodewarm import profile

    from .options import ControllerOptions

    port = lambda v: None if v < 0 else v  # noqa: E731
    kw = dict(dry_run=args.dry_run, workers=max(1, args.workers), leader_elect=args.leader_elect and not args.once,
              lease_namespace=args.lease_namespace, lease_name=args.lease_name,
              metrics_port=port(args.metrics_port), health_port=port(args.health_port), bind_address=args.bind_address,
              profiles=tuple(profile.load(f) for f in args.profile), watch_profiles=not args.no_watch_profiles,
              watch_timeout_s=args.watch_timeout_seconds, resync_s=args.resync_seconds,
              replace_budget=max(0, args.replace_budget), replace_window_s=args.replace_window_seconds,
              instance_source=args.instance_source)
    if args.identity:
        kw["identity"] = args.identity
    return ControllerOptions(**kw)


def run(args: argparse.Namespace) -> int:
    from .manager import Controller

    opts = options_from(args)
    if args.once:
        opts = type(opts)(**{**opts.__dict__, "metrics_port": None, "health_port": None})
    ctl = Controller(credentials.api_client(args.kubeconfig, in_cluster_first=True), opts)
    if args.once:
        summary = ctl.run_once()
        json.dump(summary, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    ctl.run_until(stop)
    return 0
