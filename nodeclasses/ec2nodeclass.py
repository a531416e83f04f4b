"""Karpenter EC2NodeClass for a WarmProfile (karpenter mode)."""

from __future__ import annotations

from nodewarm.profile import WarmProfile

from .labels import MANAGED_BY, PROFILE_LABEL


def owned_spec(user_data: str) -> dict:
    """The two fields nodewarm owns on an EC2NodeClass. Both are hashed into Karpenter's drift hash,
    so the injector applies exactly these and nothing else (changing them replaces every node)."""
    return {"instanceStorePolicy": "RAID0", "userData": user_data}


def render(p: WarmProfile, user_data: str) -> dict:
    n = p.nodes
    family = "Bottlerocket" if n.ami_alias.startswith("bottlerocket@") else "AL2023"
    return {
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": n.node_class, "labels": {MANAGED_BY: "nodewarm", PROFILE_LABEL: p.name}},
        "spec": {
            "amiFamily": family,
            "amiSelectorTerms": [{"alias": n.ami_alias}],
            "role": n.role,
            "subnetSelectorTerms": [dict(t) for t in n.subnet_selector_terms],
            "securityGroupSelectorTerms": [dict(t) for t in n.security_group_selector_terms],
            **{k: v for k, v in owned_spec(user_data).items() if v},   # no empty userData (Bottlerocket: TOML or none)
        },
    }
