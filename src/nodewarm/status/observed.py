"""What `status` reads, as the API server returned it, and the subjects it shows.

A subject is one NodeClaim and its Node (either may be missing), with the WarmProfile that gates them: paired and
bound by nodewarm.api.lifecycle, over the same views the controller plans on. The raw objects ride along for what
only `status` shows (labels, allocatable GPUs, deletion times).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nodewarm.api import defaults, lifecycle
from nodewarm.api.lifecycle import NODECLAIM_DELETING, Phase, Stage
from nodewarm.api.names import CLEANUP_CONDITION
from nodewarm.api.timeutil import parse_time
from nodewarm.api.views import LAUNCHED, ClaimView, NodeView, ProfileMeta, condition


@dataclass(frozen=True)
class Observed:
    """Everything `status` reads, as the API server returned it."""
    nodes: list[dict]
    claims: list[dict]
    profiles: list[dict]
    events: list[dict] = field(default_factory=list)


def profiles(obs: Observed) -> list[ProfileMeta]:
    """The WarmProfiles `status` can read; a broken object (no name, a spec that is not a map) shows nothing."""
    out = []
    for o in obs.profiles:
        try:
            out.append(ProfileMeta.from_obj(o))
        except (KeyError, TypeError, AttributeError):
            continue
    return out


def owners(obs: Observed) -> dict[str, ProfileMeta]:
    """NodePool -> the profile that gates it, by the controller's rule (lifecycle.binding_order)."""
    out: dict[str, ProfileMeta] = {}
    for p in lifecycle.binding_order(profiles(obs)):
        if p.node_pool:
            out.setdefault(p.node_pool, p)
    return out


def cleanup(p: ProfileMeta) -> str:
    """Why a held profile's clean-up waits (its Cleanup condition's reason; Pending before the controller wrote
    one); "" for a profile not held."""
    if not p.held:
        return ""
    return (p.cleanup.reason if p.cleanup is not None else "") or "Pending"


def cleanup_message(p: ProfileMeta) -> str:
    message = (p.cleanup.message if p.cleanup is not None else "") or \
        "the controller has not reported on the clean-up yet"
    return " ".join(message.split())


def held_note(p: ProfileMeta) -> str:
    """What a held profile's clean-up waits for and how to finish it (the controller's Cleanup condition)."""
    return (f"WarmProfile {p.name} is deleted; its clean-up is held ({CLEANUP_CONDITION}={cleanup(p)}), so it still "
            f"gates NodePool {p.node_pool}: {cleanup_message(p)}")


def _label(obj: dict | None, key: str) -> str:
    return (((obj or {}).get("metadata") or {}).get("labels") or {}).get(key, "")


@dataclass(frozen=True)
class Subject:
    claim: dict | None
    node: dict | None
    claim_view: ClaimView | None
    node_view: NodeView | None
    profile: ProfileMeta | None

    @property
    def node_name(self) -> str:
        return self.node_view.name if self.node_view is not None else ""

    @property
    def claim_name(self) -> str:
        return self.claim_view.name if self.claim_view is not None else ""

    @property
    def pool(self) -> str:
        return (self.claim_view.nodepool if self.claim_view is not None else "") or \
            (self.node_view.nodepool if self.node_view is not None else "")

    def node_label(self, key: str) -> str:
        return _label(self.node, key)

    def label(self, key: str) -> str:
        """A label of the Node, else of the NodeClaim."""
        return _label(self.node, key) or _label(self.claim, key)

    def taint_key(self) -> str:
        """The startup taint that gates this node (lifecycle.gating_taint)."""
        p = self.profile
        return lifecycle.gating_taint(p.taint_key if p else defaults.TAINT_KEY, p.retired_taint_keys if p else (),
                                      self.node_view)

    def stage(self) -> Stage:
        """lifecycle.phase, with what only the objects say: when a deletion began, and Karpenter's own reason while
        it launches."""
        s = lifecycle.phase(self.claim_view, self.node_view, self.taint_key())
        if s.phase is Phase.REPLACING:
            deleted = self.claim if s.reason == NODECLAIM_DELETING else self.node
            return Stage(s.phase, parse_time(deleted["metadata"].get("deletionTimestamp")), s.reason, s.message)
        if s.phase is Phase.LAUNCHING and self.claim is not None:
            c = condition(self.claim, LAUNCHED)
            if c is not None:
                return Stage(s.phase, s.since, c.reason or s.reason, c.message or s.message)
        return s


def subjects(obs: Observed) -> list[Subject]:
    """Every NodeClaim with its Node (lifecycle.pair), then the Nodes no claim pairs with; each with the profile
    that gates its pool, if any."""
    claims = {c["metadata"]["name"]: c for c in obs.claims}
    nodes = {n["metadata"]["name"]: n for n in obs.nodes}
    by_pool = owners(obs)
    out = []
    for cv, nv in lifecycle.pair([ClaimView.from_obj(c) for c in obs.claims],
                                 [NodeView.from_obj(n) for n in obs.nodes]):
        pool = (cv.nodepool if cv is not None else "") or (nv.nodepool if nv is not None else "")
        out.append(Subject(claims[cv.name] if cv else None, nodes[nv.name] if nv else None, cv, nv, by_pool.get(pool)))
    return out


def named(obs: Observed, name: str) -> Subject | None:
    """The subject whose Node or NodeClaim is called ``name``."""
    return next((s for s in subjects(obs) if name in (s.node_name, s.claim_name)), None)
