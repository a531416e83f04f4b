"""The node agent's WarmProfile: read and followed in the cluster with the node's own identity.

Why the agent reads it instead of getting it on its command line: the command line is baked into the
EC2NodeClass's userData, which Karpenter hashes; a serving change there would replace every node. The
identity is the kubelet's on AL2023 (group ``system:nodes``) or the DaemonSet's ServiceAccount, and either
may only ``get`` and ``watch`` WarmProfiles (nodewarm/nodeclasses/agentaccess.py).

``resolve`` is pure (a profile object in, what this node must warm out); the rest is thin I/O.
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from nodewarm import logs
from nodewarm.api.errors import NodewarmError
from nodewarm.api.generation import generation
from nodewarm.api.podlayout import model_dir
from nodewarm.api.schema import GROUP, PLURAL, VERSION
from nodewarm.api.warmprofile import WarmProfile
from nodewarm.profile import from_dict

REGION_LABEL = "topology.kubernetes.io/region"
PROFILES_PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"

log = logs.get("bootstrap.profile")


@dataclass(frozen=True)
class Resolved:
    """What this node must hold for one version of its WarmProfile."""

    profile: WarmProfile
    generation: str
    model_dir: Path             # on this node's mount
    resource_version: str


def resolve(obj: dict, mount: Path) -> Resolved:
    """The WarmProfile object as the API server returns it -> what to warm on the node whose NVMe is ``mount``.

    Raises NodewarmError(reason ``InvalidProfile``) when the object does not validate: the agent reports
    that on the Node instead of guessing."""
    doc = {k: obj.get(k) for k in ("apiVersion", "kind", "spec")}
    doc["metadata"] = {k: v for k, v in (obj.get("metadata") or {}).items() if k in ("name", "labels", "annotations")}
    p = from_dict(doc)
    return Resolved(p, generation(p), on_mount(p, mount), (obj.get("metadata") or {}).get("resourceVersion", ""))


def on_mount(p: WarmProfile, mount: Path) -> Path:
    """Where profile (or model view) ``p``'s weights are on this node's NVMe mounted at ``mount``."""
    return Path(mount) / PurePosixPath(model_dir(p)).relative_to(p.nodes.cache_mount)


def region_for(p: WarmProfile, node: dict, imds_endpoint: str | None = None) -> str | None:
    """The S3 region: the profile's spec.nodes.region, else the Node's own region label (set by the cloud
    provider; readable from a pod on Auto Mode, where instance metadata is not), else instance metadata."""
    if p.nodes.region:
        return p.nodes.region
    label = ((node.get("metadata") or {}).get("labels") or {}).get(REGION_LABEL)
    if label:
        return label
    endpoint = imds_endpoint or os.environ.get("NODEWARM_IMDS_ENDPOINT")
    return imds_region(endpoint) if endpoint else None


def imds_region(endpoint: str, timeout_s: float = 2.0) -> str | None:
    """IMDSv2: a session token, then placement/region. None when unreachable (a pod with hop limit 1)."""
    try:
        req = urllib.request.Request(f"{endpoint}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        token = urllib.request.urlopen(req, timeout=timeout_s).read().decode()
        req = urllib.request.Request(f"{endpoint}/latest/meta-data/placement/region",
                                     headers={"X-aws-ec2-metadata-token": token})
        return urllib.request.urlopen(req, timeout=timeout_s).read().decode().strip() or None
    except OSError as e:
        log.info("region.imds_unreachable", endpoint=endpoint, error=str(e))
        return None


# -- I/O with the agent's identity ----------------------------------------------------------------------
def _request(api_client, method: str, path: str, query: list | None = None, timeout=15, stream: bool = False):
    reader = getattr(api_client, "reader", None)    # kubeconn.AgentApi: GETs without the kubernetes client
    if reader is not None and method == "GET" and not stream:
        return _read(reader, path, query, timeout)
    from kubernetes.client.exceptions import ApiException

    m, url, hdrs, b, post = api_client.param_serialize(method, path, query_params=query or [],
                                                       header_params={"Accept": "application/json"},
                                                       auth_settings=["BearerToken"])
    resp = api_client.call_api(m, url, hdrs, b, post, _request_timeout=timeout)
    if not 200 <= resp.status <= 299:
        data = resp.read()
        raise ApiException.from_response(http_resp=resp, body=data.decode(errors="replace"), data=None)
    return resp.response if stream else json.loads(resp.read() or b"{}")


def _read(reader, path: str, query: list | None, timeout) -> dict:
    """A GET through kubeconn's reader, its failures raised as the kubernetes client raises them (ApiException
    for a status, OSError for the connection), so every caller handles them as before."""
    import http.client

    from .kubeconn import HttpError

    try:
        return reader.get_json(path, query, timeout if isinstance(timeout, (int, float)) else max(timeout))
    except HttpError as e:
        from kubernetes.client.exceptions import ApiException

        raise ApiException(status=e.status, reason=e.reason, body=e.body) from None
    except http.client.HTTPException as e:
        raise ConnectionError(f"{type(e).__name__}: {e}") from None


def watch_events(resp):
    """(type, object) for each line of a streaming watch response. The response is closed, not returned to
    the pool, when the caller leaves early: the stream would still carry the watch."""
    try:
        buf = b""
        for chunk in resp.stream(64 * 1024):
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    ev = json.loads(line)
                    yield ev.get("type", ""), ev.get("object") or {}
    finally:
        resp.close()
        resp.release_conn()


def _forbidden(e, what: str) -> NodewarmError:
    return NodewarmError(f"cannot {what}: {e.status} {e.reason}; render the agent's RBAC (`nodewarm render`: "
                         "ClusterRole nodewarm-agent, get/watch on warmprofiles) for this identity",
                         "ProfileForbidden")


def get_profile(api_client, name: str) -> dict | None:
    """The WarmProfile object, or None when it does not exist (yet)."""
    try:
        return _request(api_client, "GET", f"{PROFILES_PATH}/{name}")
    except Exception as e:
        from kubernetes.client.exceptions import ApiException  # here: the agent's start-up reads without it

        if not isinstance(e, ApiException):
            raise
        if e.status == 404:
            return None
        if e.status in (401, 403):
            raise _forbidden(e, f"read WarmProfile {name}") from None
        raise


def get_node(api_client, name: str) -> dict:
    return _request(api_client, "GET", f"/api/v1/nodes/{name}")


def watch_profile(api_client, name: str, resource_version: str, timeout_s: int):
    """Events ``(type, object)`` for this one WarmProfile from ``resource_version`` until the server ends the
    watch (``timeout_s``). A watch by name is what `watch` on warmprofiles allows; no list is needed."""
    from kubernetes.client.exceptions import ApiException

    query = [("watch", "true"), ("fieldSelector", f"metadata.name={name}"), ("timeoutSeconds", str(timeout_s))]
    if resource_version:
        query.append(("resourceVersion", resource_version))
    try:
        resp = _request(api_client, "GET", PROFILES_PATH, query, timeout=(5, timeout_s + 10), stream=True)
    except ApiException as e:
        if e.status in (401, 403):
            raise _forbidden(e, f"watch WarmProfile {name}") from None
        raise
    yield from watch_events(resp)


def pods_on_node(api_client, node_name: str, profile: str | None = None) -> list[dict]:
    """The pods bound to this node, the profile's only when ``profile`` is given (the kubelet's identity may list
    the pods of its node)."""
    query = [("fieldSelector", f"spec.nodeName={node_name}")]
    if profile is not None:
        query.append(("labelSelector", f"nodewarm.io/profile={profile}"))
    return _request(api_client, "GET", "/api/v1/pods", query).get("items", [])
