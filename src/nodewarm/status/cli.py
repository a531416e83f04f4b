"""The command: `nodewarm status [NODE]`, and its thin I/O shell.

It only reads: ``list`` on nodes, nodeclaims and warmprofiles, ``list`` on events in the namespace the controller
writes them to (``default``, where events about cluster-scoped objects go). ``RBAC_RULES`` is that ClusterRole's
rules (events need only a Role in ``default``). The kubernetes client is imported when the command runs, not when
`nodewarm --help` imports this module.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from nodewarm.api.names import NODEPOOL_LABEL

from .explain import explain
from .observed import Observed, named, owners
from .rows import rows
from .text import format_explanation, format_rows, held_notes

EVENTS_NAMESPACE = "default"                # where Node and NodeClaim events go (nodewarm/controller/events.py)

# What a user running `nodewarm status` needs, and nothing more (tests/status/test_status.py runs it with exactly this).
RBAC_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
    {"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": ["list"]},
    {"apiGroups": ["nodewarm.io"], "resources": ["warmprofiles"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},   # in `default` only: a Role is enough
]


def observe(api_client, node: str | None = None, profile: str | None = None) -> Observed:
    """List what `status` reads, paginated: the WarmProfiles, then only the Nodes and NodeClaims of their NodePools
    (a label selector: a 5,000-node cluster's other nodes are never sent). Events only for one node: they are
    the explanation's, not the table's."""
    from nodewarm.controller.kube import EVENTS, NODECLAIMS, NODES, WARMPROFILES, Kube

    k = Kube(api_client, request_timeout_s=60.0)

    def all_items(res, namespace=None, **q) -> list[dict]:
        items, cont = [], None
        while True:
            page = k.list(res, namespace, limit=500, **({"continue": cont} if cont else {}), **q)
            items += page.get("items") or []
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                return items

    profiles = all_items(WARMPROFILES)
    pools = sorted({p.node_pool for p in owners(Observed([], [], profiles)).values()
                    if not profile or p.name == profile})
    if not pools:
        return Observed(nodes=[], claims=[], profiles=profiles)
    selector = f"{NODEPOOL_LABEL} in ({','.join(pools)})"
    obs = Observed(nodes=all_items(NODES, labelSelector=selector), claims=all_items(NODECLAIMS, labelSelector=selector),
                   profiles=profiles)
    if node is not None:
        s = named(obs, node)
        names = {node} | ({s.node_name, s.claim_name} - {""} if s is not None else set())
        for name in sorted(names):
            obs.events.extend(all_items(EVENTS, EVENTS_NAMESPACE, fieldSelector=f"involvedObject.name={name}"))
    return obs


def run(args: argparse.Namespace) -> int:
    from kubernetes.client.exceptions import ApiException

    from nodewarm.api.errors import NodewarmError
    from nodewarm.controller import credentials   # here: `nodewarm --help` must not load the controller

    api = credentials.api_client(args.kubeconfig, in_cluster_first=False)
    try:
        obs = observe(api, args.node, args.profile)
    except ApiException as e:
        hint = " (needs list on nodes, nodeclaims, warmprofiles and events: see `nodewarm status --help`)" \
            if e.status in (401, 403) else ""
        raise NodewarmError(f"cannot read the cluster: {e.status} {e.reason}{hint}", "ApiError") from None
    now = time.time()
    if args.node:
        x = explain(obs, args.node, now)
        if x is None:
            print(f"nodewarm: no NodeClaim or Node named {args.node} in a WarmProfile's NodePool", file=sys.stderr)
            return 1
        print(json.dumps(x.to_dict(), indent=1) if args.output == "json" else format_explanation(x))
        return 0
    rs = rows(obs, now, args.profile)
    if args.profile and not any((p.get("metadata") or {}).get("name") == args.profile for p in obs.profiles):
        print(f"nodewarm: no WarmProfile named {args.profile}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps({"items": [r.to_dict() for r in rs]}, indent=1))
    elif not rs:
        print("No nodes of a WarmProfile's NodePool" + (f" (profile {args.profile})" if args.profile else "") + ".")
    else:
        print(format_rows(rs, wide=args.output == "wide"))
        for note in held_notes(rs, obs):
            print(f"\n{note}")
    return 0


EPILOG = """\
phases: Launching -> Registering -> Warming -> Warm -> Untainted(serving); past readiness.deadline:
DeadlineUntaint(cold) or DeadlineKeep; Failed (the agent reported Warm=False); Replacing (being deleted).
A node is Registering until Karpenter has registered it (karpenter.sh/unregistered gone, NodeClaim Registered=True),
even if it already reported Warm (reason WarmBeforeRegistration): the taint is lifted only after registration, which
merges the NodeClaim's startupTaints back. The phase follows the Node's taints as they are: a lifted taint put back
shows Warm (TaintReAdded) until the controller lifts it again.
WEIGHTS shows bytes done/total while the agent pulls (it writes them at most every 30s), the size once pulled.
CACHE: hit/miss once serving proves it, cold at warm time, restored while a restored bundle awaits proof.
A deleted WarmProfile whose clean-up is held (its startup taint stays in the NodePool while removing it would
replace live nodes) still gates its pool: its nodes show under it, and a note under the table says why and how
to finish (JSON: "cleanup" on each row).

examples:
  nodewarm status                               # every node of every WarmProfile
  nodewarm status --profile qwen3-35b -o wide   # + NodeClaim, instance type, generation, image, GPUs
  nodewarm status ip-10-0-7-12.ec2.internal     # one node: timeline, what it waits for, its Events
  nodewarm status -o json | jq '.items[] | select(.phase=="Warming")'

read-only; the identity needs (ClusterRole):
  nodes, nodeclaims.karpenter.sh, warmprofiles.nodewarm.io: list
  events: list in namespace default (only for `status NODE`)
"""


def register(sub) -> None:
    p = sub.add_parser("status", help="where each warming node stands (phase, weights, cache, deadline)",
                       description="Show each node of a WarmProfile's NodePool: its phase, how long it has been in "
                                   "it, weights progress, compile cache, reason and the deadline left; or explain "
                                   "one node. Reads the cluster only.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("node", nargs="?", help="a Node (or NodeClaim) name: explain that one")
    p.add_argument("--profile", "-p", help="only this WarmProfile's nodes")
    p.add_argument("-o", "--output", choices=("wide", "json"), help="wide: more columns; json: machine-readable")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster)")
    p.set_defaults(func=run)
