"""Karpenter NodePool (karpenter.sh/v1) for a WarmProfile: the startup taint, the NVMe types, and the
disruption and limits that keep warm GPU nodes (and bound GPU spend).

Drift (kubernetes-sigs/karpenter ``pkg/apis/v1/nodepool.go`` ``Hash()`` hashes only ``spec.template``, and in it
``requirements`` and ``resources`` carry ``hash:"ignore"``): ``spec.disruption``, ``spec.limits`` and every
requirement below are outside the static hash, so adding or changing them marks no NodeClaim ``NodePoolDrifted``.
Requirements have a *dynamic* check instead (``pkg/controllers/nodeclaim/disruption/drift.go``
``areRequirementsDrifted``): a live NodeClaim whose labels no longer satisfy the pool's requirements is
``RequirementsDrifted`` and replaced. ``drift.requirements_drifted`` models it, e.g. narrowing capacityTypes to
``reserved`` replaces the running on-demand nodes.
"""

from __future__ import annotations

import math

from nodewarm.api.warmprofile import DriftPace, WarmProfile, parse_duration_s
from nodewarm.instancetypes import InstanceType

from nodewarm.api.names import GENERATION_LABEL, GPU_TAINT, INSTANCE_TYPE_LABEL, MANAGED_BY, PROFILE_LABEL

# The vLLM pods select nodewarm.io/generation. Karpenter launches nodes only for pods whose labels the NodePool
# can satisfy: a key it does not define is "incompatible requirements, label ... does not have known values",
# and a pending vLLM pod would never start a scale-up. With Exists the pool allows any generation; the
# NodeClaim takes the pod's value and the node registers with it, under the startup taint until it is warm.
# Requirements are outside Karpenter's drift hash, and nodewarm's nodes carry the label, so re-rendering never
# replaces them; but a node launched *before* a user added this requirement lacks the label and is replaced as
# RequirementsDrifted (drift.requirements_drifted).
GENERATION_REQUIREMENT = {"key": GENERATION_LABEL, "operator": "Exists"}

CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
RESERVATION_ID_LABEL = "karpenter.k8s.aws/capacity-reservation-id"
GPU_RESOURCE = "nvidia.com/gpu"
# Karpenter's own default is 10% (rounded up: one node for a small pool, more for a large one). A GPU node
# replaced or consolidated is a node whose weights and caches are gone: one at a time.
DEFAULT_BUDGETS = ({"nodes": "1"},)


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
    reqs = [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": list(p.nodes.instance_types)},
            dict(GENERATION_REQUIREMENT)]
    if p.nodes.mode == "karpenter":
        # Label = TotalSizeInGB, set only on NVMe types; Gt 0 keeps a non-NVMe type out even if listed by mistake.
        reqs.append({"key": "karpenter.k8s.aws/instance-local-nvme", "operator": "Gt", "values": ["0"]})
    else:
        reqs.append({"key": "eks.amazonaws.com/instance-local-nvme", "operator": "Gt", "values": ["0"]})
    if p.nodes.capacity_types:
        reqs.append({"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": list(p.nodes.capacity_types)})
    if p.nodes.capacity_reservation_ids and tuple(p.nodes.capacity_types) == ("reserved",):
        # The EC2NodeClass's capacityReservationSelectorTerms choose the reservations (Karpenter does no open
        # matching). The reservation-id label exists only on reserved nodes, so this pin is added only for a
        # reserved-only pool: beside on-demand or spot it would forbid the fallback the user asked for (and
        # replace, as RequirementsDrifted, every live node launched outside a reservation).
        reqs.append({"key": RESERVATION_ID_LABEL, "operator": "In", "values": list(p.nodes.capacity_reservation_ids)})
    return reqs


def surge_nodes(replicas: int) -> int:
    """The vLLM Deployment's rollout surge in pods (the Deployment default maxSurge 25%, rounded up), at least one
    node so a deadline or drift replacement can launch before the old node goes."""
    return max(1, math.ceil(replicas * 0.25))


def default_gpu_limit(p: WarmProfile, types: dict[str, InstanceType]) -> int:
    """Enough GPUs for every replica on a node of its own plus the surge, on the largest allowed type: a runaway
    scale-up (or a pod that can never schedule) stops at this many GPUs instead of buying more. spec.models'
    replicas do not count: Karpenter launches no node for their pods (vllm.placement), they share these nodes."""
    per_node = max(types[t].gpus for t in p.nodes.instance_types)
    return (p.serving.replicas + surge_nodes(p.serving.replicas)) * per_node


def limits(p: WarmProfile, types: dict[str, InstanceType]) -> dict:
    lim = p.nodes.limits
    gpus = lim.gpus if lim.gpus is not None else default_gpu_limit(p, types)
    out = {"cpu": lim.cpu, "memory": lim.memory, GPU_RESOURCE: str(gpus)}
    return {k: v for k, v in out.items() if v is not None}


def drift_budgets(pace: DriftPace | None) -> list[dict]:
    """spec.nodes.disruption.drift as Karpenter budgets for reason Drifted. Karpenter applies the most restrictive
    active budget for a reason, and a budget with a schedule is active only from its (UTC cron) start for its
    duration; so "drift only in the window" is a budget of 0 over the rest of the day, starting when the window
    ends."""
    if pace is None:
        return []
    out = [{"nodes": pace.nodes, "reasons": ["Drifted"]}]
    if pace.window is not None:
        h, m = (int(x) for x in pace.window.start.split(":"))
        length_m = parse_duration_s(pace.window.duration) // 60
        end = (h * 60 + m + length_m) % (24 * 60)
        rest = 24 * 60 - length_m
        out.append({"nodes": "0", "reasons": ["Drifted"], "schedule": f"{end % 60} {end // 60} * * *",
                    "duration": f"{rest // 60}h{rest % 60}m" if rest % 60 else f"{rest // 60}h"})
    return out


def disruption(p: WarmProfile) -> dict:
    d = p.nodes.disruption
    return {"consolidationPolicy": d.consolidation_policy, "consolidateAfter": d.consolidate_after,
            "budgets": [dict(b) for b in (d.budgets or DEFAULT_BUDGETS)] + drift_budgets(d.drift)}


def render(p: WarmProfile, types: dict[str, InstanceType] | None = None) -> dict:
    """``types``: the allowed types' facts (``instancetypes.lookup``); None looks them up in the offline table."""
    n = p.nodes
    if types is None:
        from nodewarm import instancetypes

        types = instancetypes.lookup(list(n.instance_types))
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
            # Outside the drift hash: a changed policy or limit replaces no node.
            "disruption": disruption(p),
            "limits": limits(p, types),
        },
    }
