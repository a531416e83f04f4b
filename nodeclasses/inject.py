"""What the controller's injector applies to NodeClasses and NodePools the user already has.

Pure: given the profile and the object as it is in the cluster, return the server-side-apply body that
holds only the fields nodewarm owns (field manager ``nodewarm``), so GitOps tools keep owning the rest.
Re-running on the result returns the same body: the injector converges once and never flaps, which
matters because any change to an EC2NodeClass's userData or instanceStorePolicy drifts (replaces) every
node of that class.
"""

from __future__ import annotations

from nodewarm.instancetypes import InstanceType
from nodewarm.profile import WarmProfile

from . import automode, ec2nodeclass, nodepool
from .render import node_user_data, uses_daemonset


def desired_nodeclass_fields(p: WarmProfile, current: dict | None, types: dict[str, InstanceType]) -> dict:
    """SSA body for the profile's EC2NodeClass (karpenter mode) or Auto Mode NodeClass."""
    name = p.nodes.node_class
    if p.nodes.mode == "automode":
        return {"apiVersion": "eks.amazonaws.com/v1", "kind": "NodeClass", "metadata": {"name": name},
                "spec": automode.owned_spec(p, types)}
    current_ud = ((current or {}).get("spec") or {}).get("userData")
    if uses_daemonset(p):
        # Bottlerocket: the launcher is the DaemonSet, so userData stays the user's own.
        spec = {"instanceStorePolicy": "RAID0"}
    else:
        user_data, _ = node_user_data(p, current_ud or "")
        spec = ec2nodeclass.owned_spec(user_data)
    return {"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": name}, "spec": spec}


def desired_nodepool_fields(p: WarmProfile, current: dict | None) -> dict:
    """SSA body for the profile's NodePool: the startup taint added once to the user's startupTaints."""
    existing = ((((current or {}).get("spec") or {}).get("template") or {}).get("spec") or {}).get("startupTaints")
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": p.nodes.node_pool},
            "spec": {"template": {"spec": {"startupTaints": nodepool.merged_startup_taints(p, existing)}}}}


def differs(desired: dict, current: dict | None) -> list[str]:
    """The owned fields whose value in ``current`` differs from ``desired`` (empty: nothing to apply)."""
    def walk(d, c, path):
        if isinstance(d, dict):
            c = c if isinstance(c, dict) else {}
            return [m for k, v in d.items() for m in walk(v, c.get(k), f"{path}.{k}" if path else k)]
        return [] if d == c else [path]

    return walk(desired.get("spec", {}), (current or {}).get("spec", {}), "spec")
