"""Peers phase -> condition Peers: the profile's peer key Secret, and which nodes may read it (issue #34).

Agents of one profile serve each other model parts over HTTP, signed with an HMAC of a key only they hold
(nodewarm/bootstrap/peers/auth.py). The controller mints that key as a Secret in spec.bootstrap.namespace
(data ``current`` and ``previous``, 32 random bytes each), rotates it every spec.weights.peers.keyRotation
(previous := current, so requests signed just before a rotation still verify), and lets exactly the profile's
nodes read it: a Role allowing ``get`` on that one Secret, and one RoleBinding per Node (User system:node:<name>)
labelled with the profile. A node reads nothing else: the Node authorizer gives kubelets no Secret a pod of theirs
does not mount, and RBAC nothing but this binding. A binding goes when its node does: owned by the Node (the
garbage collector removes it) and deleted here as well, since nothing says a garbage collector runs.

``plan`` is pure (what exists and the clock in, the actions out); ``reconcile`` reads, applies and reports. Whether
there is anything to remove once peers are off is read from the condition: a profile that never had peers is not
read at all (the controller may hold no Secret permission in its namespace, nodeclasses/peeraccess.py).
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass, field
from typing import Callable, Sequence

from kubernetes.client.exceptions import ApiException

from nodewarm.api.names import (
    MANAGED_BY, PEER_KEY_CURRENT, PEER_KEY_PREVIOUS, PEER_KEY_ROTATED_ANNOTATION, PROFILE_LABEL, peer_binding_name,
    peer_secret_name,
)
from nodewarm.api.timeutil import fmt_time_s, parse_time
from nodewarm.api.views import Condition
from nodewarm.api.warmprofile import WarmProfile
from nodewarm.nodeclasses import peeraccess

from ..events import EventSpec
from ..kube import ROLEBINDINGS, ROLES, SECRETS
from ..profiles import ProfileView
from ..shared import Manager
from .conditions import Step, warning

CONDITION = "Peers"
KEY_BYTES = 32
RBAC_GROUP = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class Node:
    name: str
    uid: str


@dataclass(frozen=True)
class Observed:
    """What exists in the bootstrap namespace: the Secret and Role as read (None: absent), the bindings by node."""

    secret: dict | None = None
    role: dict | None = None
    bindings: dict[str, dict] = field(default_factory=dict)


@dataclass(frozen=True)
class Action:
    verb: str           # mint | rotate | role | bind | unbind | remove
    kind: str           # Secret | Role | RoleBinding
    name: str
    body: dict | None = None
    resource_version: str = ""     # update guarded by it; "" creates
    node: str = ""


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    rotate_in_s: float | None      # when the key next falls due (None: peers off)


def _labels(profile: str) -> dict[str, str]:
    return {MANAGED_BY: "nodewarm", PROFILE_LABEL: profile}


def selector(profile: str) -> str:
    return ",".join(f"{k}={v}" for k, v in _labels(profile).items())


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _meta(name: str, namespace: str, profile: str, owner: dict | None, **extra) -> dict:
    md = {"name": name, "namespace": namespace, "labels": _labels(profile), **extra}
    if owner is not None:
        md["ownerReferences"] = [owner]
    return md


def profile_owner(view: ProfileView | None) -> dict | None:
    """The WarmProfile as owner of its Secret and Role: where a garbage collector runs, they go with it."""
    if view is None or not view.uid:
        return None
    return {"apiVersion": "nodewarm.io/v1alpha1", "kind": "WarmProfile", "name": view.name, "uid": view.uid}


def secret_body(profile: str, namespace: str, current: bytes, previous: bytes, now: float, owner: dict | None,
                resource_version: str = "") -> dict:
    extra = {"annotations": {PEER_KEY_ROTATED_ANNOTATION: fmt_time_s(now)}}
    if resource_version:
        extra["resourceVersion"] = resource_version
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(peer_secret_name(profile), namespace, profile, owner, **extra),
            "data": {PEER_KEY_CURRENT: _b64(current), PEER_KEY_PREVIOUS: _b64(previous)}}


def role_rules(profile: str) -> list[dict]:
    return [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
             "resourceNames": [peer_secret_name(profile)]}]


def binding_body(profile: str, namespace: str, node: Node) -> dict:
    # Owned by the Node (a cluster-scoped owner of a namespaced dependent is allowed); no blockOwnerDeletion,
    # which would need update on nodes/finalizers.
    owner = {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid}
    return {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "RoleBinding",
            "metadata": _meta(peer_binding_name(profile, node.name), namespace, profile, owner),
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": peer_secret_name(profile)},
            "subjects": [{"apiGroup": RBAC_GROUP, "kind": "User", "name": f"system:node:{node.name}"}]}


def binding_node(binding: dict) -> str:
    """The node a binding of ours lets in (its one subject, system:node:<name>)."""
    subjects = binding.get("subjects") or [{}]
    return str(subjects[0].get("name", "")).removeprefix("system:node:")


def _owner_uid(obj: dict) -> str:
    return next((o.get("uid", "") for o in obj["metadata"].get("ownerReferences") or ()), "")


def plan(profile: str, namespace: str, enabled: bool, rotation_s: float, nodes: Sequence[Node], seen: Observed,
         now: float, owner: dict | None = None, token: Callable[[int], bytes] = secrets.token_bytes) -> Plan:
    """The actions that take what exists (``seen``) to what the profile asks at ``now``."""
    if not enabled:
        out = [Action("unbind", "RoleBinding", b["metadata"]["name"], node=n) for n, b in sorted(seen.bindings.items())]
        out += [Action("remove", kind, obj["metadata"]["name"]) for kind, obj in (("Role", seen.role),
                                                                                  ("Secret", seen.secret)) if obj]
        return Plan(tuple(out), None)
    out: list[Action] = []
    name = peer_secret_name(profile)
    rotated = parse_time(((seen.secret or {}).get("metadata", {}).get("annotations") or {})
                         .get(PEER_KEY_ROTATED_ANNOTATION))
    if seen.secret is None:
        out.append(Action("mint", "Secret", name, secret_body(profile, namespace, token(KEY_BYTES), token(KEY_BYTES),
                                                              now, owner)))
        rotated = now
    elif rotated is None or now - rotated >= rotation_s:
        # An unreadable rotation time counts as due: a key of unknown age is not trusted for another interval.
        current = base64.b64decode((seen.secret.get("data") or {}).get(PEER_KEY_CURRENT, ""))
        rv = seen.secret["metadata"].get("resourceVersion", "")
        out.append(Action("rotate", "Secret", name, secret_body(profile, namespace, token(KEY_BYTES), current, now,
                                                                owner, rv), rv))
        rotated = now
    if seen.role is None or seen.role.get("rules") != role_rules(profile):
        rv = (seen.role or {}).get("metadata", {}).get("resourceVersion", "")
        md = _meta(name, namespace, profile, owner, **({"resourceVersion": rv} if rv else {}))
        out.append(Action("role", "Role", name, {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "Role", "metadata": md,
                                                 "rules": role_rules(profile)}, rv))
    want = {n.name: n for n in nodes}
    for n in sorted(want.values(), key=lambda n: n.name):
        have = seen.bindings.get(n.name)
        if have is not None and _owner_uid(have) == n.uid:
            continue
        # A node re-registered under the same name is another Node (another uid): its binding is re-owned.
        body = binding_body(profile, namespace, n)
        rv = have["metadata"].get("resourceVersion", "") if have is not None else ""
        if rv:
            body["metadata"]["resourceVersion"] = rv
        out.append(Action("bind", "RoleBinding", body["metadata"]["name"], body, rv, n.name))
    out += [Action("unbind", "RoleBinding", b["metadata"]["name"], node=node)
            for node, b in sorted(seen.bindings.items()) if node not in want]
    return Plan(tuple(out), max(0.0, rotated + rotation_s - now))


# -- the I/O --------------------------------------------------------------------------------------------------------
RESOURCES = {"Secret": SECRETS, "Role": ROLES, "RoleBinding": ROLEBINDINGS}
REASONS = {"mint": "PeerKeyMinted", "rotate": "PeerKeyRotated", "role": "PeerRoleWritten", "bind": "PeerNodeBound",
           "unbind": "PeerNodeUnbound", "remove": "PeerAccessRemoved"}


def had_peers(view: ProfileView | None) -> bool:
    """Whether this profile's peer objects may exist: the Peers condition says what was last done."""
    cond = next((c for c in (view.conditions if view else ()) if c.get("type") == CONDITION), None)
    return cond is not None and cond.get("reason") != "Disabled"


def observe(mgr: Manager, profile: str, namespace: str) -> Observed:
    k = mgr.kube

    def get(res, name):
        try:
            return k.get(res, name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    name = peer_secret_name(profile)
    items = k.list(ROLEBINDINGS, namespace, labelSelector=selector(profile))["items"]
    return Observed(get(SECRETS, name), get(ROLES, name), {binding_node(b): b for b in items})


def apply(mgr: Manager, namespace: str, action: Action) -> bool:
    """One action; False when the object was already gone (a delete) or already there (a create by a peer replica)."""
    res, k = RESOURCES[action.kind], mgr.kube
    try:
        if action.verb in ("unbind", "remove"):
            k.delete(res, action.name, namespace)
        elif action.resource_version:
            k.replace(res, action.name, action.body, namespace)
        else:
            k.create(res, action.body, namespace)
    except ApiException as e:
        if e.status == 404 and action.verb in ("unbind", "remove"):
            return False
        raise      # 409 on an update guarded by resourceVersion: the work queue retries with a fresh read
    return True


def _message(action: Action, namespace: str) -> str:
    where = f"{namespace}/{action.name}"
    return {"mint": f"minted peer key Secret {where}",
            "rotate": f"rotated peer key Secret {where} (the old key stays as {PEER_KEY_PREVIOUS})",
            "role": f"Role {where} allows get on the peer key Secret only",
            "bind": f"node {action.node} may read the peer key (RoleBinding {where})",
            "unbind": f"node {action.node} is no longer the profile's: RoleBinding {where} deleted",
            "remove": f"peers are off: {action.kind} {where} deleted"}[action.verb]


def run(mgr: Manager, view: ProfileView | None, profile: str, namespace: str, enabled: bool, rotation_s: float,
        now: float) -> tuple[Plan, list[EventSpec]]:
    """Read, plan, apply; each action carried out counted and told (events are returned to be emitted once)."""
    nodes = [Node(n.name, n.uid) for n in list(mgr.nodes.store.values()) if n.profile == profile]
    p = plan(profile, namespace, enabled, rotation_s, nodes, observe(mgr, profile, namespace), now,
             profile_owner(view))
    events: list[EventSpec] = []
    for a in p.actions:
        if not apply(mgr, namespace, a):
            continue
        mgr.metrics.peer_keys.labels(profile, a.verb).inc()
        mgr.log.info("peers." + a.verb, profile=profile, namespace=namespace, kind=a.kind, name=a.name, node=a.node)
        events.append(EventSpec("WarmProfile", profile, view.uid if view else "", REASONS[a.verb],
                                _message(a, namespace)))
    return p, events


def forbidden(view: ProfileView | None, profile: str, namespace: str, e: ApiException) -> Step:
    cond = Condition(CONDITION, "False", "Forbidden",
                     f"the controller may not manage the peer key in namespace {namespace} ({e.status} {e.reason}): "
                     f"apply the Role `nodewarm render` emits for it there ({peeraccess.NAME} in {namespace})")
    return Step(cond, events=warning(view, cond))


def reconcile(mgr: Manager, view: ProfileView | None, p: WarmProfile, now: float) -> tuple[Step | None, float | None]:
    """The phase: its Step (None when peers never were on) and in how many seconds the key falls due."""
    peers, ns = p.weights.peers, p.bootstrap.namespace
    if mgr.opt.dry_run or not (peers.enabled or had_peers(view)):
        return None, None
    try:
        result, events = run(mgr, view, p.name, ns, peers.enabled, peers.key_rotation_s, now)
    except ApiException as e:
        if e.status != 403:
            raise
        mgr.metrics.peer_keys.labels(p.name, "forbidden").inc()
        mgr.log.warning("peers.forbidden", profile=p.name, namespace=ns, error=str(e.reason))
        return forbidden(view, p.name, ns, e), None
    if not peers.enabled:
        return Step(Condition(CONDITION, "False", "Disabled", "spec.weights.peers is off: the peer key Secret, its "
                                                               f"Role and RoleBindings in {ns} are removed"),
                    events=tuple(events)), None
    bound = sum(1 for n in mgr.nodes.store.values() if n.profile == p.name)
    return Step(Condition(CONDITION, "True", "KeyShared",
                          f"peer key Secret {ns}/{peer_secret_name(p.name)} is readable by the profile's {bound} "
                          f"node(s) only; it rotates every {peers.key_rotation}"), events=tuple(events)), \
        result.rotate_in_s


def remove(mgr: Manager, view: ProfileView) -> list[EventSpec]:
    """A deleted profile's peer objects, gone (cleanup.py): the events of what was removed."""
    p = view.profile
    if p is None or mgr.opt.dry_run or not (p.weights.peers.enabled or had_peers(view)):
        return []
    try:
        return run(mgr, view, p.name, p.bootstrap.namespace, False, 0, 0.0)[1]
    except ApiException as e:
        if e.status != 403:
            raise
        mgr.log.warning("peers.forbidden", profile=p.name, namespace=p.bootstrap.namespace, error=str(e.reason))
        return list(forbidden(view, p.name, p.bootstrap.namespace, e).events)
