"""The kube-scheduler's and the kubelet's part for engine-check pods, on simulated nodes (enginenode.Node).

There is no kubelet here. The controller creates a check pod pinned to one node by required node affinity on
``metadata.name``; this does what the scheduler and then that node's kubelet would, against the real API server:

* bind it to the node its affinity names (``pods/binding``, as the scheduler does);
* run its one container as podrun runs any rendered container: the node's hostPaths, the pod's own command, args
  and env byte for byte, from the pod object the API server returns (so what the controller created is what runs),
  with the runtime's additions (CPU node settings, the credentials Pod Identity would inject);
* report it Running, then terminated with its exit code and termination message (``pods/status``, with the node's
  own identity, as a kubelet writes it), which is what the node agent reads.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from nodewarm.api import enginecheck
from nodewarm.api.timeutil import fmt_time_s

from . import podrun


def _bound_node(pod: dict) -> str | None:
    """The node a required node affinity on metadata.name pins the pod to (as DaemonSet pods are pinned)."""
    aff = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {})
    terms = (aff.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or ()
    for term in terms:
        for f in term.get("matchFields") or ():
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and f.get("values"):
                return f["values"][0]
    return pod["spec"].get("nodeName")


@dataclass
class Ran:
    """One check pod as this stand-in ran it."""
    name: str
    node: str
    exit_code: int | None
    message: str
    log: str


@dataclass
class CheckPods:
    """Runs the check pods of ``namespace`` on the simulated ``nodes`` (name -> enginenode.Node) until stopped."""
    kube: object                       # testenv.kube.KubeCluster: node tokens for the kubelet's writes
    k: object                          # nodewarm.controller.kube.Kube as admin: the scheduler's binding
    namespace: str
    profile: str
    nodes: dict
    configmaps: dict[str, dict]
    work: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    ran: list[Ran] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "CheckPods":
        self._thread = threading.Thread(target=self._loop, name="check-pods", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _loop(self) -> None:
        from nodewarm.controller.kube import PODS

        done: set[str] = set()
        while not self._stop.wait(0.5):
            pods = self.k.list(PODS, self.namespace, labelSelector=enginecheck.label_selector(self.profile))
            for pod in pods.get("items") or ():
                name = pod["metadata"]["name"]
                node = _bound_node(pod)
                if name in done or node not in self.nodes or pod["metadata"].get("deletionTimestamp"):
                    continue
                done.add(name)
                self.ran.append(self._run(pod, node))

    def _node_kube(self, node: str):
        from nodewarm.controller.kube import Kube

        return Kube(self.kube.api_client(self.kube.node_token(node)))

    def _status(self, kk, pod: dict, phase: str, state: dict) -> None:
        from nodewarm.controller.kube import PODS

        st = {"name": enginecheck.CONTAINER, "image": pod["spec"]["containers"][0]["image"], "imageID": "",
              "ready": False, "restartCount": 0, "state": state}
        kk.merge_patch(PODS, pod["metadata"]["name"], {"status": {"phase": phase, "containerStatuses": [st]}},
                       sub="status", namespace=self.namespace)

    def _run(self, pod: dict, node_name: str) -> Ran:
        from nodewarm.controller.kube import PODS

        name = pod["metadata"]["name"]
        self.k.request("POST", PODS.path(name, self.namespace, "binding"),
                       body={"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                             "target": {"apiVersion": "v1", "kind": "Node", "name": node_name}})
        node = self.nodes[node_name]
        kk = self._node_kube(node_name)
        started = fmt_time_s(time.time())
        run = podrun.start(pod["spec"], enginecheck.CONTAINER, node_root=node.root, work=self.work / name,
                           configmaps=self.configmaps, extra_env={**node.runtime_env, **self.extra_env},
                           pod_name=name, namespace=self.namespace, node_name=node_name)
        self._status(kk, pod, "Running", {"running": {"startedAt": started}})
        code = run.proc.wait()
        message = run.termination_message()
        run.stop()
        self._status(kk, pod, "Succeeded" if code == 0 else "Failed",
                     {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                     "message": message, "startedAt": started,
                                     "finishedAt": fmt_time_s(time.time())}})
        return Ran(name, node_name, code, message, run.text())
