"""Cleanup -> condition Cleanup: a deleted WarmProfile's clean-up, and why it waits."""

from __future__ import annotations

from nodewarm.api.names import CLEANUP_CONDITION
from nodewarm.api.views import Condition
from nodewarm.api.warmprofile import WarmProfile


def cleanup_held(profile: str, pool: str, keys: list[str], nodeclaims: int, p: WarmProfile | None) -> Condition:
    """Why a deleted profile's clean-up waits, what finishing it costs (the nodes Karpenter would replace, and the
    weights each pulls again), and the ways to finish it."""
    size = p.model.size_gb if p is not None else None
    pull = f", {nodeclaims * size:g} GB of weights pulled again ({nodeclaims} x {size:g} GB)" if size else ""
    taints = " and ".join(keys)
    return Condition(
        CLEANUP_CONDITION, "False", "WouldDrift",
        f"WarmProfile {profile} is deleted, but NodePool {pool} keeps startupTaint {taints}: startupTaints is in "
        f"Karpenter's NodePool hash, so removing it would drift {nodeclaims} live NodeClaim(s) and Karpenter would "
        f"replace those nodes{pull}, compile caches cold. Until then this profile stays (Terminating) and new nodes "
        f"of {pool} are still warmed and untainted. To finish: let {pool} scale to zero nodes (the taint then goes "
        f"and nothing is replaced), or set spec.injection.onLive: drift on this WarmProfile to remove it now and "
        f"replace the {nodeclaims} node(s), or take {taints} out of the NodePool yourself (the same replacement). "
        "Do not remove the finalizer nodewarm.io/cleanup by hand: the taint would stay with nobody to lift it")
