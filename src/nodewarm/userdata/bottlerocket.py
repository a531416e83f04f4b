"""Bottlerocket user data: nodewarm adds nothing to it, but checks it before it reaches a node.

Bottlerocket has no shell, so no script can install a unit; a bootstrap container would run before kubelet
and hold registration for the whole download. The launcher is the DaemonSet (``daemonset.py``), and the
NVMe RAID comes from Karpenter's own ``000-mount-instance-storage`` bootstrap command (RAID0 at
``/mnt/.ephemeral``). What can still go wrong is in the user's TOML, found here at render time instead
of as a node that never joins.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass

from .errors import UserDataInvalid, UserDataTooLarge
from .merge import USER_DATA_LIMIT

# Karpenter's generated settings: cluster name, API endpoint, base64 CA bundle, labels, taints, kubelet
# fields and the instance-storage bootstrap command.
KARPENTER_SETTINGS_RESERVE = 3072


@dataclass(frozen=True)
class BottlerocketUserData:
    user_data: str | None
    bytes_used: int
    budget_left: int


def check(existing: str | None, reserve: int = KARPENTER_SETTINGS_RESERVE) -> BottlerocketUserData:
    """The user's TOML, unchanged, once it is known to parse, not to set taints Karpenter drops, and to fit."""
    text = existing or ""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserDataInvalid(f"Bottlerocket userData is not valid TOML ({e}); Karpenter cannot launch with it") from e
    settings = doc.get("settings", {})
    kubernetes = settings.get("kubernetes", {}) if isinstance(settings, dict) else None
    if not isinstance(kubernetes, dict):
        raise UserDataInvalid("Bottlerocket userData: [settings] and [settings.kubernetes] must be tables")
    if "node-taints" in kubernetes:
        raise UserDataInvalid(
            "Bottlerocket userData sets settings.kubernetes.node-taints, which Karpenter replaces with the "
            "NodeClaim's taints: set taints and the nodewarm startup taint on the NodePool instead"
        )
    used = len(text.encode()) + reserve
    if used > USER_DATA_LIMIT:
        raise UserDataTooLarge(
            f"Bottlerocket userData would be about {used} bytes with Karpenter's settings (~{reserve}), over "
            f"EC2's {USER_DATA_LIMIT}-byte limit; remove settings from the EC2NodeClass userData"
        )
    return BottlerocketUserData(user_data=existing, bytes_used=used, budget_left=USER_DATA_LIMIT - used)
