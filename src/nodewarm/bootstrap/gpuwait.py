"""Waiting for the Node to advertise the GPUs the vLLM pod requests, before the node reports Warm.

A node advertises ``nvidia.com/gpu`` in ``status.allocatable`` only once a device plugin registered with its
kubelet. If that plugin's DaemonSet does not tolerate the startup taint it cannot start before the taint lifts,
and the vLLM pod that the lift let in waits again (plugin image pull, start, registration). So the agent's Warm
also says the GPUs are there: it waits, as a phase beside the weights, until the Node's allocatable holds the
``tp * pp`` GPUs the rendered vLLM pod requests (nodewarm/nodeclasses/vllm.py), reading its own Node with its own
identity (the kubelet's on AL2023, the DaemonSet's ServiceAccount elsewhere: both may already get it).

The wait is bounded (``GPU_WAIT_S`` from the agent's start; the weights usually take longer, so a plugin that
does start costs nothing). When it runs out the node still reports **Warm=True**, with the warning in the
condition message and the ``nodewarm.io/gpus`` annotation: reporting Warm=False would deadlock (the plugin waits
for the taint to lift, the lift waits for Warm) until ``readiness.deadline``, after which the node would serve cold
from S3 or be replaced by a node that fails the same way, although its weights are complete. Lifting the taint
lets the plugin start: the vLLM pod waits for it once, the way it would without nodewarm. The controller names
the DaemonSet and the missing toleration on the WarmProfile (condition ``DevicePluginsTolerate``).

Only a node known to have GPUs is waited for: its labels say how many (Karpenter's
``karpenter.k8s.aws/instance-gpu-count``, Auto Mode's, GPU feature discovery's, else the instance type in the
built-in table). A node whose labels say nothing about GPUs is not waited for (said in the result): nodewarm
nodes are launched by Karpenter, which always sets the instance type.

``expected_gpus``, ``allocatable_gpus`` and ``judge`` are pure; ``wait_for_gpus`` is the thin I/O around them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from nodewarm import logs
from nodewarm.api.names import INSTANCE_TYPE_LABEL

from .profilesource import get_node

log = logs.get("bootstrap.gpuwait")

GPU_RESOURCE = "nvidia.com/gpu"
# From the agent's start. A device plugin that tolerates the taint registers within seconds to a minute of the
# kubelet's start (its image is small); past this the node reports Warm with the warning.
GPU_WAIT_S = 180.0
POLL_S = 2.0
COUNT_LABELS = ("karpenter.k8s.aws/instance-gpu-count", "eks.amazonaws.com/instance-gpu-count", "nvidia.com/gpu.count")


@dataclass(frozen=True)
class GpuResult:
    status: str         # advertised | timeout | skipped | failed
    reason: str         # GpusAdvertised | GpusNotAdvertised | GpuCountUnknown | TooFewGpus | NodeUnreadable
    message: str
    wanted: int
    allocatable: int
    seconds: float = 0.0

    def annotation(self) -> str:
        return f"{self.status} {self.reason} {self.allocatable}/{self.wanted}"


def _int(v) -> int | None:
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return None


def expected_gpus(labels: dict[str, str]) -> int | None:
    """How many GPUs this node's instance has, from its labels; None when they do not say."""
    for key in COUNT_LABELS:
        n = _int(labels.get(key))
        if n is not None:
            return n
    it = labels.get(INSTANCE_TYPE_LABEL)
    if it:
        from nodewarm.instancetypes import offline_table

        facts = offline_table().get(it)
        if facts is not None:
            return facts.gpus
    return None


def allocatable_gpus(node: dict) -> int:
    return _int(((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)) or 0


def judge(node: dict, wanted: int) -> GpuResult | None:
    """A final result from one read of the Node, or None: keep waiting."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    have = allocatable_gpus(node)
    if have >= wanted:
        return GpuResult("advertised", "GpusAdvertised", f"{GPU_RESOURCE}: {have} allocatable, the vLLM pod "
                         f"requests {wanted}", wanted, have)
    expected = expected_gpus(labels)
    if expected is None:
        return GpuResult("skipped", "GpuCountUnknown", f"not waiting for {GPU_RESOURCE}: this node's labels name no "
                         f"GPU count or known instance type ({have} allocatable, the vLLM pod requests {wanted})",
                         wanted, have)
    if expected < wanted:
        return GpuResult("failed", "TooFewGpus", f"this node's instance has {expected} GPUs, the vLLM pod requests "
                         f"{wanted} (tensorParallelSize x pipeline-parallel-size): it cannot run here; allow "
                         "instance types with enough GPUs", wanted, have)
    return None


def timeout_result(wanted: int, have: int, deadline_s: float, taint_key: str) -> GpuResult:
    return GpuResult("timeout", "GpusNotAdvertised", f"the node advertised {have} {GPU_RESOURCE} after "
                     f"{deadline_s:.0f}s, the vLLM pod requests {wanted}: the device plugin DaemonSet most likely "
                     f"does not tolerate the startup taint {taint_key or '(the startup taint)'}, so it starts only "
                     "once the taint lifts and the vLLM pod waits for it (see the WarmProfile's DevicePluginsTolerate "
                     "condition; `nodewarm render -f PROFILE --device-plugin-patch NAMESPACE/NAME` prints the fix)",
                     wanted, have)


def wait_for_gpus(api_client, node_name: str, wanted: int, *, deadline_s: float = GPU_WAIT_S,
                  taint_key: str = "", stop: threading.Event | None = None, poll_s: float = POLL_S,
                  started: float | None = None, on_poll=None) -> GpuResult:
    """Read this Node every ``poll_s`` until it advertises ``wanted`` GPUs, ``deadline_s`` (from ``started``,
    a ``time.monotonic()``; default now) passes or ``stop`` is set. Never raises for the API: a refusal
    (401/403/404) ends the wait as ``failed``; other errors are retried until the deadline."""
    from kubernetes.client.exceptions import ApiException

    stop = stop or threading.Event()
    start = time.monotonic() if started is None else started
    have, last_error = 0, ""
    while True:
        try:
            node = get_node(api_client, node_name)
            have = allocatable_gpus(node)
            verdict = judge(node, wanted)
            if on_poll is not None:
                on_poll(node)
            if verdict is not None:
                return _done(verdict, start, node_name)
        except ApiException as e:
            if e.status in (401, 403, 404):
                return _done(GpuResult("failed", "NodeUnreadable", f"cannot read Node {node_name} to see its "
                                       f"{GPU_RESOURCE}: {e.status} {e.reason}", wanted, have), start, node_name)
            last_error = f"{e.status} {e.reason}"
        except Exception as e:  # noqa: BLE001 - a connection blip: try again until the deadline
            last_error = f"{type(e).__name__}: {e}"
        left = deadline_s - (time.monotonic() - start)
        if left <= 0:
            r = timeout_result(wanted, have, deadline_s, taint_key)
            if last_error:
                r = GpuResult(r.status, r.reason, f"{r.message} (last read error: {last_error})", wanted, have)
            return _done(r, start, node_name)
        if stop.wait(min(poll_s, left)):
            return _done(GpuResult("skipped", "Stopped", f"stopped waiting for {GPU_RESOURCE}", wanted, have),
                         start, node_name)


def _done(r: GpuResult, start: float, node_name: str) -> GpuResult:
    r = GpuResult(r.status, r.reason, r.message, r.wanted, r.allocatable, round(time.monotonic() - start, 3))
    (log.info if r.status in ("advertised", "skipped") else log.warning)(
        "gpuwait.done", node=node_name, status=r.status, reason=r.reason, wanted=r.wanted, allocatable=r.allocatable,
        seconds=r.seconds)
    return r
