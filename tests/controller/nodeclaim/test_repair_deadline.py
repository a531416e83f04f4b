"""Karpenter's node repair (v1.15: a voluntary disruption for reason Unhealthy, terminate-first, played by the
stand-in) and nodewarm's warm deadline (onDeadline: replace) acting on the same not-yet-warm node: whichever goes
first, the NodeClaim is deleted once, so one replacement is launched, never two. On the real API server."""

from __future__ import annotations

import pytest

from support.controller_fixtures import TAINT, installed, running, taint_keys, wait_for
from nodewarm.controller.nodeclaim import plan as planner
from nodewarm.controller.kube import NODECLAIMS, NODES
from nodewarm_dev.testenv.karpenter import KarpenterSim

pytestmark = pytest.mark.kube


def _deleting(k, claim: str) -> bool:
    return bool(k.get(NODECLAIMS, claim)["metadata"].get("deletionTimestamp"))


def test_repair_first_then_the_deadline_deletes_nothing_more(admin, k):
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True, deadline="1m", on_deadline="replace") as inst, \
            running(admin, workers=0) as c:
        n = sim.scale_up(inst.pool, registered_ago_s=120)         # past nodewarm's deadline, still tainted
        sim.set_node_condition(n.node, "AcceleratedHardwareReady", "False", "GPUFault", ago_s=700)
        assert sim.repair(inst.pool) == [n.claim]                 # repair's toleration (10m) is up: it deletes
        wait_for(lambda: (cl := c.claims.store.get(n.claim)) and cl.deleting, what="the cache sees the deletion")
        plan = c.reconcile_claim(n.claim)
        assert plan.action == planner.NONE
        assert c.kube.writes[("nodeclaims", "DELETE")] == 0 and not c.decisions


def test_the_deadline_first_then_repair_deletes_nothing_more(admin, k):
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True, deadline="1m", on_deadline="replace") as inst, running(admin) as c:
        n = sim.scale_up(inst.pool, registered_ago_s=120)
        wait_for(lambda: (n.claim, planner.DELETE_CLAIM) in c.decisions, what="the deadline's replace")
        assert _deleting(k, n.claim) and TAINT in taint_keys(k, n.node)
        sim.set_node_condition(n.node, "Ready", "False", "KubeletNotReady", ago_s=1900)
        assert sim.repair(inst.pool) == []                        # a NodeClaim being deleted is no candidate
        assert c.kube.writes[("nodeclaims", "DELETE")] == 1


def test_a_nodeclaim_karpenter_is_disrupting_is_left_to_karpenter_until_it_gives_up(admin, k):
    """Karpenter's disruption queue marks a candidate before deleting it (DisruptionReason=True, the node tainted
    karpenter.sh/disrupted); a deadline replace in that window would be a second replacement."""
    sim = KarpenterSim(admin)
    with installed(k, inject_ready=True, deadline="1m", on_deadline="replace") as inst, \
            running(admin, workers=0) as c:
        n = sim.scale_up(inst.pool, registered_ago_s=120)
        claim = k.get(NODECLAIMS, n.claim)
        conds = claim["status"]["conditions"] + [{"type": "DisruptionReason", "status": "True", "reason": "Unhealthy",
                                                   "message": "Unhealthy", "lastTransitionTime": "2027-01-15T10:00:00Z"}]
        k.merge_patch(NODECLAIMS, n.claim, {"status": {"conditions": conds}}, sub="status")
        node = k.get(NODES, n.node)
        k.merge_patch(NODES, n.node, {"spec": {"taints": node["spec"]["taints"] + [
            {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}})
        wait_for(lambda: (cl := c.claims.store.get(n.claim)) and cl.disrupting == "Unhealthy", what="mark cached")
        plan = c.reconcile_claim(n.claim)
        assert plan.action == planner.NONE and plan.conditions[-1].reason == "KarpenterReplacing"
        assert c.kube.writes[("nodeclaims", "DELETE")] == 0 and not _deleting(k, n.claim)

        # Karpenter's command failed: it clears its mark and untaints the node. The deadline acts, once.
        k.merge_patch(NODECLAIMS, n.claim, {"status": {"conditions": [
            x for x in conds if x["type"] != "DisruptionReason"]}}, sub="status")
        k.merge_patch(NODES, n.node, {"spec": {"taints": node["spec"]["taints"]}})
        wait_for(lambda: not c.claims.store[n.claim].disrupting and c.nodes.store[n.node].taints == tuple(
            node["spec"]["taints"]), what="unmark cached")
        assert c.reconcile_claim(n.claim).action == planner.DELETE_CLAIM
        assert _deleting(k, n.claim) and c.kube.writes[("nodeclaims", "DELETE")] == 1
