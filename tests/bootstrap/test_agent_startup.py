"""The agent's start-up, process start to the first GET of model bytes: what it imports on that path, and the thin
reader (bootstrap/kubeconn.py) it reads its WarmProfile and Node with, against the real API server with each kind
of credential a node has (a kubelet token, a token file, an exec plugin, the in-cluster ServiceAccount)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap

import pytest
import yaml

from support.builders import NO_CACHE, v
from support.bootstrap_fixtures import model_files, node_kubeconfig, put_model
from nodewarm.api.errors import NodewarmError
from nodewarm.bootstrap import kubeconn, profilesource

pytestmark = [pytest.mark.kube]

NODE = "node-6"
TAINT = {"key": "nodewarm.io/warming", "effect": "NoSchedule"}

# Runs `nodewarm bootstrap run` in a fresh interpreter; at the first GET of model bytes (Progress.request_sent)
# it writes the modules loaded by then to the file named in argv[1]. Only weights.progress is imported first.
PROBE = textwrap.dedent("""
    import json, sys
    from nodewarm.bootstrap.weights import progress
    sent = progress.Progress.request_sent
    def request_sent(self):
        if not getattr(request_sent, "seen", False):
            request_sent.seen = True
            open(sys.argv[1], "w").write(json.dumps(sorted(sys.modules)))
        return sent(self)
    progress.Progress.request_sent = request_sent
    from nodewarm.cli import main
    sys.exit(main(sys.argv[2:]))
""")


@pytest.fixture
def node(k, fresh_node):
    fresh_node(NODE, [TAINT])
    return k


def _write(path, doc: dict):
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.s3
def test_bootstrap_run_sends_its_first_get_without_the_kubernetes_client(kube, aws_env, node, warmprofile,
                                                                           kubelet_pulls, tmp_path):
    """The WarmProfile and the Node are read with the thin reader; the kubernetes client (~0.25 s of imports) is
    made after the first GET, for the waits and the report, and the node still ends Warm through it."""
    uri = put_model(aws_env, model_files(shards=2, mib_per_shard=1))
    doc = v(metadata__name="startup-a", spec__model={"uri": uri}, spec__compileCache__uri=NO_CACHE,
            spec__bootstrap__allowNonNvme=True)
    warmprofile(doc)
    kubelet_pulls(doc, NODE)
    mount = tmp_path / "nvme"
    mount.mkdir()
    seen = tmp_path / "modules.json"
    p = subprocess.run([sys.executable, "-c", PROBE, str(seen), "bootstrap", "run", "--profile", "startup-a",
                        "--mount", str(mount), "--node-name", NODE,
                        "--kubeconfig", str(node_kubeconfig(kube, tmp_path, NODE)), "--skip-load-check", "--once",
                        "--gpu-wait-seconds", "0.1", "--state-dir", str(tmp_path / "state"), "--json"],
                       capture_output=True, text=True, env={**os.environ}, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout)["warm"] is True
    loaded = json.loads(seen.read_text())
    at_first_get = sorted({m.split(".")[0] for m in loaded} & {"kubernetes", "pydantic", "requests", "websocket",
                                                                 "oauthlib", "cryptography"})
    assert at_first_get == []
    # Nor anything else the pull does not need: the compile cache (its key, bundles, zstd and signature checks),
    # the engine check, the image pre-pull's pod watch. Their phases start after the first GET and import them then.
    not_the_pulls = ("nodewarm.bootstrap.compilecache.restore", "nodewarm.bootstrap.compilecache.cachekey",
                     "nodewarm.bootstrap.compilecache.bundle", "zstandard", "nodewarm.api.enginecheck",
                     "nodewarm.bootstrap.enginecheck.request", "nodewarm.bootstrap.imageprepull",
                     "nodewarm.bootstrap.podwatch")
    assert [m for m in not_the_pulls if m in loaded] == []


def test_reader_with_the_kubelet_token_reads_what_the_kubernetes_client_reads(kube, node, tmp_path):
    api = kubeconn.agent_api(str(node_kubeconfig(kube, tmp_path, NODE)))
    assert api.reader is not None and api._client is None
    got = profilesource.get_node(api, NODE)
    assert api._client is None          # the GET went through the reader
    assert got["metadata"]["name"] == NODE and TAINT in got["spec"]["taints"]
    # The same object through the kubernetes client (attribute access makes it), minus what moves on its own.
    direct = profilesource._request(api.client(), "GET", f"/api/v1/nodes/{NODE}")
    assert direct["metadata"]["uid"] == got["metadata"]["uid"]
    # A missing profile is None, as before.
    assert profilesource.get_profile(kubeconn.agent_api(str(node_kubeconfig(kube, tmp_path, NODE))), "nope") is None


def test_reader_refusals_read_as_the_kubernetes_client_reports_them(kube, node, tmp_path):
    bad = kube.kubeconfig(token="not-a-token", user="nobody")
    api = kubeconn.agent_api(str(_write(tmp_path / "bad", bad)))
    assert api.reader is not None
    with pytest.raises(NodewarmError) as e:
        profilesource.get_profile(api, "any")
    assert e.value.reason == "ProfileForbidden" and "cannot read WarmProfile any: 401 Unauthorized" in str(e.value)
    from kubernetes.client.exceptions import ApiException

    node_api = kubeconn.agent_api(str(node_kubeconfig(kube, tmp_path, NODE)))
    path = "/api/v1/namespaces/default/secrets"        # nothing a node may list
    with pytest.raises(ApiException) as thin:
        profilesource._request(node_api, "GET", path)
    with pytest.raises(ApiException) as full:
        profilesource._request(node_api.client(), "GET", path)
    assert (thin.value.status, thin.value.reason, thin.value.body) == \
        (full.value.status, full.value.reason, full.value.body) and thin.value.status == 403


def test_reader_token_file_and_inline_ca(kube, node, tmp_path):
    import base64

    token = tmp_path / "token"
    token.write_text(kube.node_token(NODE) + "\n")
    doc = kube.kubeconfig()
    doc["users"][0]["user"] = {"tokenFile": "token"}                # relative to the kubeconfig's folder
    cluster = doc["clusters"][0]["cluster"]
    cluster["certificate-authority-data"] = base64.b64encode(open(cluster.pop("certificate-authority"), "rb").read()).decode()
    api = kubeconn.agent_api(str(_write(tmp_path / "kubeconfig", doc)))
    assert profilesource.get_node(api, NODE)["metadata"]["name"] == NODE


def _plugin(tmp_path, body: str):
    script = tmp_path / "plugin"
    script.write_text(f"#!{sys.executable}\nimport json, os, sys\n" + textwrap.dedent(body))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_reader_exec_plugin_token_and_its_refresh(kube, node, tmp_path):
    """An exec plugin as EKS's (aws eks get-token, aws-iam-authenticator): run with KUBERNETES_EXEC_INFO and the
    kubeconfig's env, its ExecCredential's token sent; an expired credential is asked for again."""
    runs = tmp_path / "runs"
    plugin = _plugin(tmp_path, f"""
        info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
        assert info["kind"] == "ExecCredential" and info["apiVersion"] == sys.argv[1], info
        with open({str(runs)!r}, "a") as f:
            f.write(os.environ["CLUSTER"] + "\\n")
        print(json.dumps({{"apiVersion": sys.argv[1], "kind": "ExecCredential",
                          "status": {{"token": {kube.node_token(NODE)!r}, "expirationTimestamp": "2000-01-01T00:00:00Z"}}}}))
    """)
    doc = kube.kubeconfig()
    doc["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": str(plugin),
                                        "args": ["client.authentication.k8s.io/v1beta1"],
                                        "env": [{"name": "CLUSTER", "value": "demo"}]}}
    api = kubeconn.agent_api(str(_write(tmp_path / "kubeconfig", doc)))
    assert profilesource.get_node(api, NODE)["metadata"]["name"] == NODE
    assert profilesource.get_node(api, NODE)["metadata"]["name"] == NODE
    # Expired on arrival: run for each request, never a stale token sent.
    assert runs.read_text().splitlines() == ["demo", "demo"]


def test_reader_exec_plugin_failure_is_a_refusal(kube, node, tmp_path):
    plugin = _plugin(tmp_path, """
        sys.stderr.write("no credentials for this role")
        sys.exit(3)
    """)
    doc = kube.kubeconfig()
    doc["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}}
    api = kubeconn.agent_api(str(_write(tmp_path / "kubeconfig", doc)))
    with pytest.raises(NodewarmError) as e:
        profilesource.get_profile(api, "any")
    assert e.value.reason == "ProfileForbidden" and "401" in str(e.value)


def test_reader_in_cluster_service_account(kube, node, admin, tmp_path, monkeypatch):
    """The DaemonSet's identity: KUBERNETES_SERVICE_HOST/PORT, the projected token (read at each request: the
    kubelet rotates it) and the CA beside it."""
    import shutil
    from urllib.parse import urlsplit

    from kubernetes import client as k8s

    core = k8s.CoreV1Api(admin)
    core.create_namespaced_service_account("default", {"metadata": {"name": "startup-agent"}})
    try:
        sa = tmp_path / "sa"
        sa.mkdir()
        shutil.copy(kube.ca_file, sa / "ca.crt")
        (sa / "token").write_text("stale")
        u = urlsplit(kube.server)
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", u.hostname)
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(u.port))
        reader = kubeconn.reader_in_cluster(str(sa))
        with pytest.raises(kubeconn.HttpError) as e:
            reader.get_json("/api/v1/namespaces/default/serviceaccounts/startup-agent")
        assert e.value.status == 401
        (sa / "token").write_text(kube.service_account_token("default", "startup-agent"))
        # Authenticated now (RBAC gives this ServiceAccount nothing: 403, not 401).
        with pytest.raises(kubeconn.HttpError) as e:
            reader.get_json("/api/v1/namespaces/default/serviceaccounts/startup-agent")
        assert e.value.status == 403 and "system:serviceaccount:default:startup-agent" in e.value.body
    finally:
        core.delete_namespaced_service_account("startup-agent", "default")


def test_what_the_reader_does_not_handle_goes_to_the_kubernetes_client(kube, node, tmp_path):
    doc = kube.kubeconfig(token=kube.node_token(NODE))
    doc["users"][0]["user"] = {"auth-provider": {"name": "oidc"}, "token": kube.node_token(NODE)}
    api = kubeconn.agent_api(str(_write(tmp_path / "kubeconfig", doc)))
    assert api.reader is None
    joined = f"{node_kubeconfig(kube, tmp_path, NODE)}{os.pathsep}{tmp_path / 'kubeconfig'}"
    assert kubeconn.agent_api(joined).reader is None
    # Several files: the kubernetes client merges them as kubectl does, and serves the GETs.
    assert profilesource.get_node(kubeconn.agent_api(joined), NODE)["metadata"]["name"] == NODE


def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def mtls_server(tmp_path):
    """An HTTPS server that requires a client certificate from its CA and answers with the certificate's CN (the
    session's API server has no client CA; this checks the reader presents the kubeconfig's certificate)."""
    import http.server
    import ssl
    import threading

    d = tmp_path / "pki"
    d.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
             "-subj", "/CN=test-ca", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN=system:node:{name}", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext", cwd=d)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            cn = dict(x[0] for x in self.connection.getpeercert()["subject"])["commonName"]
            body = json.dumps({"kind": "Node", "metadata": {"name": cn}, "path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "server.crt", d / "server.key")
    ctx.load_verify_locations(d / "ca.crt")
    ctx.verify_mode = ssl.CERT_REQUIRED
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}", d
    httpd.shutdown()


@pytest.mark.parametrize("inline", [False, True])
def test_reader_client_certificate(mtls_server, tmp_path, monkeypatch, inline):
    import base64

    server, d = mtls_server
    if inline:
        user = {f"client-{k}-data": base64.b64encode((d / f"client.{ext}").read_bytes()).decode()
                for k, ext in (("certificate", "crt"), ("key", "key"))}
    else:
        user = {"client-certificate": "pki/client.crt", "client-key": str(d / "client.key")}
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(d / "ca.crt")}}],
           "users": [{"name": "u", "user": user}],
           "contexts": [{"name": "c", "context": {"cluster": "local", "user": "u"}}]}
    api = kubeconn.agent_api(str(_write(tmp_path / "kubeconfig", doc)))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    got = profilesource.get_node(api, "n1")
    assert got == {"kind": "Node", "metadata": {"name": "system:node:client"}, "path": "/api/v1/nodes/n1"}
    assert api._client is None
    assert list((tmp_path / "tmp").iterdir()) == []      # inline key material: its temp file is gone


def test_a_malformed_kubeconfig_is_the_kubernetes_clients_to_report(tmp_path):
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [unclosed\n")
    api = kubeconn.agent_api(str(bad))
    assert api.reader is None
    with pytest.raises(Exception) as e:
        profilesource.get_profile(api, "any")
    assert type(e.value).__module__.startswith(("kubernetes", "yaml"))
