"""The engine check's whole path on this machine, for its engine tests and its bench: real API server, controller,
node agents, check pods run with real vLLM.

Each part acts with the identity it really has: the controller as its ServiceAccount (its shipped RBAC and the Role
`nodewarm render` adds for the check, a minted token), each node agent as its node (kubelet token, NodeRestriction
on), the check pod's container with what the kubelet and Pod Identity give it (checkpods.py plays the scheduler's
binding and the kubelet). ``check_node`` is one node's life up to Warm: its Node object under the startup taint, its
agent's ``run`` (weights from S3, the compile-cache restore, the request, the answer), the controller's Event and
clean-up after it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from nodewarm import instancetypes, profile
from nodewarm.api import enginecheck as contract
from nodewarm.api.decisions import EventReason
from nodewarm.api.names import NODEPOOL_LABEL, WARM_CONDITION
from nodewarm.kubeapply import apply

from . import enginenode
from .checkpods import CheckPods, Ran


@dataclass
class Checked:
    """One node's warm-up as it ended."""
    node: enginenode.Node
    p: object                      # the WarmProfile it warmed for
    result: object                 # agent.AgentResult
    ran: list[Ran]                 # the check pods run on it
    warm: dict                     # its Warm condition
    outcome: object                # its nodewarm.io/engine-check, read back (api.enginecheck)
    events: list[str]              # "Reason: message" of the Events on its Node
    pods_left: list[str]           # check pods still there once the controller cleaned up
    seconds: float                 # the agent's run, start to report

    def engine_log(self) -> str:
        return "\n".join(r.log for r in self.ran)


def _ns(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


@dataclass
class CheckCluster:
    kube: object                   # testenv.kube.KubeCluster
    k: object                      # nodewarm.controller.kube.Kube as admin
    ctrl_ns: str
    s3_env: dict[str, str]         # what Pod Identity would give the check pod (the local server's keys)
    tmp: Path

    @classmethod
    @contextlib.contextmanager
    def start(cls, kube, k, doc: dict, s3_env: dict[str, str], tmp: Path):
        """The profile ``doc`` installed as a user would have it (WarmProfile, NodePool, NodeClass, what `nodewarm
        render` prints for the check) and the controller running as its ServiceAccount."""
        from nodewarm.controller.manager import Controller
        from nodewarm.controller.options import ControllerOptions
        from nodewarm.nodeclasses import ec2nodeclass, nodepool, render

        p = profile.from_dict(doc)
        ctrl_ns = f"nodewarm-{uuid.uuid4().hex[:6]}"
        api = kube.api_client(kube.controller_token(ctrl_ns))
        apply(k.api, [_ns(p.serving.namespace), ec2nodeclass.render(p, render.node_user_data(p, None)[0]),
                      nodepool.render(p), render.warmprofile_document(p)])
        cluster = cls(kube, k, ctrl_ns, s3_env, tmp)
        cluster.apply_profile(doc)
        opts = ControllerOptions(watch_timeout_s=20, workers=2, retry_period_s=0.3, lease_duration_s=2,
                                 renew_deadline_s=1.5)
        c = Controller(api, opts).start()
        try:
            if not c.wait_synced(30):
                raise RuntimeError("the controller's caches did not sync")
            yield cluster
        finally:
            c.stop()

    def apply_profile(self, doc: dict):
        """What a user does to change the profile: the WarmProfile and the engine check's objects re-applied."""
        from nodewarm.nodeclasses import enginecheck, render

        p = profile.from_dict(doc)
        types = instancetypes.lookup(list(p.nodes.instance_types))
        apply(self.k.api, [render.warmprofile_document(p),
                           *enginecheck.manifests(p, types, controller_namespace=self.ctrl_ns)])
        return p

    def check_node(self, doc: dict, node_name: str, label: str, runtime_env: dict[str, str] | None = None) -> Checked:
        """``node_name`` must be one of the API server's kubelet identities (testenv.kube node tokens)."""
        from nodewarm.bootstrap import agent, followplan, profilesource
        from nodewarm.controller.kube import EVENTS, NODES, PODS

        p = profile.from_dict(doc)
        k = self.k
        with contextlib.suppress(Exception):
            k.delete(NODES, node_name)
        created = k.create(NODES, {"metadata": {"name": node_name, "labels": {NODEPOOL_LABEL: p.nodes.node_pool}},
                         "spec": {"providerID": f"aws:///us-west-2a/i-{label}-{uuid.uuid4().hex[:6]}",
                                  "taints": [{"key": p.readiness.taint_key, "effect": "NoSchedule"}]}})
        uid = created["metadata"]["uid"]
        node = enginenode.Node(node_name, self.tmp / f"node-{label}",
                               runtime_env or {**enginenode.CPU_RUNTIME_ENV, **enginenode.EVIDENCE_ENV})
        _, configmaps, _ = enginenode.rendered_pod(p)
        pods = CheckPods(self.kube, k, p.serving.namespace, p.name, {node_name: node}, configmaps,
                         self.tmp / f"pods-{label}", extra_env=self.s3_env).start()
        start = time.monotonic()
        try:
            mount = node.host(p.nodes.cache_mount)
            opts = followplan.FollowOptions(profile=p.name, mount=mount, node_name=node_name, allow_non_nvme=True)
            cfg = followplan.agent_config(profilesource.resolve(doc, mount), opts)
            # No image pre-pull pod and no device plugin here: the serving image is this machine's .venv-serving and
            # the "GPUs" are its CPU; both waits are the agent's own business, tested apart (test_agent.py).
            cfg = dataclasses.replace(cfg, serving_image=None, gpu_wait_s=0.0)
            result = agent.run(cfg, self.kube.api_client(self.kube.node_token(node_name)))
        finally:
            seconds = time.monotonic() - start
            pods.stop()
        got = k.get(NODES, node_name)
        warm = next(c for c in got["status"]["conditions"] if c["type"] == WARM_CONDITION)
        outcome = contract.read_annotation((got["metadata"].get("annotations") or {}).get(contract.REQUEST_ANNOTATION))
        want = EventReason.ENGINE_CHECK_PASSED if result.warm else EventReason.ENGINE_CHECK_FAILED
        deadline = time.monotonic() + (30 if p.readiness.engine_check.enabled else 0)
        while True:                             # the controller's Event and its clean-up follow the outcome
            events = [e for e in k.list(EVENTS, "default", fieldSelector=f"involvedObject.name={node_name}")["items"]
                      if e["involvedObject"].get("uid") == uid]        # this Node, not an earlier one of its name
            left = [x["metadata"]["name"] for x in k.list(PODS, p.serving.namespace,
                                                         labelSelector=contract.label_selector(p.name))["items"]]
            if (any(e["reason"] == want for e in events) and not left) or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        return Checked(node, p, result, list(pods.ran), warm, outcome,
                       [f"{e['reason']}: {e['message']}" for e in events], left, seconds)

    def delete_node(self, node_name: str) -> None:
        from nodewarm.controller.kube import NODES

        with contextlib.suppress(Exception):
            self.k.delete(NODES, node_name)
