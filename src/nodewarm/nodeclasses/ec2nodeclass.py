"""Karpenter EC2NodeClass for a WarmProfile (karpenter mode)."""

from __future__ import annotations

from nodewarm.api.warmprofile import WarmProfile
from nodewarm.profile import check_ami_alias

from nodewarm.api.names import MANAGED_BY, PROFILE_LABEL


def owned_spec(user_data: str) -> dict:
    """The two fields nodewarm owns on an EC2NodeClass. Both are hashed into Karpenter's drift hash,
    so the injector applies exactly these and nothing else (changing them replaces every node)."""
    return {"instanceStorePolicy": "RAID0", "userData": user_data}


def render(p: WarmProfile, user_data: str) -> dict:
    """The EC2NodeClass; its AMI is the profile's pinned alias (``profile.check_ami_alias``: never a silent
    al2023@latest, whose every release drifts every node: the provider's AMIDrift)."""
    n = p.nodes
    check_ami_alias(p)
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
            **reservation_spec(p),
            **{k: v for k, v in owned_spec(user_data).items() if v},   # no empty userData (Bottlerocket: TOML or none)
        },
    }


def reservation_spec(p: WarmProfile) -> dict:
    """capacityReservationSelectorTerms for spec.nodes.capacityReservationIds (one ``id`` term each; the CRD makes
    ``id`` exclusive with the other term fields). Karpenter does no open ODCR matching: a reservation the class
    does not select is never used, even with capacity-type ``reserved`` allowed.

    Drift: the field is ``hash:"ignore"`` in aws/karpenter-provider-aws ``pkg/apis/v1/ec2nodeclass.go`` (also at
    v1.14.1), so adding or changing it is no NodeClassDrift. The provider checks it dynamically instead
    (``pkg/cloudprovider/drift.go`` ``isCapacityReservationDrifted``): a node running *in* a reservation the class
    no longer resolves is ``CapacityReservationDrift`` and replaced; see ``reservations_dropped``."""
    ids = p.nodes.capacity_reservation_ids
    return {"capacityReservationSelectorTerms": [{"id": i} for i in ids]} if ids else {}


def _reservation_ids(nodeclass: dict) -> set[str]:
    terms = (nodeclass.get("spec") or {}).get("capacityReservationSelectorTerms") or ()
    return {t["id"] for t in terms if isinstance(t, dict) and t.get("id")}


def reservations_dropped(before: dict, after: dict) -> set[str]:
    """The reservation IDs selected by ``before`` and not by ``after`` (``id`` terms only): nodes running in those
    reservations become CapacityReservationDrift and are replaced. Adding a reservation drops none."""
    return _reservation_ids(before) - _reservation_ids(after)
