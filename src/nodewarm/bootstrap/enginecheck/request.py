"""The node agent's side of the engine check: ask on its own Node, follow the check pod, read its answer.

The agent cannot start the check pod (as the node, NodeRestriction lets it create mirror pods only), so it asks: a
``Request`` in its Node's ``nodewarm.io/engine-check`` annotation, through ``nodes/status`` as every report of the
agent goes. The controller creates the pod; the agent follows the pods bound to its node (podwatch) until the one
answering its request id has terminated, and reads the runner's Result from the container's termination message.
What the kubelet says when the runner could not (the pod's deadline, an OOM kill, an image that never ran) becomes a
Result too: the agent reports every end, it never waits past its own timeout.

``verdict`` and ``not_run`` are pure; ``ask`` and ``wait`` are the I/O.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable

from nodewarm import logs
from nodewarm.api import enginecheck
from nodewarm.api.enginecheck import Reason, Request, Result
from nodewarm.api.snapshot import CONTAINER as SERVING_CONTAINER
from nodewarm.api.timeutil import fmt_time

from .. import podwatch

log = logs.get("bootstrap.enginecheck")

# Beyond the runner's own timeout: the controller's reaction, scheduling, the container's start (the image is on
# the node: the agent's pre-pull waited for it) and the kubelet's status update.
START_SLACK_S = 120.0


def new_id() -> str:
    return uuid.uuid4().hex[:12]


def ask(api_client, node_name: str, request_id: str) -> Request:
    from ..nodestatus import report_progress

    req = Request(request_id, fmt_time(time.time()))
    report_progress(api_client, node_name, {enginecheck.REQUEST_ANNOTATION: req.to_json()})
    log.info("enginecheck.requested", node=node_name, id=request_id)
    return req


def answering(pods: Iterable[dict], request_id: str) -> dict | None:
    """The check pod among ``pods`` that answers ``request_id`` (the controller's annotation on it)."""
    for pod in pods:
        if ((pod.get("metadata") or {}).get("annotations") or {}).get(enginecheck.REQUEST_ID_ANNOTATION) == request_id:
            return pod
    return None


def _container(pod: dict, name: str = enginecheck.CONTAINER) -> dict | None:
    for st in (pod.get("status") or {}).get("containerStatuses") or ():
        if st.get("name") == name:
            return st
    return None


def verdict(pods: dict[str, dict], request_id: str) -> Result | None:
    """The answer to ``request_id`` once its pod is done, else None (still to come, or running)."""
    pod = answering(pods.values(), request_id)
    if pod is None:
        return None
    status = pod.get("status") or {}
    st = _container(pod)
    ended = ((st or {}).get("state") or {}).get("terminated")
    if ended:
        text = ended.get("message") or ""
        try:
            return Result.from_json(text)
        except (ValueError, TypeError):
            why = ended.get("reason") or "Error"
            return Result(False, Reason.ENGINE_BOOT_FAILED, f"the check container ended ({why}, exit code "
                          f"{ended.get('exitCode')}) without a result: {' '.join(text.split())[:300] or 'no message'}")
    # Snapshot mode: vLLM is the pod's serving container, which the observing runner cannot see end; it would wait
    # out its timeout. Only the agent's checkpoint ends it otherwise, and that comes after the runner's answer.
    gone = ((_container(pod, SERVING_CONTAINER) or {}).get("state") or {}).get("terminated")
    if gone:
        meta = pod.get("metadata") or {}
        return Result(False, Reason.ENGINE_BOOT_FAILED, f"the {SERVING_CONTAINER} container ended "
                      f"({gone.get('reason') or 'Error'}, exit code {gone.get('exitCode')}) before it served: "
                      f"kubectl logs -n {meta.get('namespace', '')} {podwatch.name_of(pod)} -c {SERVING_CONTAINER}")
    if status.get("phase") == "Failed":
        if status.get("reason") == "DeadlineExceeded":
            return Result(False, Reason.ENGINE_CHECK_TIMED_OUT, f"the kubelet stopped the check pod at its "
                          f"activeDeadlineSeconds: {status.get('message', '')}")
        return Result(False, Reason.ENGINE_CHECK_NOT_RUN, f"the check pod failed before its container ended: "
                      f"{status.get('reason', '')} {status.get('message', '')}".strip())
    return None


def not_run(pods: dict[str, dict], request_id: str, waited_s: float, namespace: str, profile: str) -> Result:
    """What to report when the time is up without an answer: as far as the pod (if any) says why."""
    pod = answering(pods.values(), request_id)
    if pod is None:
        return Result(False, Reason.ENGINE_CHECK_NOT_RUN, f"no check pod ran on this node within {waited_s:.0f} s: "
                      f"the controller creates it from PodTemplate {enginecheck.template_name(profile)} in namespace "
                      f"{namespace} (apply what `nodewarm render` prints; is the controller running?)")
    state = (_container(pod) or {}).get("state") or {}
    waiting = state.get("waiting") or {}
    if "running" in state:
        return Result(False, Reason.ENGINE_CHECK_TIMED_OUT, f"the check pod {podwatch.name_of(pod)} was still "
                      f"running after {waited_s:.0f} s")
    said = f"{waiting.get('reason', '')}: {' '.join(str(waiting.get('message', '')).split())[:300]}".strip(": ")
    return Result(False, Reason.ENGINE_CHECK_NOT_RUN, f"the check pod {podwatch.name_of(pod)} did not run within "
                  f"{waited_s:.0f} s ({said or 'phase ' + str((pod.get('status') or {}).get('phase', 'unknown'))})")


def wait(api_client, node_name: str, request_id: str, *, namespace: str, profile: str, timeout_s: float,
         stop: threading.Event | None = None) -> Result:
    """Follow this node's check pods until the one for ``request_id`` answers or ``timeout_s`` (+ START_SLACK_S)."""
    from kubernetes.client.exceptions import ApiException

    stop = stop or threading.Event()
    start = time.monotonic()
    limit = timeout_s + START_SLACK_S
    query = [("fieldSelector", f"spec.nodeName={node_name}"), ("labelSelector", enginecheck.label_selector(profile))]
    try:
        end = podwatch.follow(api_client, namespace, query, lambda pods: verdict(pods, request_id), stop=stop,
                              what="enginecheck", logger=log, left=lambda: limit - (time.monotonic() - start),
                              node=node_name, id=request_id)
    except ApiException as e:
        return Result(False, Reason.ENGINE_CHECK_NOT_RUN, f"this identity may not list and watch pods in namespace "
                      f"{namespace} ({e.status} {' '.join(str(e.reason).split())[:200]}): apply the agent's RBAC that "
                      f"`nodewarm render` prints")
    if end.answer is not None:
        return end.answer
    waited = time.monotonic() - start
    if end.last_error:
        return Result(False, Reason.ENGINE_CHECK_NOT_RUN, f"could not read the check pod for {waited:.0f} s: "
                      f"{end.last_error}")
    return not_run(end.pods, request_id, waited, namespace, profile)
