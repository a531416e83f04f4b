"""Peers before S3 (#34), the controller's side: the profile's key Secret, rotated on time, readable by exactly the
profile's nodes (planning, pure), and on the RBAC-enforcing API server with each node's own token."""

from __future__ import annotations

import base64

import pytest
from kubernetes.client.exceptions import ApiException

from nodewarm.api.names import (
    PEER_KEY_CURRENT, PEER_KEY_PREVIOUS, PEER_KEY_ROTATED_ANNOTATION, PROFILE_LABEL, peer_binding_name,
    peer_secret_name,
)
from nodewarm.api.timeutil import parse_time
from nodewarm.controller import manifests
from nodewarm.controller.kube import NODES, ROLEBINDINGS, ROLES, SECRETS, WARMPROFILES, Kube
from nodewarm.controller.warmprofile import peerkeys
from nodewarm.controller.warmprofile.peerkeys import Node, Observed, plan
from nodewarm.nodeclasses import peeraccess

from support.controller_fixtures import events_for, installed, running, uniq, wait_for
from support.rbac import KINDS, apply_replacing

DAY = 86400.0
T0 = 1_800_000_000.0


class Keys:
    """Deterministic key bytes: the n-th key is n repeated (what a test can recognise after a rotation)."""

    def __init__(self):
        self.n = 0

    def __call__(self, size: int) -> bytes:
        self.n += 1
        return bytes([self.n]) * size


def _apply(seen: Observed, actions) -> Observed:
    """What the API server would hold after ``actions`` (the plan's effect, for the next plan)."""
    secret, role, bindings = seen.secret, seen.role, dict(seen.bindings)
    for a in actions:
        body = dict(a.body or {}, metadata={**((a.body or {}).get("metadata") or {}), "resourceVersion": "2"})
        if a.kind == "Secret":
            secret = None if a.verb == "remove" else body
        elif a.kind == "Role":
            role = None if a.verb == "remove" else body
        elif a.verb == "unbind":
            bindings.pop(a.node)
        else:
            bindings[a.node] = body
    return Observed(secret, role, bindings)


def _data(secret: dict) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def test_mint_makes_two_random_keys_the_role_and_one_binding_per_node():
    nodes = [Node("n1", "u1"), Node("n2", "u2")]
    p = plan("llama", "boot", True, DAY, nodes, Observed(), T0, token=Keys())
    assert [(a.verb, a.kind) for a in p.actions] == [("mint", "Secret"), ("role", "Role"), ("bind", "RoleBinding"),
                                                      ("bind", "RoleBinding")]
    secret = p.actions[0].body
    assert secret["metadata"]["name"] == peer_secret_name("llama") and secret["metadata"]["namespace"] == "boot"
    assert _data(secret) == {PEER_KEY_CURRENT: b"\x01" * 32, PEER_KEY_PREVIOUS: b"\x02" * 32}
    assert parse_time(secret["metadata"]["annotations"][PEER_KEY_ROTATED_ANNOTATION]) == T0
    assert p.actions[1].body["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                                           "resourceNames": [peer_secret_name("llama")]}]
    b = p.actions[2].body
    assert b["metadata"]["name"] == peer_binding_name("llama", "n1")
    assert b["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:node:n1"}]
    assert b["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"}]
    assert p.rotate_in_s == DAY
    # With the real source of randomness, the two keys differ.
    real = plan("llama", "boot", True, DAY, [], Observed(), T0).actions[0].body
    assert len(set(_data(real).values())) == 2 and all(len(k) == 32 for k in _data(real).values())


def test_nothing_to_do_once_minted_and_the_rotation_falls_due_exactly_at_the_interval():
    keys = Keys()
    seen = _apply(Observed(), plan("llama", "boot", True, DAY, [Node("n1", "u1")], Observed(), T0, token=keys).actions)
    before = plan("llama", "boot", True, DAY, [Node("n1", "u1")], seen, T0 + DAY - 1, token=keys)
    assert before.actions == () and before.rotate_in_s == 1
    at = plan("llama", "boot", True, DAY, [Node("n1", "u1")], seen, T0 + DAY, token=keys)
    assert [a.verb for a in at.actions] == ["rotate"]
    rotated = at.actions[0]
    assert rotated.resource_version == "2" and rotated.body["metadata"]["resourceVersion"] == "2"   # guarded
    assert _data(rotated.body) == {PEER_KEY_CURRENT: b"\x03" * 32, PEER_KEY_PREVIOUS: b"\x01" * 32}
    assert parse_time(rotated.body["metadata"]["annotations"][PEER_KEY_ROTATED_ANNOTATION]) == T0 + DAY
    assert at.rotate_in_s == DAY


def test_a_key_of_unknown_age_is_rotated():
    seen = _apply(Observed(), plan("llama", "boot", True, DAY, [], Observed(), T0, token=Keys()).actions)
    del seen.secret["metadata"]["annotations"][PEER_KEY_ROTATED_ANNOTATION]
    assert [a.verb for a in plan("llama", "boot", True, DAY, [], seen, T0 + 1, token=Keys()).actions] == ["rotate"]


def test_nodes_joining_and_leaving_bind_and_unbind_and_a_reregistered_node_is_reowned():
    seen = _apply(Observed(), plan("llama", "boot", True, DAY, [Node("n1", "u1"), Node("n2", "u2")], Observed(), T0,
                                   token=Keys()).actions)
    p = plan("llama", "boot", True, DAY, [Node("n2", "u2-new"), Node("n3", "u3")], seen, T0 + 5)
    assert [(a.verb, a.node) for a in p.actions] == [("bind", "n2"), ("bind", "n3"), ("unbind", "n1")]
    reowned = p.actions[0]
    assert reowned.resource_version == "2"
    assert reowned.body["metadata"]["ownerReferences"][0]["uid"] == "u2-new"
    assert p.actions[2].name == peer_binding_name("llama", "n1")


def test_turned_off_everything_goes_bindings_first():
    seen = _apply(Observed(), plan("llama", "boot", True, DAY, [Node("n1", "u1")], Observed(), T0,
                                   token=Keys()).actions)
    p = plan("llama", "boot", False, DAY, [Node("n1", "u1")], seen, T0)
    assert [(a.verb, a.kind, a.name) for a in p.actions] == [
        ("unbind", "RoleBinding", peer_binding_name("llama", "n1")), ("remove", "Role", peer_secret_name("llama")),
        ("remove", "Secret", peer_secret_name("llama"))]
    assert p.rotate_in_s is None
    assert plan("llama", "boot", False, DAY, [], Observed(), T0).actions == ()


def test_a_changed_role_is_put_back():
    seen = _apply(Observed(), plan("llama", "boot", True, DAY, [], Observed(), T0, token=Keys()).actions)
    seen.role["rules"] = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]
    p = plan("llama", "boot", True, DAY, [], seen, T0)
    assert [(a.verb, a.resource_version) for a in p.actions] == [("role", "2")]
    assert p.actions[0].body["rules"] == peerkeys.role_rules("llama")


# -- on the RBAC-enforcing API server ------------------------------------------------------------------------------

def _node(k: Kube, name: str, profile: str | None) -> None:
    labels = {PROFILE_LABEL: profile} if profile else {}
    try:
        k.delete(NODES, name)
    except ApiException as e:
        if e.status != 404:
            raise
    wait_for(lambda: _gone(lambda: k.get(NODES, name)), what=f"old Node {name} gone")
    k.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})


def _gone(call) -> bool:
    try:
        call()
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def _reads(kube, node: str, ns: str, secret: str) -> int:
    """The status a GET of the Secret gets with ``node``'s own kubelet token (200 or the API's refusal)."""
    try:
        Kube(kube.api_client(kube.node_token(node))).get(SECRETS, secret, ns)
    except ApiException as e:
        return e.status
    return 200


def _bindings(k: Kube, ns: str, profile: str) -> list[dict]:
    """The profile's node bindings (the namespace also holds the controller's own, peeraccess.controller_rbac)."""
    return k.list(ROLEBINDINGS, ns, labelSelector=peerkeys.selector(profile))["items"]


def _peers_condition(k: Kube, name: str) -> dict | None:
    conds = (k.get(WARMPROFILES, name).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "Peers"), None)


@pytest.fixture()
def as_controller(kube):
    """The controller's ServiceAccount with exactly the shipped RBAC: its ClusterRole and, in a fresh bootstrap
    namespace, peeraccess.controller_rbac. Yields (admin Kube, the SA's ApiClient, the bootstrap namespace)."""
    ak = Kube(kube.api_client())
    ctl, boot = uniq("nodewarm"), uniq("boot")
    ns = lambda n: {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}  # noqa: E731
    token = kube.controller_token(ctl)
    apply_replacing(ak, [ns(boot), *peeraccess.controller_rbac(boot, ctl)])
    yield ak, kube.api_client(token), boot


@pytest.mark.kube
def test_only_the_profiles_nodes_read_the_key_a_deleted_node_loses_it_and_peers_off_removes_it(kube, as_controller):
    ak, sa_client, boot = as_controller
    mine, other, stray = "node-5", "node-6", "node-7"
    with installed(ak, user_data=None, user_startup_taints=(), spec__weights__peers__enabled=True,
                   spec__bootstrap__namespace=boot) as inst:
        secret = peer_secret_name(inst.name)
        _node(ak, mine, inst.name)
        _node(ak, other, "another-profile")
        _node(ak, stray, None)
        try:
            with running(sa_client) as c:
                wait_for(lambda: _reads(kube, mine, boot, secret) == 200, timeout_s=20,
                         what="the profile's node reads the key with its own token")
                assert _reads(kube, other, boot, secret) == 403        # another profile's node
                assert _reads(kube, stray, boot, secret) == 403        # a node of no profile
                got = ak.get(SECRETS, secret, boot)
                keys = {k: base64.b64decode(v) for k, v in got["data"].items()}
                assert set(keys) == {PEER_KEY_CURRENT, PEER_KEY_PREVIOUS} and all(len(v) == 32 for v in keys.values())
                bindings = _bindings(ak, boot, inst.name)
                assert [b["metadata"]["name"] for b in bindings] == [peer_binding_name(inst.name, mine)]
                assert bindings[0]["metadata"]["ownerReferences"][0]["kind"] == "Node"
                wait_for(lambda: (x := _peers_condition(ak, inst.name)) and x["reason"] == "KeyShared",
                         what="condition Peers=True")
                wait_for(lambda: {"PeerKeyMinted", "PeerNodeBound"} <= {e["reason"] for e in events_for(
                    ak, "WarmProfile", inst.name)}, what="events of the mint and the binding")
                assert c.metrics.peer_keys.labels(inst.name, "mint")._value.get() == 1
                assert c.metrics.peer_keys.labels(inst.name, "bind")._value.get() == 1

                # Rotation, with the controller's clock a day on: the SA may update the Secret, the old key stays.
                rotated_at = got["metadata"]["annotations"][PEER_KEY_ROTATED_ANNOTATION]
                c.warmprofile.clock = lambda: parse_time(rotated_at) + inst.profile.weights.peers.key_rotation_s
                c.queue.add(f"profile/{inst.name}")
                after = wait_for(lambda: (s := ak.get(SECRETS, secret, boot))["metadata"]["annotations"][
                    PEER_KEY_ROTATED_ANNOTATION] != rotated_at and s, what="the key rotated")
                assert base64.b64decode(after["data"][PEER_KEY_PREVIOUS]) == keys[PEER_KEY_CURRENT]
                assert base64.b64decode(after["data"][PEER_KEY_CURRENT]) != keys[PEER_KEY_CURRENT]
                assert _reads(kube, mine, boot, secret) == 200

                # The node goes: its binding goes with it (no garbage collector runs here), and so does its access.
                ak.delete(NODES, mine)
                wait_for(lambda: not _bindings(ak, boot, inst.name), what="the gone node's binding deleted")
                assert _reads(kube, mine, boot, secret) == 403
                assert c.metrics.peer_keys.labels(inst.name, "unbind")._value.get() == 1

                # Back, then peers off: Secret, Role and bindings all go.
                _node(ak, mine, inst.name)
                wait_for(lambda: _reads(kube, mine, boot, secret) == 200, what="the new node reads the key")
                ak.merge_patch(WARMPROFILES, inst.name, {"spec": {"weights": {"peers": {"enabled": False}}}})
                wait_for(lambda: _gone(lambda: ak.get(SECRETS, secret, boot)), what="the key Secret removed")
                assert _gone(lambda: ak.get(ROLES, secret, boot))
                assert _bindings(ak, boot, inst.name) == []
                assert _reads(kube, mine, boot, secret) == 403
                wait_for(lambda: (x := _peers_condition(ak, inst.name)) and x["reason"] == "Disabled",
                         what="condition Peers=False Disabled")
                assert c.metrics.reconcile_errors.labels("profile")._value.get() == 0
        finally:
            for n in (mine, other, stray):
                _gone(lambda n=n: ak.delete(NODES, n))


@pytest.mark.kube
def test_without_peers_nothing_exists_and_a_deleted_profile_takes_its_key_with_it(kube, as_controller):
    ak, sa_client, boot = as_controller
    node = "node-4"
    with installed(ak, user_data=None, user_startup_taints=(), spec__bootstrap__namespace=boot) as off, \
            installed(ak, user_data=None, user_startup_taints=(), spec__weights__peers__enabled=True,
                      spec__bootstrap__namespace=boot) as on:
        _node(ak, node, off.name)
        try:
            with running(sa_client) as c:
                wait_for(lambda: _peers_condition(ak, on.name), timeout_s=20, what="the peers profile done")
                wait_for(lambda: (ak.get(WARMPROFILES, off.name).get("status") or {}).get("conditions"),
                         what="the other profile reconciled")
                assert _gone(lambda: ak.get(SECRETS, peer_secret_name(off.name), boot))
                assert _gone(lambda: ak.get(ROLES, peer_secret_name(off.name), boot))
                assert _bindings(ak, boot, off.name) == []
                assert _peers_condition(ak, off.name) is None
                assert _reads(kube, node, boot, peer_secret_name(off.name)) == 403

                # The peers profile deleted: its clean-up removes the key before the finalizer goes.
                ak.delete(WARMPROFILES, on.name)
                wait_for(lambda: _gone(lambda: ak.get(WARMPROFILES, on.name)), timeout_s=20,
                         what="the deleted profile's clean-up finished")
                on.profile_object = None
                assert _gone(lambda: ak.get(SECRETS, peer_secret_name(on.name), boot))
                assert _gone(lambda: ak.get(ROLES, peer_secret_name(on.name), boot))
                assert c.metrics.peer_keys.labels(on.name, "remove")._value.get() == 2
        finally:
            _gone(lambda: ak.delete(NODES, node))


def test_the_controllers_peer_rbac_is_exactly_what_peerkeys_does():
    rules = {r["resources"][0]: set(r["verbs"]) for r in peeraccess.RULES}
    assert rules == {"secrets": {"get", "create", "update", "delete"}, "roles": {"get", "create", "update", "delete"},
                     "rolebindings": {"list", "create", "update", "delete"}}
    assert all("resourceNames" not in r for r in peeraccess.RULES)
    role, binding = peeraccess.controller_rbac("boot", "ctl")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "boot"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": manifests.NAME, "namespace": "ctl"}]
    # Not cluster-wide: the ClusterRole still reaches no Secret.
    assert not any("secrets" in r["resources"] for r in manifests.cluster_rules())


@pytest.mark.kube
def test_a_bootstrap_namespace_without_the_controllers_peer_role_is_reported_not_retried_blindly(kube, as_controller):
    ak, sa_client, _ = as_controller
    bare = uniq("boot")
    ak.create(KINDS["Namespace"], {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": bare}})
    with installed(ak, user_data=None, user_startup_taints=(), spec__weights__peers__enabled=True,
                   spec__bootstrap__namespace=bare) as inst, running(sa_client) as c:
        cond = wait_for(lambda: (x := _peers_condition(ak, inst.name)) and x["reason"] == "Forbidden" and x,
                        timeout_s=20, what="condition Peers=False Forbidden")
        assert cond["status"] == "False" and f"{peeraccess.NAME} in {bare}" in cond["message"]
        assert c.metrics.peer_keys.labels(inst.name, "forbidden")._value.get() >= 1
        assert c.metrics.reconcile_errors.labels("profile")._value.get() == 0
        assert _gone(lambda: ak.get(SECRETS, peer_secret_name(inst.name), bare))
