"""The manager's own parts, pure (no servers): each cached kind's events go to the watches the reconcilers declared
for it (controller/watch.py), and to no other reconciler; the work queue; the Lease's timings."""

from __future__ import annotations

import threading

import pytest
from kubernetes import client

from nodewarm import profile
from nodewarm.api import enginecheck as contract
from nodewarm.api.names import CACHE_ANNOTATION, PROFILE_LABEL
from nodewarm.controller.enginecheck.controller import EngineCheckController
from nodewarm.controller.kube import DAEMONSETS, NODECLAIMS, NODEPOOLS, NODES
from nodewarm.controller.manager import Controller
from nodewarm.controller.modellabels.controller import ModelLabelController
from nodewarm.controller.nodeclaim.controller import NodeClaimController
from nodewarm.controller.options import ControllerOptions
from nodewarm.controller.warmprofile.controller import WarmProfileController
from nodewarm.controller.watch import Router, Watch
from nodewarm.controller.workqueue import WorkQueue
from support import builders
from support.builders import POOL, v

T0 = 1_800_000_000.0
PID = "aws:///us-west-2a/i-000001"
# Every reconciler's key for the node n1 of claim c1, in pool POOL of profile p1 (engine check and peers on).
EVERY = {"claim/c1", "profile/p1", "check/p1/n1", "models/n1"}
OWNERS = [(WarmProfileController, "profile/p1"), (NodeClaimController, "claim/c1"),
          (EngineCheckController, "check/p1/n1"), (ModelLabelController, "models/n1")]


def drain(q: WorkQueue) -> set[str]:
    out = set()
    while (key := q.get(timeout_s=0)) is not None:
        out.add(key)
        q.done(key)
    return out


def controller() -> Controller:
    """A Controller that is never started: nothing reaches a server; events are fed as its reflectors feed them."""
    p = profile.from_dict(v(metadata__name="p1", spec__readiness__engineCheck={"enabled": True, "image": "x"},
                            spec__weights__peers__enabled=True))
    return Controller(client.ApiClient(), ControllerOptions(profiles=(p,), watch_profiles=False))


def claim_obj() -> dict:
    return builders.nodeclaim("c1", created=T0 - 70, launched=T0 - 60, registered=T0, provider_id=PID)


def node_obj(**annotations) -> dict:
    return builders.node("n1", created=T0, provider_id=PID, labels={PROFILE_LABEL: "p1"},
                         annotations={contract.REQUEST_ANNOTATION: "{}", **annotations})


def test_each_event_reaches_exactly_the_reconcilers_that_declared_its_kind():
    c = controller()
    c.claims._apply("ADDED", claim_obj())           # the reflector's own path: cache, then the declared watches
    assert drain(c.queue) == {"claim/c1"}           # NodeClaimController's; WarmProfileController's only when held
    c.nodes._apply("ADDED", node_obj())
    assert drain(c.queue) == EVERY                  # all four declare Nodes
    c.nodes._apply("MODIFIED", node_obj(**{CACHE_ANNOTATION: "cold"}))
    assert drain(c.queue) == EVERY - {"profile/p1"}     # the peers' predicate: the node did not join or leave
    c.nodepools._apply("MODIFIED", {"metadata": {"name": POOL, "generation": 2}})
    assert drain(c.queue) == {"profile/p1"}         # only WarmProfileController declares NodePools
    device_plugin = {"metadata": {"namespace": "kube-system", "name": "nvidia-device-plugin"},
                     "spec": {"template": {"spec": {"containers": [{"name": "nvidia-device-plugin"}]}}}}
    c.daemonsets._apply("ADDED", device_plugin)
    assert drain(c.queue) == {"profile/p1"}
    c._enqueue_all()                                # a new leader: every reconciler's keys
    assert drain(c.queue) == EVERY
    assert set(c.router.routes) == {"claim", "budget", "profile", "check", "models"}


def test_an_event_counted_by_a_feature_is_counted_through_its_declaration():
    c = controller()
    c.is_leader.set()
    c.nodes._apply("ADDED", node_obj(**{CACHE_ANNOTATION: "restored"}))
    c.nodes._apply("MODIFIED", node_obj(**{CACHE_ANNOTATION: "hit"}))
    assert c.metrics.cache.labels(POOL, "hit")._value.get() == 1


@pytest.mark.parametrize("owner,key", OWNERS, ids=[o.__name__ for o, _ in OWNERS])
def test_without_its_declarations_a_reconciler_gets_none_of_the_events(monkeypatch, owner, key):
    monkeypatch.setattr(owner, "watches", lambda self: [])
    c = controller()
    c.claims._apply("ADDED", claim_obj())
    c.nodes._apply("ADDED", node_obj())
    assert drain(c.queue) == EVERY - {key}          # the manager routes nothing on its own


def test_the_router_honours_predicates_runs_on_event_first_and_refuses_a_shared_prefix():
    seen: list[str] = []

    class A:
        def watches(self):
            return [Watch(NODES, lambda e, o, n: [f"a/{n}"], predicate=lambda e, o, n: e != "DELETED",
                          on_event=lambda e, o, n: seen.append(f"event {n}")),
                    Watch(DAEMONSETS, lambda e, o, n: ["a/all"])]

        def routes(self):
            return {"a": seen.append}

        def keys(self):
            return ["a/all"]

    class B(A):
        def watches(self):
            return [Watch(NODECLAIMS, lambda e, o, n: [f"b/{n}"])]

        def routes(self):
            return {"b": seen.append}

    added: list[str] = []
    r = Router([A(), B()], lambda key: (seen.append(f"add {key}"), added.append(key)))
    r.route(NODES, "ADDED", None, "n1")
    r.route(NODES, "DELETED", "n1", None)
    r.route(NODECLAIMS, "ADDED", None, "c1")
    r.route(NODEPOOLS, "ADDED", None, "p")          # nobody's
    assert added == ["a/n1", "b/c1"]
    assert seen[:2] == ["event n1", "add a/n1"]
    assert list(r.all_keys()) == ["a/all", "a/all"]
    with pytest.raises(ValueError, match="a/"):
        Router([A(), A()], added.append)


# -- the work queue and the Lease ----------------------------------------------------------------------------

def test_workqueue_dedupes_and_never_hands_one_key_to_two_workers():
    q = WorkQueue()
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    assert q.get(0.1) == "a"
    q.add("a")                       # re-added while processing: queued again only after done()
    assert q.get(0.1) == "b"
    assert q.get(0.05) is None
    q.done("a")
    assert q.get(0.1) == "a"


def test_workqueue_delays_and_backoff():
    q = WorkQueue(base_delay_s=0.05)
    assert q.retry("k") == pytest.approx(0.05)
    assert q.retry("k") == pytest.approx(0.1)
    q.forget("k")
    assert q.retry("k") == pytest.approx(0.05)
    got = []
    t = threading.Thread(target=lambda: got.append(q.get(2)))
    t.start()
    t.join(3)
    assert got == ["k"]
    q.add_after("later", 0.05)
    assert q.get(0.01) is None
    assert q.get(2) == "later"
    q.shutdown()
    assert q.get(5) is None


def test_leader_timings_must_leave_no_window_for_two_leaders():
    from nodewarm.controller.leader import LeaderConfig

    ok = LeaderConfig("ns", identity="a", lease_duration_s=15, renew_deadline_s=10, retry_period_s=2)
    assert ok.request_timeout_s < ok.renew_deadline_s       # one hung call cannot outlast the deadline
    with pytest.raises(ValueError, match="greater than the renew deadline"):
        LeaderConfig("ns", identity="a", lease_duration_s=10, renew_deadline_s=10, retry_period_s=2)
    with pytest.raises(ValueError, match="retry period"):
        LeaderConfig("ns", identity="a", lease_duration_s=15, renew_deadline_s=2, retry_period_s=2)
    with pytest.raises(ValueError, match="identity"):
        LeaderConfig("ns", identity="")
