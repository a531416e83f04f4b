"""The node agent's way to its API server: which credentials (one place), a thin reader for its GETs, and the
kubernetes client made only when something needs more than a GET.

Why a reader of its own: `import kubernetes` costs ~0.25 s (every API class, its config loaders, pydantic,
requests, websocket) and what the agent asks before its pull starts is two GETs (its WarmProfile, its Node):
on the warm-up's critical path that import was a quarter of the time to the first byte. ``Reader`` sends plain
GETs with http.client and the credentials a kubeconfig or the pod's ServiceAccount gives: a bearer token
(``token``, ``tokenFile``), a client certificate (file or data), basic auth, an exec plugin (EKS's
``aws eks get-token`` or aws-iam-authenticator: the ExecCredential's token or client certificate, run again when
it expires or the server answers 401), and the in-cluster token and CA. A kubeconfig it does not understand
(auth-provider, proxy-url, several files in $KUBECONFIG) gets no reader, and every request goes through the
kubernetes client as before.

``AgentApi`` is what the agent passes around as its API client: the kubernetes ApiClient, made on first use
(watches, status patches, pods: after the pull has started), with the reader beside it. profilesource sends its
non-streaming GETs through the reader and reports errors as the kubernetes client would (ApiException), so no
caller sees a difference.

(Over 300 lines: a kubeconfig's credentials, their refresh and the requests that use them are one concern; split,
the order of precedence and the refresh on 401 would be spread over modules.)
"""

from __future__ import annotations

import base64
import datetime
import http.client
import json
import os
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlencode, urlsplit

from nodewarm import logs

log = logs.get("bootstrap.kube")

KUBELET_KUBECONFIG = "/var/lib/kubelet/kubeconfig"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# An exec credential is run again this long before the expiry it states (as client-go does, give or take).
EXEC_EXPIRY_MARGIN_S = 60.0


def kubeconfig_path(flag: str | None) -> str | None:
    """The agent's credentials, in order: --kubeconfig, $KUBECONFIG, the kubelet's kubeconfig (AL2023 host);
    None: the in-cluster ServiceAccount (DaemonSet)."""
    return flag or os.environ.get("KUBECONFIG") or (KUBELET_KUBECONFIG if os.path.exists(KUBELET_KUBECONFIG)
                                                    else None)


class Unsupported(Exception):
    """A kubeconfig the thin reader does not handle: the kubernetes client does all the requests."""


class HttpError(Exception):
    def __init__(self, status: int, reason: str, body: str):
        super().__init__(f"{status} {reason}")
        self.status, self.reason, self.body = status, reason, body


def _b64(data: str) -> bytes:
    return base64.b64decode(data)


class _Exec:
    """An ExecCredential plugin (client.authentication.k8s.io), run as kubectl and the kubernetes client run it."""

    def __init__(self, spec: dict, cwd: str | None, cluster: dict):
        if not spec.get("command") or not spec.get("apiVersion"):
            raise Unsupported("exec: no command or apiVersion")
        self.argv = [spec["command"], *(spec.get("args") or [])]
        self.env = {**os.environ, **{e["name"]: e["value"] for e in spec.get("env") or []}}
        info = {"apiVersion": spec["apiVersion"], "kind": "ExecCredential", "spec": {"interactive": False}}
        if spec.get("provideClusterInfo"):
            info["spec"]["cluster"] = cluster
        self.env["KUBERNETES_EXEC_INFO"] = json.dumps(info)
        self.cwd = cwd
        self.status: dict | None = None
        self.expires: float | None = None

    def current(self, refresh: bool = False) -> dict:
        """The plugin's status (token, or clientCertificateData/clientKeyData); {} when the plugin fails (logged:
        the request then goes without credentials and the server's 401 says what is wrong, as before)."""
        if self.status is not None and not refresh and (self.expires is None or time.time() < self.expires):
            return self.status
        try:
            p = subprocess.run(self.argv, env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=60)
            if p.returncode != 0:
                raise RuntimeError(f"exec: process returned {p.returncode}. {p.stderr.strip()}".rstrip(". "))
            status = json.loads(p.stdout)["status"]
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, subprocess.TimeoutExpired) as e:
            log.error("kube.exec_failed", command=self.argv[0], error=str(e)[:500])
            self.status, self.expires = {}, None
            return {}
        self.status, self.expires = status, None
        stamp = status.get("expirationTimestamp")
        if stamp:
            try:
                at = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
                self.expires = at - EXEC_EXPIRY_MARGIN_S
            except ValueError:
                pass
        return status


class Reader:
    """Plain GETs against one API server with one identity. Thread-safe (one connection per request)."""

    def __init__(self, server: str, *, ca_file: str | None = None, ca_data: bytes | None = None,
                 insecure: bool = False, tls_server_name: str | None = None, token: str | None = None,
                 token_file: str | None = None, cert: tuple[str, str] | None = None,
                 cert_data: tuple[bytes, bytes] | None = None, basic: tuple[str, str] | None = None,
                 exec_plugin: _Exec | None = None):
        u = urlsplit(server.rstrip("/"))
        if u.scheme not in ("https", "http") or not u.hostname:
            raise Unsupported(f"server {server!r}")
        self.scheme, self.host, self.port = u.scheme, u.hostname, u.port or (443 if u.scheme == "https" else 80)
        self.base = u.path
        self.ca_file, self.ca_data, self.insecure, self.tls_server_name = ca_file, ca_data, insecure, tls_server_name
        self.token, self.token_file, self.basic, self.exec = token, token_file, basic, exec_plugin
        self.cert, self.cert_data = cert, cert_data
        self.lock = threading.Lock()
        self._ctx: ssl.SSLContext | None = None
        self._ctx_cert: object = None

    # -- credentials -----------------------------------------------------------------------------------------
    def _context(self, cert_data: tuple[bytes, bytes] | None) -> ssl.SSLContext:
        with self.lock:
            if self._ctx is not None and self._ctx_cert == cert_data:
                return self._ctx
            ctx = ssl.create_default_context(cafile=self.ca_file,
                                             cadata=self.ca_data.decode() if self.ca_data else None)
            if self.insecure:
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            if self.cert:
                ctx.load_cert_chain(*self.cert)
            elif cert_data:
                _load_cert_data(ctx, *cert_data)
            self._ctx, self._ctx_cert = ctx, cert_data
            return ctx

    def _auth(self, refresh: bool) -> tuple[dict[str, str], tuple[bytes, bytes] | None]:
        """Headers and client certificate, in the kubernetes client's order: token, tokenFile, exec, basic."""
        cert_data = self.cert_data
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}, cert_data
        if self.token_file:     # read each time: the kubelet rotates a ServiceAccount's projected token
            try:
                return {"Authorization": f"Bearer {Path(self.token_file).read_text().strip()}"}, cert_data
            except OSError as e:
                log.error("kube.token_unreadable", path=self.token_file, error=str(e))
                return {}, cert_data
        if self.exec is not None:
            status = self.exec.current(refresh)
            if status.get("token"):
                return {"Authorization": f"Bearer {status['token']}"}, cert_data
            if status.get("clientCertificateData") and status.get("clientKeyData"):
                return {}, (status["clientCertificateData"].encode(), status["clientKeyData"].encode())
            return {}, cert_data
        if self.basic:
            raw = f"{self.basic[0]}:{self.basic[1]}".encode()
            return {"Authorization": "Basic " + base64.b64encode(raw).decode()}, cert_data
        return {}, cert_data

    # -- requests --------------------------------------------------------------------------------------------
    def get_json(self, path: str, query: list[tuple[str, str]] | None = None, timeout: float = 15) -> dict:
        """GET ``path`` (with ``query``) as JSON; raises HttpError for a status outside 2xx. A 401 with an exec
        plugin runs the plugin again once (its credential may have been revoked or rotated early)."""
        status, reason, body = self._get(path, query, timeout, refresh=False)
        if status == 401 and self.exec is not None:
            status, reason, body = self._get(path, query, timeout, refresh=True)
        if not 200 <= status <= 299:
            raise HttpError(status, reason, body.decode(errors="replace"))
        return json.loads(body or b"{}")

    def _get(self, path: str, query, timeout: float, refresh: bool) -> tuple[int, str, bytes]:
        headers, cert_data = self._auth(refresh)
        headers["Accept"] = "application/json"
        if self.scheme == "https":
            conn = _HTTPS(self.host, self.port, timeout, self._context(cert_data), self.tls_server_name)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request("GET", self.base + path + (("?" + urlencode(query)) if query else ""), headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.reason, resp.read()
        finally:
            conn.close()


class _HTTPS(http.client.HTTPSConnection):
    """HTTPS with the kubeconfig's tls-server-name, when it names one, as the name the certificate must hold."""

    def __init__(self, host: str, port: int, timeout: float, context: ssl.SSLContext, server_name: str | None):
        super().__init__(host, port, timeout=timeout, context=context)
        self._server_name = server_name or host

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._server_name)


def _load_cert_data(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a certificate chain from files only: a private temp file, removed at once."""
    fd, path = tempfile.mkstemp(prefix="nodewarm-kube-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cert.rstrip(b"\n") + b"\n" + key)
        ctx.load_cert_chain(path)
    finally:
        os.unlink(path)


def _file_or_data(node: dict, key: str, base: str) -> tuple[str | None, bytes | None]:
    if node.get(f"{key}-data"):
        return None, _b64(node[f"{key}-data"])
    if node.get(key):
        return os.path.join(base, node[key]), None
    return None, None


def reader_from_kubeconfig(path: str) -> Reader:
    """The current context's reader. Raises Unsupported for what only the kubernetes client handles."""
    if os.pathsep in path:
        raise Unsupported("several kubeconfig files")
    import yaml

    doc = yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    base = os.path.dirname(os.path.abspath(path))

    def named(kind: str, name: str) -> dict:
        for item in doc.get(kind) or []:
            if item.get("name") == name:
                return item.get(kind[:-1]) or {}
        raise Unsupported(f"no {kind[:-1]} {name!r}")

    ctx = named("contexts", doc.get("current-context") or "")
    cluster, user = named("clusters", ctx.get("cluster") or ""), named("users", ctx.get("user") or "")
    if cluster.get("proxy-url") or user.get("auth-provider"):
        raise Unsupported("proxy-url or auth-provider")
    ca_file, ca_data = _file_or_data(cluster, "certificate-authority", base)
    cert_file, cert_data = _file_or_data(user, "client-certificate", base)
    key_file, key_data = _file_or_data(user, "client-key", base)
    token_file = user.get("tokenFile")
    plugin = None
    if user.get("exec"):
        plugin = _Exec(user["exec"], base, {"server": cluster.get("server"),
                                            "certificate-authority-data": cluster.get("certificate-authority-data"),
                                            "insecure-skip-tls-verify": cluster.get("insecure-skip-tls-verify")})
    return Reader(cluster.get("server") or "", ca_file=ca_file, ca_data=ca_data,
                  insecure=bool(cluster.get("insecure-skip-tls-verify")),
                  tls_server_name=cluster.get("tls-server-name"), token=user.get("token"),
                  token_file=os.path.join(base, token_file) if token_file else None,
                  cert=(cert_file, key_file) if cert_file and key_file else None,
                  cert_data=(cert_data, key_data) if cert_data and key_data else None,
                  basic=(user["username"], user.get("password", "")) if user.get("username") else None,
                  exec_plugin=plugin)


def reader_in_cluster(sa_dir: str = SERVICE_ACCOUNT_DIR) -> Reader:
    """The pod's ServiceAccount, as the kubernetes client's in-cluster loader reads it."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise Unsupported("not in a cluster (KUBERNETES_SERVICE_HOST/PORT unset)")
    host = f"[{host}]" if ":" in host else host
    return Reader(f"https://{host}:{port}", ca_file=os.path.join(sa_dir, "ca.crt"),
                  token_file=os.path.join(sa_dir, "token"))


def _kubernetes_client(path: str | None):
    from kubernetes import client, config

    if path:
        return config.new_client_from_config(config_file=path)
    config.load_incluster_config()
    return client.ApiClient()


class AgentApi:
    """The agent's API client: the kubernetes ApiClient made on first use, and the thin ``reader`` (None: the
    credentials need the kubernetes client) that profilesource's GETs use. Attribute access reaches the
    ApiClient, so the agent's other modules use it as they always did."""

    def __init__(self, reader: Reader | None, factory):
        self.reader = reader
        self._factory, self._client, self._lock = factory, None, threading.Lock()

    def client(self):
        with self._lock:
            if self._client is None:
                self._client = self._factory()
            return self._client

    def __getattr__(self, name: str):
        return getattr(self.client(), name)


def agent_api(kubeconfig: str | None) -> AgentApi:
    """The agent's client for --kubeconfig (None: kubeconfig_path's order)."""
    path = kubeconfig_path(kubeconfig)
    try:
        reader = reader_from_kubeconfig(path) if path else reader_in_cluster()
    except Unsupported as e:
        log.info("kube.thin_reader_off", why=str(e))
        reader = None
    except Exception as e:  # noqa: BLE001 - unreadable or malformed (bad YAML too): the kubernetes client says so
        # in its own words when it is made, as before this reader
        log.info("kube.thin_reader_off", why=f"{type(e).__name__}: {e}")
        reader = None
    return AgentApi(reader, lambda: _kubernetes_client(path))
