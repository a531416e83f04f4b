"""What the controller's injector applies to the NodeClasses and NodePools the user already has (pure).

Given the profile and the objects as they are in the cluster, return the server-side-apply bodies that hold
only the fields nodewarm owns (field manager ``nodewarm``), or the reason not to touch them. Re-running on
the result returns the same body: the injector converges once and never flaps, which matters because a
change to an EC2NodeClass's userData or instanceStorePolicy, or to a NodePool's startupTaints, drifts
(replaces) every node of it (nodewarm/karpenter/drift.py).
"""

from __future__ import annotations

import re

from nodewarm.api.errors import NodewarmError
from nodewarm.instancetypes import InstanceType
from nodewarm.api.names import INSTANCE_TYPE_LABEL
from nodewarm.api.warmprofile import WarmProfile
from nodewarm.karpenter.apis import ami_family
from nodewarm.karpenter.gotypes import HashInputError
from nodewarm.profile import check_taint_key

from . import automode, ec2nodeclass, nodepool
from .render import node_user_data

SUPPORTED_FAMILIES = ("AL2023", "Bottlerocket")
NVME_LABELS = ("karpenter.k8s.aws/instance-local-nvme", "eks.amazonaws.com/instance-local-nvme")


class Refused(NodewarmError):
    """The live objects are not something nodewarm may inject into; ``reason`` says why (a condition reason)."""


def live_family(nodeclass: dict) -> str:
    """The AMI family of a live EC2NodeClass decides which user data nodewarm writes (not the profile's alias)."""
    try:
        family = ami_family(nodeclass.get("spec") or {})
    except HashInputError:
        family = None               # an alias Karpenter itself could not parse
    if family not in SUPPORTED_FAMILIES:
        raise Refused(f"EC2NodeClass {nodeclass['metadata']['name']} uses AMI family {family or '(none)'}; nodewarm "
                      f"supports {' and '.join(SUPPORTED_FAMILIES)} (amiSelectorTerms alias al2023@... or "
                      "bottlerocket@..., or amiFamily)", "UnsupportedAMIFamily")
    return family


def check_live(p: WarmProfile, nodeclass: dict, pool: dict, lookup) -> None:
    """Refuse live objects that would make the injection wrong. ``lookup(names)`` -> {name: InstanceType}."""
    tspec = ((pool.get("spec") or {}).get("template") or {}).get("spec") or {}
    ref = tspec.get("nodeClassRef") or {}
    want_kind = "NodeClass" if p.nodes.mode == "automode" else "EC2NodeClass"
    if ref.get("name") != p.nodes.node_class or ref.get("kind") != want_kind:
        raise Refused(f"NodePool {p.nodes.node_pool} uses {ref.get('kind')} {ref.get('name')}, not the profile's "
                      f"{want_kind} {p.nodes.node_class}; fix spec.nodes.nodeClass or the pool's nodeClassRef",
                      "NodeClassMismatch")
    key = p.readiness.taint_key
    try:
        check_taint_key(key)
    except NodewarmError as e:
        raise Refused(str(e), "ReservedTaintKey") from None
    if any(t.get("key") == key for t in tspec.get("taints") or ()):
        raise Refused(f"NodePool {p.nodes.node_pool} already has {key} in its taints (pods must tolerate those); "
                      "a startup taint needs a key of its own: change spec.readiness.taintKey", "TaintKeyInUse")
    reqs = tspec.get("requirements") or []
    types = [v for r in reqs if r.get("key") == INSTANCE_TYPE_LABEL and r.get("operator") == "In"
             for v in r.get("values") or ()]
    if types:
        facts = lookup(types)
        without = [t for t in types if t not in facts or facts[t].nvme_gb == 0]
        if without:
            raise Refused(f"NodePool {p.nodes.node_pool} allows instance types without NVMe instance storage: "
                          f"{', '.join(without)}; remove them (nodewarm keeps the weights on NVMe)", "NoNVMe")
    elif not any(r.get("key") in NVME_LABELS and r.get("operator") == "Gt" for r in reqs):
        raise Refused(f"NodePool {p.nodes.node_pool} allows any instance type; restrict it to NVMe types (a "
                      f"requirement {NVME_LABELS[0 if p.nodes.mode == 'karpenter' else 1]} Gt 0, or an "
                      f"{INSTANCE_TYPE_LABEL} In list)", "NoNVMe")
    want = nodepool.GENERATION_REQUIREMENT
    if not any(r.get("key") == want["key"] and r.get("operator") == want["operator"] for r in reqs):
        # Not injected: requirements is one atomic list, and the user's tool (Helm, Argo CD) owns it.
        raise Refused(f"NodePool {p.nodes.node_pool} has no requirement {{key: {want['key']}, operator: Exists}}: the "
                      f"vLLM pods select {want['key']}, and Karpenter launches no node for a pod whose label the pool "
                      "does not define (\"incompatible requirements ... does not have known values\"); add it to "
                      "spec.template.spec.requirements. It is outside Karpenter's drift hash, but Karpenter replaces a "
                      "running node whose labels miss a requirement (RequirementsDrifted): add it while the pool has "
                      "no nodes, or expect its current nodes to be replaced within its disruption budgets",
                      "NoGenerationRequirement")


# Consolidation policies that also remove or replace nodes that still run pods, and the shortest
# consolidateAfter nodewarm renders itself (nodes.disruption's default).
_UNDERUTILIZED_POLICIES = ("WhenEmptyOrUnderutilized", "Balanced")
_SHORT_CONSOLIDATE_AFTER_S = 600
_DURATION_PART = re.compile(r"([0-9]+)(h|m|s)")


def _duration_s(text: str) -> int | None:
    """A Karpenter duration ('0s', '1h30m') in seconds; None for Never or anything else."""
    if not isinstance(text, str) or not text or _DURATION_PART.sub("", text) != "":
        return None
    return sum(int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in _DURATION_PART.findall(text))


def disruption_advice(p: WarmProfile, pool: dict) -> str | None:
    """A warning for a user's NodePool whose own disruption policy discards warm GPU nodes, or None.

    nodewarm never injects spec.disruption or spec.limits into a pool it did not render: they are the user's cost
    policy (and its tool's fields). Karpenter's defaults (consolidationPolicy WhenEmptyOrUnderutilized,
    consolidateAfter 0s) let it delete or replace a warm node seconds after it becomes underutilized, so the next
    scale-up starts cold; the controller says so once (an Event and the condition), and changes nothing."""
    d = (pool.get("spec") or {}).get("disruption") or {}
    policy = d.get("consolidationPolicy", "WhenEmptyOrUnderutilized")
    after = d.get("consolidateAfter", "0s")
    seconds = _duration_s(after)
    if policy not in _UNDERUTILIZED_POLICIES or seconds is None or seconds >= _SHORT_CONSOLIDATE_AFTER_S:
        return None
    return (f"NodePool {p.nodes.node_pool} has consolidationPolicy {policy} with consolidateAfter {after}: Karpenter "
            "may delete or replace a warm GPU node (its weights and compile caches) soon after it becomes "
            "underutilized, and the next scale-up starts cold; nodewarm leaves the pool's disruption to you, and "
            "renders consolidationPolicy WhenEmpty, consolidateAfter 10m, budgets [{nodes: \"1\"}] (spec.disruption "
            "is outside Karpenter's drift hash: changing it replaces no node)")


def desired_nodeclass_fields(p: WarmProfile, current: dict, types: dict[str, InstanceType]) -> dict:
    """SSA body for the profile's EC2NodeClass (karpenter mode) or Auto Mode NodeClass."""
    name = p.nodes.node_class
    if p.nodes.mode == "automode":
        return {"apiVersion": "eks.amazonaws.com/v1", "kind": "NodeClass", "metadata": {"name": name},
                "spec": automode.owned_spec(p, types)}
    if live_family(current) == "Bottlerocket":
        # Bottlerocket: the launcher is the DaemonSet, so userData stays the user's own.
        spec = {"instanceStorePolicy": "RAID0"}
    else:
        user_data, _ = node_user_data(p, (current.get("spec") or {}).get("userData") or "")
        spec = ec2nodeclass.owned_spec(user_data)
    return {"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": name}, "spec": spec}


def desired_nodepool_fields(p: WarmProfile, current: dict | None, previous_key: str | None = None) -> dict:
    """SSA body for the profile's NodePool: the startup taint added once to the user's startupTaints; a key
    this profile injected before (a renamed taintKey) is replaced, not kept beside the new one."""
    existing = ((((current or {}).get("spec") or {}).get("template") or {}).get("spec") or {}).get("startupTaints")
    if previous_key and previous_key != p.readiness.taint_key:
        existing = [t for t in existing or () if t.get("key") != previous_key]
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": p.nodes.node_pool},
            "spec": {"template": {"spec": {"startupTaints": nodepool.merged_startup_taints(p, existing)}}}}


def without_taint(pool_name: str, current: dict, key: str) -> dict | None:
    """SSA body removing ``key`` from a NodePool's startupTaints (a deleted profile), or None if absent."""
    existing = ((((current or {}).get("spec") or {}).get("template") or {}).get("spec") or {}).get("startupTaints") or []
    if not any(t.get("key") == key for t in existing):
        return None
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": pool_name},
            "spec": {"template": {"spec": {"startupTaints": [dict(t) for t in existing if t.get("key") != key]}}}}


def differs(desired: dict, current: dict | None) -> list[str]:
    """The owned fields whose value in ``current`` differs from ``desired`` (empty: nothing to apply)."""
    def walk(d, c, path):
        if isinstance(d, dict):
            c = c if isinstance(c, dict) else {}
            return [m for k, v in d.items() for m in walk(v, c.get(k), f"{path}.{k}" if path else k)]
        return [] if d == c else [path]

    return walk(desired.get("spec", {}), (current or {}).get("spec", {}), "spec")
