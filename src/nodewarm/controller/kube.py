"""The thin I/O shell: every request the controller makes goes through ``Kube``.

It rides on the official client's ``ApiClient`` (auth, TLS, connection pool, ApiException) but sends
and returns plain JSON dicts. Why not the typed ``CoreV1Api`` models: (1) deserialising every Node
and NodeClaim into pydantic models costs CPU and memory the 1000-node burst cannot afford, (2) the
typed bodies re-serialise MicroTime fields (Lease ``renewTime``) in a format the API server rejects,
(3) Karpenter's CRDs have no models anyway. Each mutating call is counted (``writes``) so the bench
and the metrics can report API writes per node honestly.

``retries=False`` (the controller's setting) sends every request once: urllib3's default retries a
timed-out GET/PUT/DELETE three more times, so a 10 s timeout could hold a Lease renew for 40 s. The
controller has its own retries (work queue backoff, reflector relists, the elector's retry period),
each of which respects its deadline.
"""

from __future__ import annotations

import copy
import json
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import quote

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodewarm.api.names import FIELD_MANAGER

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the API. ``namespaced`` resources take a namespace in ``path``."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, name: str | None = None, namespace: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced:
            base += f"/namespaces/{quote(namespace or 'default', safe='')}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name, safe='')}"
        if sub:
            base += f"/{sub}"
        return base


NODES = Resource("", "v1", "nodes", "Node")
EVENTS = Resource("", "v1", "events", "Event", namespaced=True)
NODECLAIMS = Resource("karpenter.sh", "v1", "nodeclaims", "NodeClaim")
NODEPOOLS = Resource("karpenter.sh", "v1", "nodepools", "NodePool")
EC2NODECLASSES = Resource("karpenter.k8s.aws", "v1", "ec2nodeclasses", "EC2NodeClass")
AUTOMODE_NODECLASSES = Resource("eks.amazonaws.com", "v1", "nodeclasses", "NodeClass")
WARMPROFILES = Resource("nodewarm.io", "v1alpha1", "warmprofiles", "WarmProfile")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
# The engine check's, in a profile's serving namespace only (nodewarm/controller/enginecheck.py): its Role is there.
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
PODTEMPLATES = Resource("", "v1", "podtemplates", "PodTemplate", namespaced=True)
# Listed and watched across all namespaces (/apis/apps/v1/daemonsets): the device plugins (warmprofile/deviceplugins.py).
DAEMONSETS = Resource("apps", "v1", "daemonsets", "DaemonSet")
# A peers profile's key and who may read it, in its bootstrap namespace (warmprofile/peerkeys.py).
SECRETS = Resource("", "v1", "secrets", "Secret", namespaced=True)
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", namespaced=True)
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", namespaced=True)

# A guarded write (a test op, a resourceVersion) that meets a changed object re-reads it and tries again, this often.
MAX_CONFLICT_RETRIES = 5


def is_status(e: BaseException, *codes: int) -> bool:
    return isinstance(e, ApiException) and e.status in codes


class Kube:
    """JSON requests over one ``kubernetes.client.ApiClient`` (thread-safe: urllib3 pools connections)."""

    def __init__(self, api_client: client.ApiClient, request_timeout_s: float = 10.0, retries: bool = True):
        if not retries:
            # Its own client (and connection pool): the caller's may be shared with code that wants retries.
            cfg = copy.copy(api_client.configuration)
            cfg.retries = urllib3.Retry(total=0, redirect=0, raise_on_redirect=False)
            api_client = client.ApiClient(cfg)
        self.api = api_client
        self.timeout = request_timeout_s
        self._lock = threading.Lock()
        self.writes: Counter[tuple[str, str]] = Counter()
        self.on_write: Callable[[str, str], None] | None = None

    def request(self, method: str, path: str, *, query: dict | None = None, body: Any = None,
                content_type: str | None = None, timeout: float | None = None, stream: bool = False):
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        q = [(k, v if not isinstance(v, bool) else str(v).lower()) for k, v in (query or {}).items() if v is not None]
        m, url, hdrs, body_s, post = self.api.param_serialize(
            method, path, query_params=q, header_params=headers, body=body, auth_settings=["BearerToken"])
        resp = self.api.call_api(m, url, hdrs, body_s, post, _request_timeout=timeout or self.timeout)
        if method != "GET":
            self._count(method, path)
        if stream:
            if not 200 <= resp.status <= 299:
                resp.read()
                raise ApiException.from_response(http_resp=resp, body=resp.data.decode(errors="replace"), data=None)
            return resp.response
        data = resp.read()
        if not 200 <= resp.status <= 299:
            raise ApiException.from_response(http_resp=resp, body=data.decode(errors="replace"), data=None)
        return json.loads(data) if data else {}

    def _count(self, method: str, path: str) -> None:
        parts = path.strip("/").split("/")
        # /api/v1/nodes/x -> nodes ; /apis/g/v/namespaces/ns/events -> events ; .../nodes/x/status -> nodes/status
        if "namespaces" in parts:
            i = parts.index("namespaces") + 2
        else:
            i = 2 if parts[0] == "api" else 3
        resource = parts[i] if i < len(parts) else parts[-1]
        if len(parts) > i + 2:
            resource += "/" + parts[i + 2]
        with self._lock:
            self.writes[(resource, method)] += 1
        if self.on_write:
            self.on_write(resource, method)

    # -- verbs -------------------------------------------------------------------------------------
    def get(self, res: Resource, name: str, namespace: str | None = None, timeout: float | None = None) -> dict:
        return self.request("GET", res.path(name, namespace), timeout=timeout)

    def list(self, res: Resource, namespace: str | None = None, **query) -> dict:
        return self.request("GET", res.path(None, namespace), query=query)

    def create(self, res: Resource, body: dict, namespace: str | None = None, timeout: float | None = None) -> dict:
        return self.request("POST", res.path(None, namespace), body=body, timeout=timeout)

    def replace(self, res: Resource, name: str, body: dict, namespace: str | None = None,
                timeout: float | None = None) -> dict:
        return self.request("PUT", res.path(name, namespace), body=body, timeout=timeout)

    def delete(self, res: Resource, name: str, namespace: str | None = None, uid: str | None = None,
               resource_version: str | None = None, timeout: float | None = None) -> dict:
        """With ``uid``/``resource_version`` the server deletes only that exact object (409 otherwise)."""
        pre = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": pre} if pre else None
        return self.request("DELETE", res.path(name, namespace), body=body, timeout=timeout)

    def json_patch(self, res: Resource, name: str, ops: list[dict], sub: str | None = None,
                   timeout: float | None = None) -> dict:
        return self.request("PATCH", res.path(name, None, sub), body=ops, content_type=JSON_PATCH, timeout=timeout)

    def merge_patch(self, res: Resource, name: str, body: dict, sub: str | None = None,
                    namespace: str | None = None) -> dict:
        return self.request("PATCH", res.path(name, namespace, sub), body=body, content_type=MERGE_PATCH)

    def apply(self, res: Resource, body: dict, *, dry_run: bool = False, force: bool = True) -> dict:
        """Server-side apply as field manager ``nodewarm``: we own exactly the fields in ``body``."""
        return self.request("PATCH", res.path(body["metadata"]["name"]), body=body, content_type=APPLY_PATCH,
                            query={"fieldManager": FIELD_MANAGER, "force": force, "dryRun": "All" if dry_run else None})

    def watch_fn(self, res: Resource) -> Callable[..., Any]:
        """A list function in the shape ``kubernetes.watch.Watch.stream`` drives (kwargs -> raw response)."""

        def list_for_watch(**kw):
            query = {"watch": kw.get("watch"), "resourceVersion": kw.get("resource_version"),
                     "timeoutSeconds": kw.get("timeout_seconds"),
                     "allowWatchBookmarks": kw.get("allow_watch_bookmarks")}
            # The read timeout must outlast the server-side timeout or a quiet watch looks like a failure.
            return self.request("GET", res.path(), query=query, stream=True,
                                timeout=(5, (kw.get("timeout_seconds") or 60) + 10))

        return list_for_watch
