"""Karpenter NodePool (karpenter.sh/v1) for a WarmProfile: the startup taint and the NVMe types."""

from __future__ import annotations

from nodewarm.generation import GENERATION_LABEL
from nodewarm.profile import WarmProfile

from .labels import GPU_TAINT, MANAGED_BY, PROFILE_LABEL

# The vLLM pods select nodewarm.io/generation. Karpenter launches nodes only for pods whose labels the NodePool
# can satisfy: a key it does not define is "incompatible requirements, label ... does not have known values",
# and a pending vLLM pod would never start a scale-up. With Exists the pool allows any generation; the
# NodeClaim takes the pod's value and the node registers with it, under the startup taint until it is warm.
# Requirements are outside Karpenter's drift hash, so adding this replaces no node.
GENERATION_REQUIREMENT = {"key": GENERATION_LABEL, "operator": "Exists"}


def startup_taint(p: WarmProfile) -> dict:
    # A *startup* taint, not a plain taint: Karpenter ignores startupTaints when simulating scheduling
    # on an un-initialized node, so pending vLLM pods wait for this node instead of launching more.
    return {"key": p.readiness.taint_key, "effect": "NoSchedule"}


def merged_startup_taints(p: WarmProfile, existing: list[dict] | None) -> list[dict]:
    """The user's startupTaints with ours added once (startupTaints is an atomic list in the CRD,
    so whoever applies it owns the whole list: keep every existing entry)."""
    current = [dict(t) for t in existing or []]
    ours = startup_taint(p)
    if not any(t.get("key") == ours["key"] and t.get("effect") == ours["effect"] for t in current):
        current.append(ours)
    return current


def requirements(p: WarmProfile) -> list[dict]:
    reqs = [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": list(p.nodes.instance_types)},
            dict(GENERATION_REQUIREMENT)]
    if p.nodes.mode == "karpenter":
        # Label = TotalSizeInGB, set only on NVMe types; Gt 0 keeps a non-NVMe type out even if listed by mistake.
        reqs.append({"key": "karpenter.k8s.aws/instance-local-nvme", "operator": "Gt", "values": ["0"]})
    else:
        reqs.append({"key": "eks.amazonaws.com/instance-local-nvme", "operator": "Gt", "values": ["0"]})
    return reqs


def render(p: WarmProfile) -> dict:
    n = p.nodes
    node_class_ref = ({"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": n.node_class}
                      if n.mode == "karpenter" else
                      {"group": "eks.amazonaws.com", "kind": "NodeClass", "name": n.node_class})
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": n.node_pool, "labels": {MANAGED_BY: "nodewarm", PROFILE_LABEL: p.name}},
        "spec": {
            "template": {
                "metadata": {"labels": {PROFILE_LABEL: p.name}},
                "spec": {
                    "nodeClassRef": node_class_ref,
                    "requirements": requirements(p),
                    "startupTaints": [startup_taint(p)],
                    "taints": [{"key": GPU_TAINT, "effect": "NoSchedule"}],
                },
            },
        },
    }
