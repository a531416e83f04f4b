"""A real kube-apiserver (v1.20.2, built from Debian's source by build-kube.sh) + etcd on 127.0.0.1.

(Over 300 lines: starting the local control plane is one recipe (certificates, tokens, etcd, the API server and its
CRDs, then the scheduler and controller-manager against it) whose steps share the cluster's certificates, tokens and
kubeconfigs.)

RBAC and NodeRestriction are on, anonymous auth is off: tests and the demo talk to it exactly as to a
cluster, with bearer tokens. ``tokens.csv`` holds an admin (system:masters) and one token per simulated
kubelet (system:nodes), so NodeRestriction is exercised for real. ServiceAccount tokens come from the
TokenRequest API. Facts about this server (no CEL, silent pruning, no controller-manager) are in
docs/testing.md, "The local API server".
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .ports import free_port, wait_until

def kube_bin_dir() -> Path:
    return Path(os.environ.get("NODEWARM_KUBE_BIN", Path.home() / ".cache/nodewarm/k8s"))


CRDS_ENV = "NODEWARM_CRDS_DIR"
SERVICE_RANGE = "10.0.0.0/24"
KUBERNETES_SERVICE = "10.0.0.1:443"       # the first address of SERVICE_RANGE: the `kubernetes` Service
S3_SERVICE = "10.0.0.10:80"               # an in-cluster S3 Service's ClusterIP, as real nodes' pods reach it
# Kinds this v1.20 API server does not serve: policy/v1 is 1.21's, the admission policy 1.30's.
NOT_SERVED = frozenset({"PodDisruptionBudget", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"})


def crds_dir() -> Path | None:
    """The folder of a Karpenter release's own CRDs (its pkg/apis/crds) named by $NODEWARM_CRDS_DIR, or None: then
    the test environment uses the CRDs nodewarm generates from Karpenter's Go types (nodewarm.karpenter.crds)."""
    value = os.environ.get(CRDS_ENV)
    return Path(value) if value else None


def _require(path: Path, hint: str) -> str:
    if not path.exists():
        raise RuntimeError(f"{path} not found: {hint}")
    return str(path)


@dataclass
class KubeCluster:
    server: str
    ca_file: str
    admin_token: str
    workdir: Path
    node_tokens: dict[str, str] = field(default_factory=dict)
    _procs: list[subprocess.Popen] = field(default_factory=list, repr=False)

    # -- clients ---------------------------------------------------------------------------------
    def api_client(self, token: str | None = None):
        """A kubernetes.client.ApiClient; admin unless another bearer token is given."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.server
        cfg.ssl_ca_cert = self.ca_file
        cfg.api_key = {"authorization": f"Bearer {token or self.admin_token}"}
        return client.ApiClient(cfg)

    def kubeconfig(self, token: str | None = None, user: str = "admin") -> dict:
        return {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": self.server, "certificate-authority": self.ca_file}}],
            "users": [{"name": user, "user": {"token": token or self.admin_token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        }

    def write_kubeconfig(self, path: Path | None = None, token: str | None = None, user: str = "admin") -> Path:
        path = path or self.workdir / f"kubeconfig-{user}"
        path.write_text(yaml.safe_dump(self.kubeconfig(token, user)))
        path.chmod(0o600)
        return path

    def node_token(self, node_name: str) -> str:
        """A kubelet-like identity (system:node:<name>, group system:nodes), from tokens.csv."""
        return self.node_tokens[node_name]

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        from kubernetes import client

        api = client.CoreV1Api(self.api_client())
        req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=["https://kubernetes.default.svc"], expiration_seconds=seconds))
        return api.create_namespaced_service_account_token(name, namespace, req).status.token

    def controller_token(self, namespace: str) -> str:
        """A token for the controller's ServiceAccount, with its Namespace and its rendered RBAC applied first: the
        identity the controller's pod has. What it may do is what that RBAC (with the Roles a profile's render binds
        to it) says, not what an admin may."""
        from nodewarm.controller import manifests
        from nodewarm.kubeapply import apply

        apply(self.api_client(), [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                                  *manifests.rbac(namespace)])
        return self.service_account_token(namespace, manifests.NAME)

    def username(self, token: str) -> str:
        """Who the API server says ``token`` is (a TokenReview, as admin)."""
        from kubernetes import client

        review = client.AuthenticationV1Api(self.api_client()).create_token_review(
            client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token)))
        if not review.status.authenticated:
            raise RuntimeError(f"the API server does not accept this token: {review.status.error}")
        return review.status.user.username

    # -- setup -----------------------------------------------------------------------------------
    def apply_crds(self, docs: list[dict], timeout_s: float = 30) -> None:
        """Create (or replace) CRDs and wait until each is Established."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        api = client.ApiextensionsV1Api(self.api_client())
        for doc in docs:
            name = doc["metadata"]["name"]
            try:
                api.create_custom_resource_definition(doc)
            except ApiException as e:
                if e.status != 409:
                    raise
                current = api.read_custom_resource_definition(name)
                doc = {**doc, "metadata": {**doc["metadata"], "resourceVersion": current.metadata.resource_version}}
                api.replace_custom_resource_definition(name, doc)
        for doc in docs:
            name = doc["metadata"]["name"]

            def established() -> bool:
                conds = api.read_custom_resource_definition(name).status.conditions or []
                return any(c.type == "Established" and c.status == "True" for c in conds)

            wait_until(established, timeout_s, f"CRD {name} established")

    def stop(self) -> None:
        for p in reversed(self._procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self._procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs.clear()

    def __enter__(self) -> "KubeCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def load_crd_files(paths: list[Path]) -> list[dict]:
    docs = []
    for p in paths:
        docs += [d for d in yaml.safe_load_all(Path(p).read_text()) if d and d.get("kind") == "CustomResourceDefinition"]
    return docs


UPSTREAM_CRD_FILES = ("karpenter.sh_nodepools.yaml", "karpenter.sh_nodeclaims.yaml",
                      "karpenter.k8s.aws_ec2nodeclasses.yaml")


def upstream_crd_files(directory: Path) -> list[Path]:
    """The three Karpenter CRD files nodewarm works with (NodePool, NodeClaim, EC2NodeClass) in a release's folder."""
    missing = [n for n in UPSTREAM_CRD_FILES if not (directory / n).exists()]
    if missing:
        raise RuntimeError(f"Karpenter CRDs {missing} not found in {directory} ({CRDS_ENV}): point it at the folder "
                           "holding the CRDs of the Karpenter release you run (its pkg/apis/crds/), or unset it to "
                           "use the CRDs nodewarm generates")
    return [directory / n for n in UPSTREAM_CRD_FILES]


def karpenter_crds() -> list[dict]:
    """Karpenter's three CRDs as the test environment installs and checks against them: a release's own files when
    $NODEWARM_CRDS_DIR names them, else nodewarm's (docs/testing.md, "Karpenter's CRDs in the tests")."""
    from nodewarm.karpenter.crds import crds

    d = crds_dir()
    return load_crd_files(upstream_crd_files(d)) if d else crds()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def start(workdir: Path | None = None, node_names: tuple[str, ...] = (), timeout_s: float = 90,
          extra_args: tuple[str, ...] = (), in_cluster: bool = False) -> KubeCluster:
    """Start etcd and kube-apiserver on free loopback ports; return once /readyz answers ok.

    ``node_names``: kubelet identities to put in tokens.csv (a Node can only be touched by its own).

    ``in_cluster``: pods on real nodes (realnode) get their ServiceAccount's token as pods of a cluster do. The
    ServiceAccount admission plugin is on, with v1.20's BoundServiceAccountTokenVolume (alpha there, on by default
    from 1.21 and what EKS runs): a pod gets a projected volume whose token the kubelet requests and renews, and
    whose ca.crt is the ``kube-root-ca.crt`` ConfigMap (``start_controller_manager`` publishes it). The pod reaches
    the server through the ``kubernetes`` Service's ClusterIP (10.0.0.1:443, which the server's certificate names):
    realnode's ``services`` carry it there.
    """
    bins = kube_bin_dir()
    apiserver = _require(bins / "kube-apiserver", "build it first: bash dev/src/nodewarm_dev/testenv/build-kube.sh")
    etcd = shutil.which("etcd") or _require(Path("/usr/bin/etcd"), "apt-get install etcd-server")
    work = Path(workdir or tempfile.mkdtemp(prefix="nodewarm-kube-"))
    work.mkdir(parents=True, exist_ok=True)
    certs = work / "certs"
    certs.mkdir(exist_ok=True)
    if not (certs / "sa.key").exists():
        _openssl("genrsa", "-out", str(certs / "sa.key"), "2048")
        _openssl("rsa", "-in", str(certs / "sa.key"), "-pubout", "-out", str(certs / "sa.pub"))

    admin = secrets.token_hex(16)
    node_tokens = {n: secrets.token_hex(16) for n in node_names}
    lines = [f'{admin},admin,admin,"system:masters"']
    lines += [f'{t},system:node:{n},node-{n},"system:nodes"' for n, t in node_tokens.items()]
    (work / "tokens.csv").write_text("\n".join(lines) + "\n")

    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    admission = ["--enable-admission-plugins", "NodeRestriction", "--disable-admission-plugins", "ServiceAccount"]
    if in_cluster:
        admission = ["--enable-admission-plugins", "NodeRestriction,ServiceAccount",
                     "--feature-gates", "BoundServiceAccountTokenVolume=true"]
    procs: list[subprocess.Popen] = []
    etcd_log = open(work / "etcd.log", "wb")
    procs.append(subprocess.Popen([
        etcd, "--data-dir", str(work / "etcd"), "--name", "nodewarm",
        "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
        "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
        "--initial-cluster", f"nodewarm=http://127.0.0.1:{peer_port}",
        "--unsafe-no-fsync", "--log-level", "warn",
    ], stdout=etcd_log, stderr=subprocess.STDOUT, start_new_session=True))

    api_log = open(work / "apiserver.log", "wb")
    procs.append(subprocess.Popen([
        apiserver,
        "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
        "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
        "--secure-port", str(api_port), "--insecure-port", "0",
        "--cert-dir", str(certs),
        "--token-auth-file", str(work / "tokens.csv"),
        "--authorization-mode", "Node,RBAC",
        "--anonymous-auth=false",
        "--service-account-issuer", "https://kubernetes.default.svc",
        "--service-account-key-file", str(certs / "sa.pub"),
        "--service-account-signing-key-file", str(certs / "sa.key"),
        "--api-audiences", "https://kubernetes.default.svc",
        *admission,
        "--allow-privileged=true",
        "--endpoint-reconciler-type", "none",
        "--service-cluster-ip-range", SERVICE_RANGE,
        *extra_args,
    ], stdout=api_log, stderr=subprocess.STDOUT, start_new_session=True))

    cluster = KubeCluster(server=f"https://127.0.0.1:{api_port}", ca_file=str(certs / "apiserver.crt"),
                          admin_token=admin, workdir=work, node_tokens=node_tokens, _procs=procs)

    def ready() -> bool:
        import ssl
        import urllib.request

        if not Path(cluster.ca_file).exists():
            return False
        ctx = ssl.create_default_context(cafile=cluster.ca_file)
        req = urllib.request.Request(f"{cluster.server}/readyz", headers={"Authorization": f"Bearer {admin}"})
        with urllib.request.urlopen(req, context=ctx, timeout=2) as r:
            return r.status == 200

    try:
        wait_until(ready, timeout_s, "kube-apiserver /readyz", procs[1])
    except Exception as e:
        cluster.stop()
        tail = (work / "apiserver.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{e}\n--- apiserver log ---\n{tail}") from None
    return cluster


def _component_kubeconfig(cluster: KubeCluster, name: str, cluster_roles: tuple[str, ...]) -> Path:
    """A ServiceAccount in kube-system bound to the component's built-in ClusterRoles, as a kubeconfig
    (tokens.csv is read once at start, so components use TokenRequest tokens)."""
    from kubernetes import client

    def create(fn, *args):
        try:
            fn(*args)
        except client.ApiException as e:
            if e.status != 409:
                raise

    core, rbac = client.CoreV1Api(cluster.api_client()), client.RbacAuthorizationV1Api(cluster.api_client())
    ns = "kube-system"
    create(core.create_namespace, {"metadata": {"name": ns}})
    create(core.create_namespaced_service_account, ns, {"metadata": {"name": name}})
    for role in cluster_roles:
        create(rbac.create_cluster_role_binding, {
            "metadata": {"name": f"nodewarm-{name}-{role.replace(':', '-')}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
        })
    token = cluster.service_account_token(ns, name, seconds=86400)
    return cluster.write_kubeconfig(cluster.workdir / f"kubeconfig-{name}", token, name)


def _start_component(cluster: KubeCluster, binary: str, args: list[str]) -> subprocess.Popen:
    exe = _require(kube_bin_dir() / binary, "build it first: bash dev/src/nodewarm_dev/testenv/build-kube.sh")
    log = open(cluster.workdir / f"{binary}.log", "wb")
    proc = subprocess.Popen([exe, *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    cluster._procs.append(proc)
    time.sleep(0.5)
    if proc.poll() is not None:
        raise RuntimeError(f"{binary} exited at start:\n" + (cluster.workdir / f"{binary}.log").read_text()[-3000:])
    return proc


def start_scheduler(cluster: KubeCluster, max_backoff_s: int | None = None) -> subprocess.Popen:
    """The real kube-scheduler: pod placement is decided by it, not by nodewarm or its tests.

    ``max_backoff_s`` sets ``podInitialBackoffSeconds`` and ``podMaxBackoffSeconds`` (v1.20 defaults: 1 and
    10). The demo lowers them for both of its worlds alike: this v1.20 scheduler retries every pending pod on
    any node condition change and then holds it in back-off even once nothing else is waiting; schedulers
    with queueing hints (on by default from 1.32) do not retry on a condition, and from 1.33 (KEP-5142) an
    idle scheduler pops pods from back-off at once. Tests keep the defaults.
    """
    kcfg = _component_kubeconfig(cluster, "kube-scheduler", ("system:kube-scheduler", "system:volume-scheduler"))
    args = ["--kubeconfig", str(kcfg), "--leader-elect=false", "--port", "0"]
    if max_backoff_s is not None:
        # With --config the scheduler ignores its deprecated flags (--kubeconfig, --leader-elect) and --port too,
        # and its insecure healthz/metrics listener would default to 0.0.0.0:10251 (a fixed port: a second
        # scheduler on the machine could not start). All of it goes in the file, that listener on loopback.
        insecure = f"127.0.0.1:{free_port()}"
        config = cluster.workdir / "kube-scheduler-config.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubescheduler.config.k8s.io/v1beta1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kcfg)}, "leaderElection": {"leaderElect": False},
            "healthzBindAddress": insecure, "metricsBindAddress": insecure,
            "podInitialBackoffSeconds": 1, "podMaxBackoffSeconds": max(1, int(max_backoff_s)),
        }))
        args = ["--config", str(config)]
    return _start_component(cluster, "kube-scheduler", [
        *args, "--bind-address", "127.0.0.1", "--secure-port", str(free_port()),
        "--authentication-kubeconfig", str(kcfg), "--authorization-kubeconfig", str(kcfg),
        "--authentication-tolerate-lookup-failure=true",
    ])


# kube-controller-manager's controllers this module may run, and the built-in ClusterRoles each acts with. The
# publisher's own role (v1.20) only writes ConfigMaps: its informers list namespaces and ConfigMaps as the
# controller-manager itself, whose role reads them.
CONTROLLER_ROLES = {"deployment": ("system:controller:deployment-controller",),
                    "replicaset": ("system:controller:replicaset-controller",),
                    "daemonset": ("system:controller:daemon-set-controller",),
                    "serviceaccount": ("system:controller:service-account-controller",
                                       "system:kube-controller-manager"),
                    "root-ca-cert-publisher": ("system:controller:root-ca-cert-publisher",
                                               "system:kube-controller-manager")}


def start_controller_manager(cluster: KubeCluster,
                             controllers: tuple[str, ...] = ("deployment", "replicaset")) -> subprocess.Popen:
    """kube-controller-manager running ONLY ``controllers`` (by default the Deployment and ReplicaSet ones, so
    Deployments create Pods; an in-cluster one adds ``daemonset``, ``serviceaccount`` (every namespace's
    ``default`` ServiceAccount, which admission requires of a pod naming none) and ``root-ca-cert-publisher``,
    which publishes the server's CA as the ``kube-root-ca.crt`` ConfigMap a pod's projected token volume reads). Never the
    node-lifecycle controllers: with no kubelets they would evict everything."""
    unknown = sorted(set(controllers) - set(CONTROLLER_ROLES))
    if unknown:
        raise ValueError(f"controllers {unknown}: this test environment runs only {sorted(CONTROLLER_ROLES)}")
    kcfg = _component_kubeconfig(cluster, "kube-controller-manager", tuple(r for c in controllers for r in CONTROLLER_ROLES[c]))
    return _start_component(cluster, "kube-controller-manager", [
        "--kubeconfig", str(kcfg), "--controllers", ",".join(controllers), "--leader-elect=false",
        "--port", "0", "--secure-port", "0", "--use-service-account-credentials=false",
        "--root-ca-file", cluster.ca_file,
    ])
