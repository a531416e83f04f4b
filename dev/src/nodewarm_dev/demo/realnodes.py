"""The demo's nodes for real: each a kubelet v1.20.2 with its own containerd (nodewarm_dev.testenv.realnode), its
pods run from nodewarm's images (scripts/build-images.sh) pulled from a registry on 127.0.0.1: vLLM in a container.

What changes against the played nodes (podrun):
* a node is a kubelet registering with Karpenter's registration taints (realnode.from_nodeclaim); the stand-in's
  ``mark_registered`` then registers it as Karpenter does. The profile is Auto Mode's, so the agent is the rendered
  DaemonSet's pod from the nodewarm image (``follow_agent`` reads what it says); the node's NVMe mount is a host
  folder (``host_dirs``), which the agent's and the vLLM pod's hostPaths share;
* the image pre-pull is the kubelet's, through the CRI, while the agent warms; the baseline's nodes pull the serving
  image when their pod lands, as a node without nodewarm does;
* the pods get what the runtime would give them (``runtime_env``): the Pod Identity credentials and an S3 endpoint
  (a ClusterIP carried by realnode's ``services``) and the engine's cache log lines; the ServiceAccount token is the
  kubelet's projection (the API server runs ``in_cluster``); the signing key is a Secret;
* a pod's times are its own: started when the kubelet started its first container, ready at /health's first 200
  on the pod's IP, then the first completion; nothing is shifted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from nodewarm import logs
from nodewarm.api import views
from nodewarm.api.names import TIMELINE_ANNOTATION, WARM_CONDITION
from nodewarm.api.timeutil import parse_time
from nodewarm.controller.kube import EVENTS, NODES, PODS, Kube
from nodewarm.nodeclasses import prepull
from nodewarm_dev.testenv import agentpod, enginenode, podrun, realnode, vllmclient
from nodewarm_dev.testenv import kube as kubeenv
from nodewarm_dev.testenv import registry as registry_server

from . import engine as vllm_engine
from . import live

log = logs.get("demo.realnodes")

BUILD_SCRIPT = podrun.REPO / "scripts" / "build-images.sh"
POD_TIMEOUT_S = 900
# One CRI log line: time, stream, P(artial)|F(ull), text (the kubelet's container log format).
_CRI_LINE = re.compile(r"^\S+ (?:stdout|stderr) ([PF]) ?(.*)$")


def unavailable() -> str | None:
    """Why the demo's nodes cannot be real on this machine, in one line; None when they can."""
    if os.geteuid() != 0:
        return f"not root (uid {os.geteuid()}): containerd and the kubelet need root"
    try:
        realnode.preflight()
    except realnode.RealNodeUnavailable as e:
        return str(e).splitlines()[0]
    if not BUILD_SCRIPT.is_file():
        return f"no {BUILD_SCRIPT} (the images are built from a checkout)"
    return None


def build_images() -> tuple[str, str]:
    """This checkout's nodewarm and serving images (built once by scripts/setup.sh; seconds when up to date)."""
    r = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1800)
    if r.returncode:
        raise RuntimeError(f"scripts/build-images.sh failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    nodewarm, serving = r.stdout.split()[-2:]
    return nodewarm, serving


def cri_log_text(path: Path) -> str:
    """A container's log as the process wrote it (the kubelet's CRI log lines, partial lines joined)."""
    out, cur = cri_lines(path.read_bytes())
    return "\n".join(out + ["".join(cur)] if cur else out)


def cri_lines(data: bytes, cur: list[str] | None = None) -> tuple[list[str], list[str]]:
    """The whole lines the process wrote in ``data`` (CRI log lines, ending in a newline), and the pieces of a line
    not yet finished (``cur``: carried into the next call)."""
    out, cur = [], list(cur or ())
    # Bytes split on newlines only: a progress bar's carriage returns are inside its lines (read_text and
    # splitlines would cut there).
    for line in data.decode(errors="replace").split("\n"):
        m = _CRI_LINE.match(line)
        if not m:
            continue
        cur.append(m.group(2))
        if m.group(1) == "F":
            out.append("".join(cur))
            cur = []
    return out, cur


@dataclass
class RealNodes:
    """The demo's real nodes, the registry and the images in it; ``stop`` stops every node and the registry. The
    nodes run under ``nodes_root``, a short folder of their own: the kubelet's unix sockets there must fit in 107
    bytes, which a ``--workdir`` or a test's folder may not leave room for. A node that leaves keeps its logs in
    ``work/nodes/NAME``."""
    cluster: kubeenv.KubeCluster
    s3_endpoint: str
    work: Path
    registry: registry_server.Registry
    nodewarm_image: str
    serving_image: str
    nodes: dict[str, realnode.RealNode] = field(default_factory=dict)
    nodes_root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="nw-nodes-")))

    @classmethod
    def start(cls, cluster: kubeenv.KubeCluster, s3_endpoint: str, work: Path) -> "RealNodes":
        local_nodewarm, local_serving = build_images()
        reg = registry_server.start(work / "registry")
        try:
            refs = []
            for local, flags in ((local_nodewarm, []), (local_serving, ["--disable-compression"])):
                ref = f"{reg.host}/{local.split('/', 1)[1]}"
                subprocess.run(["buildah", "push", "--quiet", "--tls-verify=false", *flags, local, f"docker://{ref}"],
                               check=True, capture_output=True, timeout=900)
                refs.append(ref)
        except BaseException:
            reg.stop()
            raise
        return cls(cluster, s3_endpoint, work, reg, refs[0], refs[1])

    def join(self, name: str, *, claim: dict | None = None, host_dirs: dict[str, Path] | None = None,
             labels: dict[str, str] | None = None, gpus: str | None = None,
             runtime_handlers: dict[str, Path] | None = None) -> realnode.RealNode:
        """Start a real node: of a launched NodeClaim (its providerID, labels and registration taints), or a bare
        one with ``labels``. GPUs, when named, are advertised as the device plugin would; ``runtime_handlers`` go
        to its containerd (the snapshot handler the AL2023 user data installs)."""
        kw = realnode.from_nodeclaim(claim) if claim else {"labels": labels or {}}
        node = realnode.start(self.cluster, name, self.nodes_root / name, **kw,
                              registries={self.registry.host: self.registry.url}, host_dirs=host_dirs or {},
                              services={kubeenv.KUBERNETES_SERVICE: self.cluster.server.removeprefix("https://"),
                                        kubeenv.S3_SERVICE: self.s3_endpoint.removeprefix("http://")},
                              runtime_handlers=runtime_handlers)
        self.nodes[name] = node
        # The prepull DaemonSet's main container: no registry is reachable here, so each node holds a pause image
        # under the renderer's name for it, as an EKS AMI holds its own.
        node.ctr("images", "tag", realnode.PAUSE_IMAGE, prepull.PAUSE_IMAGE)
        gpus = gpus or (claim and claim["metadata"]["labels"].get("karpenter.k8s.aws/instance-gpu-count"))
        if gpus:
            node.advertise({"nvidia.com/gpu": gpus})
        return node

    def leave(self, name: str) -> None:
        node = self.nodes.pop(name, None)
        if node:
            node.stop()
            # What is left of it is its logs (stop removes containerd's and the kubelet's data).
            try:
                (self.work / "nodes").mkdir(parents=True, exist_ok=True)
                shutil.move(str(node.workdir), str(self.work / "nodes" / name))
            except OSError as e:        # the logs are a convenience; the run goes on
                log.warning("demo.realnode.logs_not_kept", node=name, workdir=str(node.workdir), error=str(e))

    def stop(self) -> None:
        for name in list(self.nodes):
            try:
                self.leave(name)
            except Exception as e:      # every node is stopped, whatever one of them says
                log.warning("demo.realnode.stop_failed", node=name, error=str(e))
        self.registry.stop()
        shutil.rmtree(self.nodes_root, ignore_errors=True)


def runtime_env(s3_env: dict[str, str]) -> dict[str, str]:
    """What the runtime gives each demo pod on these nodes: the Pod Identity credentials, the S3 Service's endpoint,
    and Inductor's cache log lines (the engine's evidence). The CPU engine's settings are the image's."""
    return {**agentpod.s3_env(s3_env), **enginenode.EVIDENCE_ENV}


def _status(k: Kube, namespace: str, pod: str) -> dict:
    return k.get(PODS, pod, namespace).get("status") or {}


def _container(status: dict, name: str) -> dict | None:
    return next((c for c in status.get("containerStatuses") or () if c["name"] == name), None)


def _log_file(node: realnode.RealNode, namespace: str, pod: str, container: str) -> Path | None:
    return next(iter(sorted(node.log_dir.glob(f"{namespace}_{pod}_*/{container}/*.log"))), None)


def container_text(node: realnode.RealNode, namespace: str, pod: str, container: str) -> str:
    f = _log_file(node, namespace, pod, container)
    return cri_log_text(f) if f else ""


def _task_pids(node: realnode.RealNode, container_ids: list[str]) -> set[int]:
    """The host PIDs of these containers' first processes (their children share their process group)."""
    pids = set()
    for line in node.ctr("tasks", "list").splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 2 and parts[0] in container_ids and parts[1].isdigit():
            pids.add(int(parts[1]))
    return pids


# The agent's log lines that carry what its report on stdout would (run.bootstrap_node reads that report instead).
_REPORTED = {"weights.done": "weights", "weights.storage": "storage", "agent.compile_cache": "compileCache"}


def follow_agent(k: Kube, node: realnode.RealNode, namespace: str, on_start: Callable[[int | None], None],
                 on_line: Callable[[dict | None, str], None], timeout_s: float = POD_TIMEOUT_S) -> dict:
    """The agent DaemonSet's pod on ``node``, as its kubelet runs it: ``on_start`` gets its process's host PID once
    its container runs, ``on_line`` each line it logs (parsed JSON or None, the text) as the kubelet writes them,
    until the agent's Warm condition on the Node is True. Raises on Warm=False (the agent's reason and message) and
    on ``timeout_s``. Returns what the agent reported: ``timeline`` (the Node's annotation), ``weights`` (its
    ``weights.done`` line), ``storage`` (its ``weights.storage`` line), ``compileCache`` (its ``agent.compile_cache``
    line for the profile's model) and ``pod``."""
    end = time.time() + timeout_s
    pod = log_file = None
    started = False
    offset, cur = 0, []
    report: dict = dict.fromkeys(_REPORTED.values())

    def read_log() -> None:
        nonlocal offset, cur
        with open(log_file, "rb") as f:
            f.seek(offset)
            data = f.read()
        data = data[:data.rfind(b"\n") + 1]       # whole CRI lines only: the kubelet may be mid-line
        offset += len(data)
        lines, cur = cri_lines(data, cur)
        for line in lines:
            doc = live.parse_line(line)
            if doc and doc.get("event") in _REPORTED and "model" not in doc:   # "model": a further model's
                report[_REPORTED[doc["event"]]] = doc
            on_line(doc, line)

    while True:
        if pod is None:
            pod = (agentpod.on_node(k, namespace, node.name) or {}).get("metadata", {}).get("name")
        if pod and not started:
            st = next(iter(_status(k, namespace, pod).get("containerStatuses") or ()), {})
            if st.get("state", {}).get("running") and st.get("containerID"):
                started = True
                on_start(next(iter(_task_pids(node, [st["containerID"].removeprefix("containerd://")])), None))
        if pod and log_file is None:
            log_file = next(iter(sorted(node.log_dir.glob(f"{namespace}_{pod}_*/*/*.log"))), None)
        if log_file is not None:
            read_log()
        n = k.get(NODES, node.name)
        cond = views.condition(n, WARM_CONDITION)
        if cond and cond.status == "True":
            if log_file is not None:
                time.sleep(0.5)          # the lines the agent wrote before its report, as the kubelet flushes them
                read_log()
            return {**report, "pod": pod, "timeline": json.loads(
                (n["metadata"].get("annotations") or {}).get(TIMELINE_ANNOTATION) or "{}")}
        if cond and cond.status == "False":
            raise RuntimeError(f"the agent pod {namespace}/{pod} on {node.name} reported Warm=False: {cond.reason}: "
                               f"{cond.message}")
        if time.time() > end:
            raise RuntimeError(f"the agent on {node.name} did not report Warm in {timeout_s:.0f}s (its pod: {pod})")
        time.sleep(0.25)


def serve(k: Kube, node: realnode.RealNode, namespace: str, pod: str, port: int, model: str, *,
          with_publisher: bool, wait_for: str = "verdict") -> vllm_engine.Served:
    """A demo pod the kubelet runs: wait until its vllm container runs, then until it answers /health on the pod's
    IP, ask for the first completion, and (``with_publisher``) wait for the publisher sidecar's verdict or publish,
    as ``engine.serve`` does for a played pod. Its start is when the kubelet started its first container."""
    end = time.time() + POD_TIMEOUT_S
    while True:
        status = _status(k, namespace, pod)
        vllm = _container(status, vllm_engine.VLLM_CONTAINER)
        if vllm and (vllm["state"].get("running") or vllm["state"].get("terminated")) and status.get("podIP"):
            break
        if time.time() > end:
            raise RuntimeError(f"pod {namespace}/{pod} on {node.name}: its vllm container did not start in "
                               f"{POD_TIMEOUT_S}s: {status}")
        time.sleep(1)
    firsts = [(c.get("state", {}).get("running") or c.get("state", {}).get("terminated") or {}).get("startedAt")
              for c in (status.get("initContainerStatuses") or []) + status["containerStatuses"]]
    started = min(parse_time(s) for s in firsts if s)
    ids = [c["containerID"].removeprefix("containerd://") for c in status["containerStatuses"] if c.get("containerID")]
    rss = vllm_engine.RssPeak(_task_pids(node, ids))
    base = f"http://{status['podIP']}:{port}"
    text = lambda c=vllm_engine.VLLM_CONTAINER: container_text(node, namespace, pod, c)  # noqa: E731

    def alive() -> bool:
        st = _container(_status(k, namespace, pod), vllm_engine.VLLM_CONTAINER) or {}
        return not st.get("state", {}).get("terminated")

    try:
        vllmclient.wait_ready(base, timeout=POD_TIMEOUT_S, alive=alive, log_tail=text)
        ready = time.time()
        answer = vllmclient.complete(base, model)
        done = time.time()
        verdict = published = None
        if with_publisher:
            want = vllm_engine.publisher_reported if wait_for == "verdict" else vllm_engine.publisher_published
            until = time.time() + vllm_engine.VERDICT_TIMEOUT_S
            while want(pub := text(vllm_engine.PUBLISHER_CONTAINER)) is None:
                if time.time() > until:
                    raise RuntimeError(f"the publisher sidecar of {pod} on {node.name} gave no {wait_for}; its log "
                                       f"ends:\n{pub[-3000:]}")
                time.sleep(0.5)
            verdict, published = vllm_engine.publisher_verdict(pub), vllm_engine.publisher_published(pub)
    finally:
        peak = rss.stop()
    ev = vllm_engine.evidence(text())
    served = vllm_engine.Served(pod, node.name, started, ready, done, answer["choices"][0]["text"], ev, peak,
                                _log_file(node, namespace, pod, vllm_engine.VLLM_CONTAINER), rss.load, verdict,
                                published)
    log.info("demo.engine.served", pod=pod, node=node.name, real_node=True, boot_s=round(served.boot_s, 3),
             first_completion_s=round(served.first_completion_s, 3), vllm_compile=ev.verdict(),
             evidence=ev.to_dict(), peak_rss_mb=round(peak / 1e6), load_avg=served.load_avg, publisher=verdict)
    return served


def delete_pod(k: Kube, namespace: str, pod: str, timeout_s: float = 120) -> None:
    """Delete and wait until it is gone: the next engine starts only once this one's cores are free."""
    k.delete(PODS, pod, namespace)
    end = time.time() + timeout_s
    while time.time() < end:
        try:
            k.get(PODS, pod, namespace)
        except Exception:           # 404: gone
            return
        time.sleep(0.5)
    raise RuntimeError(f"pod {namespace}/{pod} still there {timeout_s:.0f}s after its deletion")


def pulled_events(k: Kube, namespace: str, pod: str) -> dict[str, str]:
    """The kubelet's Pulled Events of a pod, by container field path (``spec.containers{vllm}``)."""
    items = k.list(EVENTS, namespace, fieldSelector=f"involvedObject.name={pod}")["items"]
    return {e["involvedObject"].get("fieldPath", ""): e["message"] for e in items if e["reason"] == "Pulled"}


def pulls_in_words(pods: list[dict[str, str]]) -> str:
    """The kubelet's Pulled Events of some pods (``pulled_events``), said once: each pull the kubelet made, or that
    every container found the image already present (the pre-pull's doing)."""
    messages = [m for pod in pods for m in pod.values()]
    pulled = [m for m in messages if not m.endswith("already present on machine")]
    if not messages:
        return "none"
    if not pulled:
        return f"'already present on machine' for all {len(messages)} containers"
    return "; ".join(pulled) + f" (then 'already present' for the other {len(messages) - len(pulled)})"
