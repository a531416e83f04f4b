"""EKS Auto Mode NodeClass (eks.amazonaws.com/v1) for a WarmProfile.

Auto Mode formats the NVMe instance store as RAID0 at /mnt/.ephemeral only when the requested
``ephemeralStorage.size`` is *below* the instance's NVMe capacity; at or above it the node silently gets
EBS instead. So the size is computed from the smallest NVMe among the allowed types.
"""

from __future__ import annotations

from nodewarm import sizing
from nodewarm.instancetypes import InstanceType
from nodewarm.api.warmprofile import WarmProfile

from nodewarm.api.names import MANAGED_BY, PROFILE_LABEL


def ephemeral_size(p: WarmProfile, types: dict[str, InstanceType]) -> str:
    if p.nodes.ephemeral_storage_size:
        return p.nodes.ephemeral_storage_size      # validated by profile.check
    smallest = min(types[t].nvme_gb for t in p.nodes.instance_types)
    return sizing.automode_ephemeral_size(smallest)


def owned_spec(p: WarmProfile, types: dict[str, InstanceType]) -> dict:
    return {"ephemeralStorage": {"size": ephemeral_size(p, types)}}


def render(p: WarmProfile, types: dict[str, InstanceType]) -> dict:
    n = p.nodes
    return {
        "apiVersion": "eks.amazonaws.com/v1",
        "kind": "NodeClass",
        "metadata": {"name": n.node_class, "labels": {MANAGED_BY: "nodewarm", PROFILE_LABEL: p.name}},
        "spec": {
            "role": n.role,
            "subnetSelectorTerms": [dict(t) for t in n.subnet_selector_terms],
            "securityGroupSelectorTerms": [dict(t) for t in n.security_group_selector_terms],
            **owned_spec(p, types),
        },
    }
