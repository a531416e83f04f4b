"""Fixtures of the node agent's tests: a fault proxy in front of the local S3 server, the agent's RBAC as rendered,
its WarmProfile as an object in the real API server, and the kubelet's part of the image pre-pull."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from nodewarm.controller.kube import NODES, WARMPROFILES
from nodewarm.kubeapply import apply
from nodewarm import profile
from nodewarm.api import prepullpod
from nodewarm.nodeclasses import agentaccess, prepull
from nodewarm_dev.testenv.karpenter import KarpenterSim
from support.bootstrap_fixtures import proxied


@pytest.fixture
def proxy(s3, monkeypatch):
    """A fault proxy in front of the rclone server, with the AWS environment pointing at it."""
    yield from proxied(s3, monkeypatch)


@pytest.fixture(scope="session")
def agent_rbac(admin):
    """The RBAC `nodewarm render` emits for AL2023 nodes: group system:nodes may get/watch warmprofiles."""
    apply(admin, agentaccess.node_rbac())
    return admin


@pytest.fixture
def warmprofile(k, agent_rbac):
    """put(doc): create or replace a WarmProfile as the user would; every one made is deleted afterwards."""
    made = []

    def put(doc: dict) -> dict:
        name = doc["metadata"]["name"]
        try:
            cur = k.get(WARMPROFILES, name)
            body = {**doc, "metadata": {**doc["metadata"], "resourceVersion": cur["metadata"]["resourceVersion"]}}
            return k.replace(WARMPROFILES, name, body)
        except ApiException as e:
            if e.status != 404:
                raise
        made.append(name)
        return k.create(WARMPROFILES, doc)

    yield put
    for name in made:
        try:
            k.delete(WARMPROFILES, name)
        except ApiException:
            pass


@pytest.fixture
def kubelet_pulls(admin):
    """pull(doc, node): the profile's image pre-pull DaemonSet applied as rendered, then the DaemonSet
    controller's and ``node``'s kubelet's part (nothing runs containers here): the node's pod for the current
    template replaces any older one, and its status names the image with an imageID, as after a real pull.
    The agent waits for exactly that before it reports Warm."""
    from kubernetes import client

    core, made = client.CoreV1Api(admin), []

    def pull(doc: dict, node: str) -> dict:
        p = profile.from_dict(doc)
        ns, ds = p.bootstrap.namespace, prepullpod.daemonset_name(p.name)
        apply(admin, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, prepull.daemonset(p)])
        for old in core.list_namespaced_pod(ns, label_selector=prepullpod.label_selector(p.name),
                                            field_selector=f"spec.nodeName={node}").items:
            core.delete_namespaced_pod(old.metadata.name, ns, grace_period_seconds=0)
        pod = KarpenterSim(admin).run_daemonset_pod(node, ns, ds)
        made.append((ns, p.name))
        return pod

    yield pull
    for ns, name in set(made):
        for pod in core.list_namespaced_pod(ns, label_selector=prepullpod.label_selector(name)).items:
            try:
                core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
            except ApiException:
                pass



@pytest.fixture
def grant_peer_key(kube, k):
    """grant(profile, nodes): the controller's peer-key reconcile (warmprofile/peerkeys.py: observe, plan, apply) for
    ``profile`` with ``nodes`` (names), run as the controller's ServiceAccount with exactly the RBAC it ships (its
    ClusterRole and the Role `nodewarm render` emits in the bootstrap namespace), so the agents read the key as the
    controller mints and binds it; its objects go afterwards, as when peers are turned off."""
    import time
    from types import SimpleNamespace

    from nodewarm.controller import manifests
    from nodewarm.controller.kube import Kube
    from nodewarm.controller.warmprofile import peerkeys
    from nodewarm.nodeclasses import peeraccess
    from nodewarm.userdata import daemonset
    from support.controller_fixtures import uniq
    from support.rbac import apply_replacing

    ctl, granted, as_controller = uniq("nodewarm"), [], {}

    def reconcile(p, nodes, enabled=True):
        ns = p.bootstrap.namespace
        if ns not in as_controller:  # what an install and `nodewarm render | kubectl apply` put in place
            apply_replacing(k, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ctl}},
                                daemonset.namespace_doc(ns), *manifests.rbac(ctl),
                                *peeraccess.controller_rbac(ns, ctl)])
            as_controller[ns] = SimpleNamespace(kube=Kube(kube.api_client(kube.service_account_token(
                ctl, manifests.NAME))))
        mgr = as_controller[ns]
        uids = [peerkeys.Node(n, k.get(NODES, n)["metadata"]["uid"]) for n in nodes]
        todo = peerkeys.plan(p.name, ns, enabled, p.weights.peers.key_rotation_s, uids,
                             peerkeys.observe(mgr, p.name, ns), time.time())
        for action in todo.actions:
            peerkeys.apply(mgr, ns, action)

    def grant(p, nodes):
        granted.append(p)
        reconcile(p, nodes)

    yield grant
    for p in granted:
        reconcile(p, [], enabled=False)
