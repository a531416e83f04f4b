"""Helpers shared by the controller tests: profiles installed on the real API server, a running
controller, polling waits with short timeouts (the faults in front of the API server are support.kubefaults)."""

from __future__ import annotations

import contextlib
import time
import uuid

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodewarm import instancetypes, profile
from nodewarm.controller.kube import (
    AUTOMODE_NODECLASSES, EC2NODECLASSES, EVENTS, NODECLAIMS, NODEPOOLS, NODES, WARMPROFILES, Kube,
)
from nodewarm.controller.manager import Controller
from nodewarm.controller.options import ControllerOptions
from nodewarm.nodeclasses import automode, ec2nodeclass, nodepool, render
from support.builders import USER_MIME, v

TAINT = "nodewarm.io/warming"


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def wait_for(check, timeout_s: float = 10.0, what: str = "condition", interval_s: float = 0.03):
    """Poll ``check`` until it returns a truthy value (returned); fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except ApiException as e:
            last = e
        else:
            if last:
                return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def taint_keys(k: Kube, node: str) -> list[str]:
    return [t["key"] for t in k.get(NODES, node)["spec"].get("taints") or ()]


def events_for(k: Kube, kind: str, name: str) -> list[dict]:
    items = k.list(EVENTS, "default", fieldSelector=f"involvedObject.name={name}")["items"]
    return [e for e in items if e["involvedObject"]["kind"] == kind]


class Installed:
    """A WarmProfile with its NodeClass and NodePool, as a user would have them before the controller runs."""

    def __init__(self, k: Kube, mode: str = "karpenter", user_data: str | None = USER_MIME, deadline: str = "20m",
                 on_deadline: str = "untaint", inject_ready: bool = False, create_profile_object: bool = True,
                 user_startup_taints: tuple[dict, ...] = ({"key": "example.com/agent", "effect": "NoExecute"},),
                 manager: str | None = None, **spec):
        """``manager``: the user's objects are server-side applied by that field manager (a GitOps tool)
        instead of created; ``spec``: more profile fields, as for profiles.v (``spec__injection__onLive=...``)."""
        self.k = k
        name = uniq(f"wp{mode[:2]}")
        self.doc = v(mode, metadata__name=name, spec__nodes__nodePool=f"{name}-pool",
                     spec__nodes__nodeClass=f"{name}-class", spec__readiness__deadline=deadline,
                     spec__readiness__onDeadline=on_deadline, **spec)
        self.profile = profile.from_dict(self.doc)
        types = instancetypes.lookup(list(self.profile.nodes.instance_types))
        # The same renderers `nodewarm render` uses (not the whole render: no DaemonSet/vLLM needed here).
        if mode == "automode":
            self.nodeclass = automode.render(self.profile, types)
        else:
            self.nodeclass = ec2nodeclass.render(self.profile, render.node_user_data(self.profile, None)[0])
        self.nodepool = nodepool.render(self.profile)
        self.nc_res = AUTOMODE_NODECLASSES if mode == "automode" else EC2NODECLASSES
        if not inject_ready:
            # What the user had before nodewarm: their own user data, no RAID0 / sizes, their startup taints.
            spec = self.nodeclass["spec"]
            if mode == "automode":
                spec.pop("ephemeralStorage", None)
            else:
                spec.pop("instanceStorePolicy", None)
                spec["userData"] = user_data
                if user_data is None:
                    spec.pop("userData")
            tspec = self.nodepool["spec"]["template"]["spec"]
            tspec["startupTaints"] = [dict(t) for t in user_startup_taints]
            if not user_startup_taints:
                del tspec["startupTaints"]      # unset, not an empty list someone owns
        self.manager = manager
        if manager:
            from nodewarm.kubeapply import apply

            apply(k.api, [self.nodeclass, self.nodepool], field_manager=manager)
        else:
            k.create(self.nc_res, self.nodeclass)
            k.create(NODEPOOLS, self.nodepool)
        self.profile_object = None
        if create_profile_object:
            self.profile_object = k.create(WARMPROFILES, render.warmprofile_document(self.profile))

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def pool(self) -> str:
        return self.profile.nodes.node_pool

    @property
    def node_class(self) -> str:
        return self.profile.nodes.node_class

    def cleanup(self) -> None:
        for c in self.k.list(NODECLAIMS)["items"]:
            if c["metadata"].get("labels", {}).get("karpenter.sh/nodepool") == self.pool:
                _delete(self.k, NODECLAIMS, c["metadata"]["name"], finalized=True)
        for n in self.k.list(NODES)["items"]:
            if n["metadata"].get("labels", {}).get("karpenter.sh/nodepool") == self.pool:
                _delete(self.k, NODES, n["metadata"]["name"], finalized=True)
        if self.profile_object is not None:
            # No controller may be running any more to honour its finalizer.
            try:
                self.k.merge_patch(WARMPROFILES, self.name, {"metadata": {"finalizers": None}})
            except ApiException as e:
                if e.status != 404:
                    raise
            _delete(self.k, WARMPROFILES, self.name)
        _delete(self.k, NODEPOOLS, self.pool)
        _delete(self.k, self.nc_res, self.node_class)


def _delete(k: Kube, res, name: str, finalized: bool = False) -> None:
    """Delete; with ``finalized`` also drop the finalizers (the stand-in's Karpenter is not running)."""
    try:
        k.delete(res, name)
        if finalized:
            k.merge_patch(res, name, {"metadata": {"finalizers": None}})
    except ApiException as e:
        if e.status != 404:
            raise


@contextlib.contextmanager
def installed(k: Kube, **kw):
    inst = Installed(k, **kw)
    try:
        yield inst
    finally:
        inst.cleanup()


def options(**kw) -> ControllerOptions:
    base = dict(watch_timeout_s=20, workers=2, retry_period_s=0.3, lease_duration_s=2, renew_deadline_s=1.5)
    base.update(kw)
    return ControllerOptions(**base)


@contextlib.contextmanager
def running(api_client, **kw):
    c = Controller(api_client, options(**kw)).start()
    try:
        assert c.wait_synced(20), "controller caches did not sync"
        yield c
    finally:
        c.stop()


def client_for(server: str, token: str, ca_file: str | None = None) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = server
    if ca_file:
        cfg.ssl_ca_cert = ca_file
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


# The WarmProfile conditions the controller writes, read back.
def condition(k, name):
    conds = (k.get(WARMPROFILES, name).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "Injected"), None)


def wait_reason(k, name, reason, timeout_s=15):
    return wait_for(lambda: (c := condition(k, name)) and c["reason"] == reason and c, timeout_s,
                    what=f"Injected reason {reason} (now {condition(k, name)})")


def cleanup_condition(k, name):
    conds = (k.get(WARMPROFILES, name).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "Cleanup"), None)
