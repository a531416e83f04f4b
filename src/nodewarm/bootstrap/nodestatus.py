"""The node agent's report to the cluster, sent with the node's *own* identity (kubelet credentials).

NodeRestriction lets a node set its own status conditions and annotations but never change its taints, and
the DaemonSet's ServiceAccount may only patch ``nodes/status``; so the node reports ``nodewarm.io/Warm`` here
and the controller (with `patch nodes`) lifts the taint.

Annotations (compile-cache outcome, timeline), labels (the generation) and the condition go in one patch of
``nodes/status``: the controller acts on the condition and finds the facts beside it.

Except the generation label while the startup taint is still on: a label the vLLM pods select on, added
while the taint still keeps them off, makes the kube-scheduler retry them (NodeAffinity's queueing hint:
the node now matches), fail on the taint and back off, for up to ``podMaxBackoffSeconds`` (10 s) after the
taint is lifted. So on a tainted node the agent only records the generation (``nodewarm.io/warm-generation``)
and the controller sets the label in the same write that lifts the taint: one event, one successful try.
"""

from __future__ import annotations

import json
import time

from nodewarm import logs
from nodewarm.api.errors import NodewarmError
from nodewarm.api.names import WARM_CONDITION
from nodewarm.api.timeutil import fmt_time_s

STRATEGIC = "application/strategic-merge-patch+json"
# The kubelet and controllers write Nodes too; a conflicting write is re-read and sent again.
CONFLICT_RETRIES = 8

log = logs.get("bootstrap.nodestatus")


def _now() -> str:
    return fmt_time_s(time.time())


def _call(api_client, method: str, path: str, body=None, content_type: str | None = None) -> dict:
    from kubernetes.client.exceptions import ApiException

    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type or "application/json"
    m, url, hdrs, b, post = api_client.param_serialize(method, path, header_params=headers, body=body,
                                                       auth_settings=["BearerToken"])
    resp = api_client.call_api(m, url, hdrs, b, post, _request_timeout=15)
    data = resp.read()
    if not 200 <= resp.status <= 299:
        raise ApiException.from_response(http_resp=resp, body=data.decode(errors="replace"), data=None)
    return json.loads(data) if data else {}


def report_warm(api_client, node_name: str, status: bool, reason: str, message: str,
                annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
                startup_taint: str | None = None) -> dict:
    """Set annotations and labels, then the ``nodewarm.io/Warm`` condition, on ``node_name``; returns the Node.

    ``labels`` are left out while the node carries ``startup_taint`` (the controller writes them as it lifts
    it, see the module doc). The write is conditional on the Node read just before it, so a taint lifted in
    between is seen on the retry, never missed.

    ``lastTransitionTime`` moves only when the status flips (so the controller's phase times mean
    what they say); the heartbeat always moves. ``reason`` is CamelCase (e.g. WeightsVerified,
    InsufficientNVMe). Raises NodewarmError (reason ``NodeStatusForbidden``) when the credentials are
    not allowed to write this node — the usual cause being another node's identity."""
    from kubernetes.client.exceptions import ApiException

    path = f"/api/v1/nodes/{node_name}"
    want = "True" if status else "False"
    for attempt in range(CONFLICT_RETRIES):
        try:
            node = _call(api_client, "GET", path)
            old = next((c for c in (node.get("status") or {}).get("conditions") or ()
                        if c.get("type") == WARM_CONDITION), None)
            tainted = bool(startup_taint) and any(t.get("key") == startup_taint
                                                  for t in (node.get("spec") or {}).get("taints") or ())
            now = _now()
            cond = {"type": WARM_CONDITION, "status": want, "reason": reason, "message": message[:32768],
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == want else now}
            written = {} if tainted else dict(labels or {})
            meta = {k: dict(v) for k, v in (("annotations", annotations), ("labels", written)) if v}
            meta["resourceVersion"] = node["metadata"]["resourceVersion"]
            # One write, through the status subresource: the API server keeps metadata but resets spec there, so
            # the identity needs no `patch nodes` and can never touch a taint; facts and condition land together.
            # Strategic merge keys node conditions by type: the kubelet's Ready & co. are left alone.
            node = _call(api_client, "PATCH", f"{path}/status", {"status": {"conditions": [cond]}, "metadata": meta},
                         STRATEGIC)
            break
        except ApiException as e:
            if e.status in (401, 403):
                raise NodewarmError(f"cannot report Warm on node {node_name}: {e.status} {e.reason}; the agent must "
                                    "use this node's own kubelet credentials (system:node:<name>)",
                                    "NodeStatusForbidden") from None
            if e.status != 409 or attempt == CONFLICT_RETRIES - 1:
                raise
            log.info("warm.report_conflict", node=node_name, attempt=attempt + 1, why="the Node changed since it was read")
    log.info("warm.reported", node=node_name, status=want, reason=reason, annotations=sorted(annotations or {}),
             labels=written, labels_left_to_controller=sorted(set(labels or {}) - set(written)))
    return node


def _patch_annotations(api_client, node_name: str, annotations: dict[str, str], what: str, hint: str = "") -> dict:
    """One strategic-merge patch of ``annotations`` through ``nodes/status`` (no read, no resourceVersion: only
    these keys are in it). A 401/403 raises NodeStatusForbidden: "cannot <what> on node <name>: ...<hint>"."""
    from kubernetes.client.exceptions import ApiException

    try:
        return _call(api_client, "PATCH", f"/api/v1/nodes/{node_name}/status",
                     {"metadata": {"annotations": dict(annotations)}}, STRATEGIC)
    except ApiException as e:
        if e.status in (401, 403):
            raise NodewarmError(f"cannot {what} on node {node_name}: {e.status} {e.reason}{hint}",
                                "NodeStatusForbidden") from None
        raise


def report_compile_cache(api_client, node_name: str, outcome: str, reason: str) -> dict:
    """The serving-time compile-cache outcome (hit|miss|cold) as Node annotations, through ``nodes/status``.

    Sent by the publisher sidecar with its ServiceAccount (rendered with ``patch nodes/status`` only); only the
    two compile-cache annotations are in the patch, so the Warm condition and everything else stay as they are.
    """
    from nodewarm.api.names import CACHE_ANNOTATION, CACHE_REASON_ANNOTATION

    node = _patch_annotations(api_client, node_name, {CACHE_ANNOTATION: outcome, CACHE_REASON_ANNOTATION: reason},
                              "record the compile-cache outcome", "; the publisher's ServiceAccount needs `patch "
                              "nodes/status` (rendered with the Deployment)")
    log.info("compile_cache.reported", node=node_name, outcome=outcome, reason=reason)
    return node


def report_progress(api_client, node_name: str, annotations: dict[str, str]) -> dict:
    """In-flight facts (the weights' bytes done, the timeline so far) as ``nodewarm.io/*`` annotations on this
    node, through ``nodes/status`` with the agent's own identity, like report_warm but without the condition.

    Only these annotations are in the patch and the agent alone writes them. An annotation is not among the Node
    changes the kube-scheduler requeues pending pods for (v1.20 here: labels, taints, conditions, allocatable,
    unschedulable; a label or condition would, see the module doc; newer schedulers only for plugins that ask for
    annotation changes, none of the default ones by a reading of upstream). Raises like report_warm
    (NodeStatusForbidden on 401/403)."""
    bad = [k for k in annotations if not k.startswith("nodewarm.io/")]
    if bad:
        raise ValueError(f"only nodewarm.io/* annotations are the agent's to write, not {bad}")
    return _patch_annotations(api_client, node_name, annotations, "report progress")
