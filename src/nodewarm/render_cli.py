"""`nodewarm render`: a WarmProfile -> the Kubernetes objects (and IAM policy) that make nodes warm.

A front end, as `nodewarm status` is: besides the renderer (nodewarm.nodeclasses) it prints the controller's own
objects (--with-controller, nodewarm.controller.manifests) and reads the live cluster (--diff, livediff.py), so it
sits above both; the renderer itself imports neither.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nodewarm import instancetypes, profile
from nodewarm.api import models
from nodewarm.api.errors import NodewarmError, ProfileError
from nodewarm.api.names import CONTROLLER_NAMESPACE
from nodewarm.api.warmprofile import WarmProfile
from nodewarm.nodeclasses import crdvalidate
from nodewarm.nodeclasses.render import render
from nodewarm.nodeclasses.yamldocs import dump_all
from nodewarm.sizing import GB

HELP = """\
Render everything one WarmProfile needs, as multi-document YAML for `kubectl apply --server-side -f -`:

  karpenter mode : WarmProfile, EC2NodeClass (instanceStorePolicy: RAID0, AL2023 alias, userData with the
                   bootstrap unit merged into your own parts), NodePool (startupTaints), vLLM Deployment+Service
  automode       : WarmProfile, NodeClass (ephemeralStorage.size below every allowed type's NVMe), NodePool,
                   the bootstrap DaemonSet, vLLM Deployment+Service

With spec.readiness.engineCheck: also the check pod's PodTemplate and a Role + RoleBinding that let the controller
(its ServiceAccount in --controller-namespace) create pods from it, both in the serving namespace.
With spec.serving.snapshot (AL2023): also the RuntimeClass nodewarm-snapshot, which the serving pod and the check pod
name, and user data that installs its runtime handler in containerd (docs/snapshots.md); changing it rolls the pool.

IAM policies, one per principal (agent: reader of the model, compile-cache and artifact prefixes, on the
node role for the AL2023 host agent or the DaemonSet's role; publisher: writer of the compile-cache prefix
only, conditional writes for envelopes), are written to DIR/iam-<principal>-policy.json with -o, or printed
with --iam. With spec.aws.identity podIdentity the association commands are printed (-o: a script).
Instance NVMe/GPU facts come from a built-in table, or from EC2 DescribeInstanceTypes with
--instance-source ec2 (uses the standard AWS environment).
When spec.model.sizeGB is omitted, --measure lists the S3 prefix (standard AWS environment) to size it.

Drift preview (nothing is applied): --diff reads the live cluster (--kubeconfig, else $KUBECONFIG /
~/.kube/config, as `nodewarm status` does) and prints, for the NodePool and NodeClass this profile renders,
every live NodeClaim the apply would drift and why: the hash Karpenter stamped on it against the object's
once the rendered fields land (NodePoolDrifted, NodeClassDrift), and the pool's requirements against its labels
(RequirementsDrifted). Karpenter replaces drifted nodes within the pool's disruption budgets. The controller's
WouldDrift guard gives the same answer (one function, karpenter/driftpreview.py).

Other profiles of the cluster (--also FILE, repeatable; checked, not rendered): two profiles may not claim the
same model (/models/<name>, its Service and Node label; <profile>-<name> for each of spec.models) or the same
NodePool; the later file's field is named. Many models on one pool's nodes go in one profile's spec.models.

Schema check: every NodePool and EC2NodeClass rendered is checked strictly against Karpenter's v1 CRDs as
nodewarm models them (from Karpenter's Go types: the enums, patterns and defaults of the fields nodewarm writes);
--crds DIR also checks every object against the CRD files of the Karpenter release you run.

Exit codes: 0 ok (with --diff: nothing would drift); 3 with --diff: some NodeClaim would drift;
2 invalid profile (the message names the field, the bad value and the fix);
1 other failures (S3/EC2 or the cluster unreachable, CRD check failed).

First install, in one command: the CRD first, then (once the API server serves the kind) the profile:
  nodewarm render --crd | kubectl apply --server-side -f - \\
    && kubectl wait --for=condition=Established crd/warmprofiles.nodewarm.io --timeout=60s \\
    && nodewarm render -f profile.yaml --with-controller IMAGE | kubectl apply --server-side -f -
(one apply of both fails: kubectl looks up every document's kind before it creates the CRD).

Example:
  nodewarm render -f examples/karpenter-al2023.yaml | kubectl apply --server-side -f -
  nodewarm render -f profile.yaml -o out/ --crds ~/karpenter/pkg/apis/crds
  nodewarm render -f profile.yaml --device-plugin-patch kube-system/nvidia-device-plugin-daemonset | sh
  nodewarm render -f profile.yaml --diff && nodewarm render -f profile.yaml | kubectl apply --server-side -f -
"""


def measure_prefix_gb(uri: str) -> float:
    import boto3

    bucket, _, prefix = uri[len("s3://"):].partition("/")
    total = 0
    for page in boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        total += sum(o["Size"] for o in page.get("Contents", []))
    if total == 0:
        raise ProfileError("spec.model.uri", uri, "the prefix is empty or unreadable; check the URI and credentials")
    return total / GB


def load_checked(path: str, source: str = "offline", measure: bool = False) -> tuple[WarmProfile, dict]:
    p = profile.load(path)
    if p.model.size_gb is None and measure:
        p = p.with_size(measure_prefix_gb(p.model.uri))
    types = instancetypes.lookup(list(p.nodes.instance_types), source)
    profile.check(p, types)
    if p.model.size_gb is None:
        raise ProfileError("spec.model.sizeGB", None, "set it, or pass --measure to size it from the S3 listing")
    return p, types


def _claims(p: WarmProfile) -> dict[str, tuple[str, str]]:
    """The model names a profile claims, each with the field and value that set it: the first model's is the
    profile's own (metadata.name), each of spec.models has its view's (nodewarm.api.models); a /models/<name>
    folder, a Service and a Node label go with each."""
    out = {p.name: ("metadata.name", p.name)}
    for e in p.models:
        out[models.view_name(p.name, e.name)] = (f"{e.model.where}.name", e.name)
    return out


def check_claims(profiles: list[tuple[str, WarmProfile]]) -> None:
    """Profiles of one cluster, as (file, profile) in command-line order, must not claim the same model name or
    the same NodePool (a pool's nodes warm one profile's models); the later one of a clashing pair is named. A
    profile given again under its own name is a copy of the same profile (the cluster's, beside the file being
    rendered): it clashes with nothing of its own."""
    names: dict[str, str] = {}
    pools: dict[str, str] = {}
    for path, p in profiles:
        for name, (field, value) in _claims(p).items():
            owner = names.setdefault(name, p.name)
            if owner != p.name:
                raise ProfileError(f"{path}: {field}", value,
                                   f"profile {owner} already claims the model name {name} (/models/{name}, "
                                   f"Service {name}-vllm, its Node label): rename this one")
        owner = pools.setdefault(p.nodes.node_pool, p.name)
        if owner != p.name:
            raise ProfileError(f"{path}: spec.nodes.nodePool", p.nodes.node_pool,
                               f"profile {owner} already renders NodePool {p.nodes.node_pool}: a pool's nodes "
                               "warm one profile's models; list the models in one profile's spec.models")


def _refuse(report: dict[str, list[str]], what: str) -> None:
    if report:
        lines = [f"{obj}: {e}" for obj, errs in report.items() for e in errs]
        raise NodewarmError(f"rendered objects fail {what}:\n  " + "\n  ".join(lines), reason="CRDValidationFailed")


def check_karpenter_objects(documents: list[dict]) -> None:
    """Every rendered Karpenter object against Karpenter's schema as nodewarm knows it (karpenter.crds), so a value
    Karpenter's API server would refuse or silently drop never leaves render, even without --crds."""
    from nodewarm.karpenter.crds import AWS_GROUP, KARPENTER_GROUP

    karpenter = [d for d in documents if str(d.get("apiVersion", "")).startswith((f"{KARPENTER_GROUP}/",
                                                                                   f"{AWS_GROUP}/"))]
    _refuse(crdvalidate.validate(karpenter, crdvalidate.builtin()),
            "Karpenter's schema (its v1 CRDs, as nodewarm models them); the profile field that sets each value needs "
            "a value Karpenter accepts")


def run(args: argparse.Namespace) -> int:
    if args.crd:
        from nodewarm.api.schema import crd

        sys.stdout.write(dump_all([crd()]))
        return 0
    if not args.file:
        raise ProfileError("-f/--file", None, "name the WarmProfile to render (or pass --crd for the CRD alone)")
    p, types = load_checked(args.file, args.instance_source, args.measure)
    check_claims([(args.file, p)] + [(path, profile.load(path)) for path in args.also])
    if args.device_plugin_patch:
        from nodewarm.nodeclasses import deviceplugin

        sys.stdout.write(deviceplugin.commands(args.device_plugin_patch, p.readiness.taint_key))
        return 0
    out = render(p, types, args.controller_namespace)
    check_karpenter_objects(out.documents)
    if args.diff:
        from nodewarm import livediff
        from nodewarm.controller import credentials

        diff = livediff.read(credentials.api_client(args.kubeconfig, in_cluster_first=False), out.documents)
        sys.stdout.write("".join(line + "\n" for line in livediff.report(diff, p.model.size_gb)))
        return livediff.WOULD_DRIFT_EXIT if diff.preview.count() else 0
    if args.with_controller:
        from nodewarm.controller import manifests

        # Not the CRD: kubectl maps every document of one apply before it creates any, so a WarmProfile in the
        # same stream as its CRD fails on a first install ("no matches for kind"). `render --crd` goes first.
        out.documents[:0] = manifests.render(args.with_controller, args.controller_namespace)
    if args.crds:
        crd_files = sorted(Path(args.crds).glob("*.yaml"))
        _refuse(crdvalidate.validate(out.documents, crdvalidate.load_dir(crd_files)), "the CRD schemas in " + args.crds)
    if args.output_dir:
        d = Path(args.output_dir)
        d.mkdir(parents=True, exist_ok=True)
        for i, doc in enumerate(out.documents):
            (d / f"{i:02d}-{doc['kind'].lower()}-{doc['metadata']['name']}.yaml").write_text(dump_all([doc]))
        for principal, policy in out.iam_policies.items():
            (d / f"iam-{principal}-policy.json").write_text(json.dumps(policy, indent=2) + "\n")
        if out.pod_identity_commands:
            (d / "pod-identity-associations.sh").write_text(
                "#!/bin/sh\n# EKS Pod Identity: one association per nodewarm ServiceAccount (the roles need the\n"
                "# policies in iam-*-policy.json and the pods.eks.amazonaws.com trust policy).\nset -eu\n"
                + "\n".join(out.pod_identity_commands) + "\n")
        print(f"wrote {len(out.documents)} manifests, IAM policies for {', '.join(out.iam_policies)}"
              f"{' and pod-identity-associations.sh' if out.pod_identity_commands else ''} to {d}", file=sys.stderr)
    elif args.iam:
        print(json.dumps(out.iam_policies, indent=2))
    else:
        sys.stdout.write(dump_all(out.documents))
    if out.pod_identity_commands and not args.output_dir:
        print("EKS Pod Identity associations to create (see -o for a script):\n  "
              + "\n  ".join(out.pod_identity_commands), file=sys.stderr)
    if p.nodes.mode == "karpenter" and p.nodes.ami_alias.endswith("@latest"):
        pace = p.nodes.disruption.drift
        print(f"amiAlias {p.nodes.ami_alias}: each AMI release drifts every node of NodePool {p.nodes.node_pool} "
              f"(AMIDrift): {p.serving.replicas} serving node(s) x {p.model.size_gb:g} GB of weights pulled again; "
              + (f"paced by spec.nodes.disruption.drift ({pace.nodes} at a time"
                 + (f", {pace.window.start} UTC for {pace.window.duration})" if pace.window else ")")
                 if pace else "at the pace of the pool's budgets, at any hour (set spec.nodes.disruption.drift)"),
              file=sys.stderr)
    if out.user_data_budget_left is not None:
        print(f"userData budget left (after an estimate of Karpenter's own parts): {out.user_data_budget_left} bytes",
              file=sys.stderr)
    return 0


def register(sub) -> None:
    r = sub.add_parser("render", help="render NodeClass, NodePool, vLLM Deployment (+IAM policy) from a WarmProfile",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("-f", "--file", help="WarmProfile YAML ('-' for stdin); required unless --crd")
    r.add_argument("--also", action="append", default=[], metavar="FILE",
                   help="another WarmProfile of the cluster (repeat for each; nothing of it is rendered): refuse the "
                        "render when the two claim the same model (one /models/<name> path, Service and Node label: "
                        "a profile's name, or <profile>-<name> for each of spec.models) or the same NodePool")
    r.add_argument("--crd", action="store_true",
                   help="print only the WarmProfile CRD, to apply (and wait for) before any profile: see HELP")
    r.add_argument("-o", "--output-dir", help="write one file per object plus the IAM policies here")
    r.add_argument("--iam", action="store_true", help="print only the IAM policies, per principal (JSON)")
    r.add_argument("--instance-source", choices=["offline", "ec2"], default="offline",
                   help="where NVMe/GPU facts come from (default: built-in table)")
    r.add_argument("--measure", action="store_true", help="size the model from the S3 listing when sizeGB is omitted")
    r.add_argument("--crds", help="also check every object strictly against the CRDs in this folder (the "
                                  "pkg/apis/crds of the Karpenter release you run); without it, the Karpenter objects "
                                  "are checked against nodewarm's own model of Karpenter's v1 CRDs")
    r.add_argument("--with-controller", metavar="IMAGE",
                   help="also render the controller (Namespace, least-privilege RBAC, 2-replica Deployment) "
                        "running IMAGE; the CRD comes from --crd, applied first")
    r.add_argument("--controller-namespace", default=CONTROLLER_NAMESPACE, metavar="NAMESPACE",
                   help="the namespace the controller runs in (its Helm release's; default %(default)s): "
                        "--with-controller installs it there, and spec.readiness.engineCheck binds its Role in "
                        "the serving namespace to the controller's ServiceAccount there")
    r.add_argument("--diff", action="store_true",
                   help="apply nothing: print which live NodeClaims applying the rendered NodePool/NodeClass would "
                        "drift (Karpenter replaces them) and why; exit 3 if any would")
    r.add_argument("--kubeconfig", help="with --diff: kubeconfig file (default: $KUBECONFIG, ~/.kube/config, "
                                        "else in-cluster)")
    r.add_argument("--device-plugin-patch", metavar="[NAMESPACE/]DAEMONSET",
                   help="print only the kubectl JSON patch that lets this device plugin DaemonSet (default namespace "
                        "kube-system) tolerate the profile's startup taint, so warming nodes advertise their GPUs "
                        "(the WarmProfile's DevicePluginsTolerate condition names the DaemonSets that need it)")
    r.set_defaults(func=run)
