"""A real node for the local API server: kubelet v1.20.2 (built from the same Debian source as the API server by
build-kubelet.sh) with its own containerd (Debian's 1.6.20) and runc, registering with its own identity.

(Over 300 lines: one recipe, a node's whole life on this machine (its containerd, its kubelet, their identity, cgroups,
mount namespace, CNI bridge, sandbox image, then the teardown of all of it), whose steps share one node's paths.)

    claim = sim.create_nodeclaim(pool); sim.launch(claim["metadata"]["name"])       # the Karpenter stand-in
    node = realnode.start(kube, "node-6", workdir, **realnode.from_nodeclaim(k.get(NODECLAIMS, name)))
    ...                                                 # the kubelet registered node-6 and it is Ready
    node.stop()                                         # kubelet, containers, shims, containerd, cgroups, bridge

What one node is, and why:

- **Its own containerd** (``containerd --config``): root, state, gRPC socket, runc root, CNI config and IPAM
  directories of its own, cgroupfs (``SystemdCgroup = false``), the overlayfs snapshotter, the CRI stream server on a
  random loopback port, the sandbox image ``PAUSE_IMAGE``: a static C ``pause`` built by build-kubelet.sh, packed
  here as an OCI archive and imported with ``ctr -n k8s.io images import`` (no image registry is reachable here).
  ``registries`` writes containerd ``hosts.toml`` mirrors (e.g. a registry on 127.0.0.1).
- **Its own kubelet**: ``--root-dir``, ports (serving, healthz) and a cgroup root (``/nodewarm-rn-ID``) of its own,
  ``--container-runtime=remote``, ``--hostname-override``, ``--provider-id``, ``--node-labels`` and
  ``--register-with-taints`` as Karpenter's AL2023 bootstrap passes them (``from_nodeclaim``: the NodeClaim's taints
  and startupTaints plus ``karpenter.sh/unregistered:NoExecute``). Eviction thresholds are all off (``0%``: a full disk
  never evicts), image GC at 100 %, no iptables chains, no static pods, webhook authn/authz on 127.0.0.1 only
  (no anonymous access; the API server here has no kubelet client certificate, so ``kubectl logs``/``exec`` through
  it do not work: read the container logs from ``log_dir``).
- **Its identity**: ``system:node:NAME`` in group ``system:nodes``, so NodeRestriction and the Node authorizer act
  on it. A client certificate (O=system:nodes) signed by the cluster's client CA when the API server trusts one
  (``client_ca_args`` makes it; the session cluster of tests/conftest.py has none), else the cluster's tokens.csv
  bearer token for NAME (what EKS does too: its kubelets authenticate with a bearer token mapped to
  ``system:node:<name>``). With neither, ``start`` refuses and says so.
- **A mount namespace per node** (``unshare --mount --propagation slave``, containerd first, the kubelet joins it
  with ``nsenter``): kubelet v1.20 hard-codes ``/var/log/pods``, ``/var/log/containers`` and
  ``/var/lib/kubelet/device-plugins`` (it empties the last one at start, and garbage-collects pod log folders of
  pods it does not know), so two kubelets on one machine would break each other there; each node bind-mounts its own
  folders over them. Every mount a node makes (its root-dir made rshared, volumes, overlay rootfs, netns) lives in
  that namespace and goes with it: ``stop`` leaves no mount on the host.
- **Networking**: pods that can run with ``hostNetwork: true`` (the tests' do): nothing to set up or route, and
  the pod's address is the node's. But the kubelet reports Ready only once the runtime reports NetworkReady, which
  containerd does only with a loaded CNI config, and nodewarm's own pods (the agent DaemonSet, vLLM's Deployment)
  are rendered without hostNetwork; so each node also gets a bridge/host-local/loopback conflist from Debian's
  ``containernetworking-plugins`` (bridge ``nwrnN``, subnet ``10.250.N.0/24``, gateway on the host, no masquerade,
  no iptables rules in the host's tables, no portmap): such a pod gets an address there, reachable from the host.
  No kube-proxy and no cluster DNS: ``services`` gives the pods the few ClusterIPs a test names (the API server's,
  S3's), by a DNAT in each pod's own network namespace to a relay on the gateway (podservices). ``stop`` deletes
  the bridge and the relays.
- **Capacity is the machine's**: the kubelet reports this VM's CPUs, memory and disk and no ``nvidia.com/gpu``
  (``KarpenterSim.kubelet_ready`` writes a p5's), and every real node on the machine reports the same ones. The
  scheduler would leave a pod that requests a GPU (vLLM's Deployment does) Pending until ``advertise`` puts
  ``nvidia.com/gpu`` on the Node (the kubelet keeps it and makes it allocatable; no device is behind it). A pod
  bound with ``nodeName`` runs anyway: kubelet v1.20 drops extended resources its node lacks before admission.
- **What the kubelet changes on the host**: at start kubelet v1.20 sets vm.overcommit_memory=1, vm.panic_on_oom=0,
  kernel.panic=10, kernel.panic_on_oops=1 and the root keyring quotas (``setupKernelTunables``); the bridge plugin
  turns on IPv4 forwarding. They are saved before the first node starts and restored when the last one stops
  (``reap_stale``, run by every ``start``, tears down the nodes of a run killed before ``stop`` and restores them).
- **Without CAP_SYS_RESOURCE** (this project's VM: root lacks it) nothing may lower an oom_score_adj, so containerd
  is told ``restrict_oom_score_adj`` (else every sandbox fails: runc's init cannot set -998); the kubelet logs that
  it cannot set its own -999 and goes on. Where the capability is there, containerd runs with its defaults.
- **Not done here**: the node lifecycle controller. The API server's admission adds
  ``node.kubernetes.io/not-ready:NoSchedule`` to every new Node and nothing here removes it, so once the Node is
  Ready ``start`` removes it (``lift_not_ready``), as that controller would; Ready going False later is not
  mirrored. Kubelet v1.20 does not check taints when it admits a pod that names its node (the scheduler and the
  taint manager enforce them), so a pod bound with ``nodeName`` runs whatever its tolerations.

``RealNodeUnavailable`` says why a node cannot run on this machine (not root, something not built or installed,
no cgroup v1, no overlayfs); tests let it fail them, never skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import podservices
from .kube import KubeCluster, kube_bin_dir
from .ports import free_port

PAUSE_IMAGE = "localhost/nodewarm/pause:1.0"
UNREGISTERED = {"key": "karpenter.sh/unregistered", "effect": "NoExecute"}
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
CNI_BIN_DIR = Path("/usr/lib/cni")                 # Debian's containernetworking-plugins
CGROUP_ROOT = Path("/sys/fs/cgroup")
STATE_BASE = Path("/run/nodewarm-realnode")       # short paths: unix sockets are limited to 107 bytes
# Host paths kubelet v1.20 hard-codes; each node bind-mounts its own folder over them in its mount namespace.
SHARED_HOST_DIRS = {"log-pods": "/var/log/pods", "log-containers": "/var/log/containers",
                    "device-plugins": "/var/lib/kubelet/device-plugins"}
# What kubelet v1.20 (setupKernelTunables) and the bridge plugin change on the host.
HOST_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward")
# Labels a v1.20 kubelet may set on its own Node (k8s.io/kubernetes pkg/kubelet/apis/well_known_labels.go).
KUBELET_LABELS = {"kubernetes.io/hostname", "topology.kubernetes.io/zone", "topology.kubernetes.io/region",
                  "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
                  "beta.kubernetes.io/instance-type", "node.kubernetes.io/instance-type", "kubernetes.io/os",
                  "kubernetes.io/arch", "beta.kubernetes.io/os", "beta.kubernetes.io/arch"}
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")


class RealNodeUnavailable(RuntimeError):
    """A real node cannot run on this machine; the message says why and what to do."""


# -- what a node needs -----------------------------------------------------------------------------------------
def _cgroup_v1_hierarchies() -> dict[str, Path]:
    """Mounted cgroup v1 hierarchies by controller (and ``name=systemd``), from /proc/self/mountinfo."""
    out: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fields = post.split()
        if len(fields) >= 3 and fields[0] == "cgroup":
            mnt = Path(pre.split()[4])
            for opt in fields[2].split(","):
                if opt in ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "hugetlb",
                           "net_cls", "net_prio", "perf_event", "name=systemd"):
                    out[opt] = mnt
    return out


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except OSError:          # e.g. /root/.cache as another user
        return False


def preflight() -> None:
    """Raise RealNodeUnavailable listing every reason a real node cannot start here."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root (containerd, runc, cgroups and mounts need root)")
    bins = kube_bin_dir()
    for b in ("kubelet", "pause"):
        if not _exists(bins / b):
            problems.append(f"{bins / b} missing: bash dev/src/nodewarm_dev/testenv/build-kubelet.sh")
    for tool, pkg in (("containerd", "containerd"), ("ctr", "containerd"), ("runc", "runc"),
                      ("containerd-shim-runc-v2", "containerd"), ("unshare", "util-linux"),
                      ("nsenter", "util-linux"), ("ip", "iproute2"), ("iptables", "iptables")):
        if not shutil.which(tool):
            problems.append(f"{tool} not found: apt-get install {pkg} (build-kubelet.sh installs it)")
    for p in ("bridge", "host-local", "loopback"):
        if not _exists(CNI_BIN_DIR / p):
            problems.append(f"{CNI_BIN_DIR / p} missing: apt-get install containernetworking-plugins")
    try:
        fstype = subprocess.run(["stat", "-fc", "%T", str(CGROUP_ROOT)], capture_output=True, text=True).stdout.strip()
    except OSError:
        fstype = "?"
    if fstype == "cgroup2fs":
        problems.append(f"{CGROUP_ROOT} is cgroup v2 only: kubelet v1.20 with the cgroupfs driver needs cgroup v1")
    else:
        missing = {"cpu", "cpuacct", "cpuset", "memory", "pids", "name=systemd"} - set(_cgroup_v1_hierarchies())
        if missing:
            problems.append(f"cgroup v1 hierarchies not mounted under {CGROUP_ROOT}: {sorted(missing)}")
    if "overlay" not in Path("/proc/filesystems").read_text():
        problems.append("no overlayfs in /proc/filesystems (containerd's overlayfs snapshotter needs it)")
    if problems:
        raise RealNodeUnavailable("a real node cannot run on this machine: " + "; ".join(problems))


# -- the sandbox image -----------------------------------------------------------------------------------------
def _tar_bytes(members: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, (data, mode) in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pause_image_archive() -> Path:
    """An OCI image archive of PAUSE_IMAGE (one layer: /pause, the static binary build-kubelet.sh compiles), made
    once next to it; deterministic, so every node imports the same digest."""
    binary = kube_bin_dir() / "pause"
    data = binary.read_bytes()
    out = kube_bin_dir() / f"pause-image-{hashlib.sha256(data).hexdigest()[:12]}.oci.tar"
    if out.exists():
        return out
    blobs: dict[str, bytes] = {}

    def blob(b: bytes) -> dict:
        d = "sha256:" + hashlib.sha256(b).hexdigest()
        blobs[d] = b
        return {"digest": d, "size": len(b)}

    layer = blob(_tar_bytes({"pause": (data, 0o755)}))
    config = blob(json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]},
    }, sort_keys=True).encode())
    manifest = blob(json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer}],
    }, sort_keys=True).encode())
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest,
        "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"io.containerd.image.name": PAUSE_IMAGE,
                        "org.opencontainers.image.ref.name": PAUSE_IMAGE.rsplit(":", 1)[1]}}]}
    members = {"oci-layout": (b'{"imageLayoutVersion":"1.0.0"}', 0o644),
               "index.json": (json.dumps(index, sort_keys=True).encode(), 0o644)}
    members.update({f"blobs/sha256/{d.split(':')[1]}": (b, 0o644) for d, b in blobs.items()})
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(_tar_bytes(members))
    tmp.rename(out)
    return out


# -- identity --------------------------------------------------------------------------------------------------
def _openssl(*args: str, cwd: Path | None = None) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=cwd)


def client_ca_args(workdir: Path) -> tuple[str, ...]:
    """Make a client CA in ``workdir/certs`` (client-ca.crt/.key) and return the API server arguments that trust it:
    ``kube.start(workdir, extra_args=realnode.client_ca_args(workdir))``. Nodes of that cluster then authenticate
    with client certificates this module signs."""
    certs = Path(workdir) / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    key, crt = certs / "client-ca.key", certs / "client-ca.crt"
    if not crt.exists():
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key))
        _openssl("req", "-x509", "-new", "-key", str(key), "-subj", "/CN=nodewarm-test-client-ca", "-days", "3650",
                 "-out", str(crt))
    return ("--client-ca-file", str(crt))


def _client_ca(cluster: KubeCluster) -> tuple[Path, Path] | None:
    certs = Path(cluster.workdir) / "certs"
    key, crt = certs / "client-ca.key", certs / "client-ca.crt"
    if key.exists() and crt.exists() and str(crt) in _apiserver_args(cluster):
        return crt, key
    return None


def _apiserver_args(cluster: KubeCluster) -> list[str]:
    for p in cluster._procs:
        args = p.args if isinstance(p.args, list) else [str(p.args)]
        if args and str(args[0]).endswith("kube-apiserver"):
            return [str(a) for a in args]
    return []


def _node_credentials(cluster: KubeCluster, name: str, pki: Path, auth: str) -> tuple[dict, str]:
    """The kubelet kubeconfig's user for system:node:NAME, and how it was made ("client-cert" or "token")."""
    ca = _client_ca(cluster)
    if auth in ("auto", "cert") and ca:
        crt, key = pki / "kubelet-client.crt", pki / "kubelet-client.key"
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key))
        _openssl("req", "-new", "-key", str(key), "-subj", f"/O=system:nodes/CN=system:node:{name}",
                 "-out", str(pki / "kubelet-client.csr"))
        _openssl("x509", "-req", "-in", str(pki / "kubelet-client.csr"), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
                 "-set_serial", str(secrets.randbits(62)), "-days", "7", "-out", str(crt))
        return {"client-certificate": str(crt), "client-key": str(key)}, "client-cert"
    if auth in ("auto", "token") and name in cluster.node_tokens:
        return {"token": cluster.node_tokens[name]}, "token"
    why = []
    if auth != "token":
        why.append("the API server trusts no client CA (start it with extra_args=realnode.client_ca_args(workdir))")
    if auth != "cert":
        why.append(f"tokens.csv has no identity for {name!r} (kube.start(node_names=...); "
                   f"it has {sorted(cluster.node_tokens)})")
    raise RealNodeUnavailable(f"no kubelet identity system:node:{name}: " + " and ".join(why))


# -- what the NodeClaim says -----------------------------------------------------------------------------------
def taint_flag(taints) -> str:
    """``--register-with-taints``: key=value:Effect or key:Effect, comma-separated (AL2023's nodeadm form)."""
    out = []
    for t in taints:
        kv = f"{t['key']}={t['value']}" if t.get("value") else t["key"]
        out.append(f"{kv}:{t['effect']}")
    return ",".join(out)


def is_kubelet_label(key: str) -> bool:
    """Whether a v1.20 kubelet may set this label on its own Node (else ``--node-labels`` makes it exit, and
    NodeRestriction would refuse it)."""
    ns = key.split("/", 1)[0] if "/" in key else ""
    restricted = ns in ("kubernetes.io", "k8s.io") or ns.endswith((".kubernetes.io", ".k8s.io"))
    return (not restricted or key in KUBELET_LABELS
            or any(ns == a or ns.endswith("." + a) for a in KUBELET_LABEL_NAMESPACES))


def registration_taints(claim: dict) -> list[dict]:
    """What Karpenter's AL2023 bootstrap passes to ``--register-with-taints``: the NodeClaim's taints, its
    startupTaints and ``karpenter.sh/unregistered:NoExecute``."""
    spec = claim.get("spec") or {}
    return [dict(t) for t in (spec.get("taints") or []) + (spec.get("startupTaints") or [])] + [dict(UNREGISTERED)]


def from_nodeclaim(claim: dict) -> dict:
    """``start`` keyword arguments for the node a launched NodeClaim describes: its providerID, the labels the
    kubelet may set (Karpenter's registration copies the rest onto the Node), the registration taints."""
    labels = {k: v for k, v in (claim["metadata"].get("labels") or {}).items() if is_kubelet_label(k)}
    return {"provider_id": claim["status"]["providerID"], "labels": labels, "taints": registration_taints(claim)}


# -- host state shared by all nodes ----------------------------------------------------------------------------
_lock = threading.RLock()
_flock: list[int] = []           # the fd of STATE_BASE/.lock while this process holds it
_live: set[str] = set()


@contextlib.contextmanager
def _host_lock():
    """This machine's real-node state (STATE_BASE: owners, bridges, saved sysctls), one process and thread at a
    time; re-entrant."""
    with _lock:
        outer = not _flock
        if outer:
            STATE_BASE.mkdir(parents=True, exist_ok=True)
            fd = os.open(STATE_BASE / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            _flock.append(fd)
        try:
            yield
        finally:
            if outer:
                os.close(_flock.pop())


def _owners() -> dict[Path, dict | None]:
    """Each node state folder of this machine and its owner.json (None while unreadable)."""
    out: dict[Path, dict | None] = {}
    for d in STATE_BASE.iterdir() if STATE_BASE.exists() else ():
        if d.is_dir():
            try:
                out[d] = json.loads((d / "owner.json").read_text())
            except (OSError, ValueError):
                out[d] = None
    return out


def _save_sysctls(node_id: str) -> None:
    """Before the first node of this machine starts: the values kubelet v1.20 and the bridge plugin change, kept in
    STATE_BASE/sysctls.json (so a run killed before ``stop`` is restored by the next one's ``reap_stale``)."""
    with _host_lock():
        saved = STATE_BASE / "sysctls.json"
        if not saved.exists():
            values = {s: (Path("/proc/sys") / s).read_text().strip()
                      for s in HOST_SYSCTLS if (Path("/proc/sys") / s).exists()}
            saved.write_text(json.dumps(values))
        _live.add(node_id)


def _restore_sysctls(node_id: str | None) -> None:
    """Once no node of this machine is left (none of any process): put the saved values back."""
    with _host_lock():
        _live.discard(node_id)
        saved = STATE_BASE / "sysctls.json"
        if _live or not saved.exists() or _owners():
            return
        for s, v in json.loads(saved.read_text()).items():
            p = Path("/proc/sys") / s
            with contextlib.suppress(OSError):
                if p.read_text().strip() != v:
                    p.write_text(v)
        saved.unlink()


def _pick_bridge() -> int:
    """A bridge index no node of any process on this machine uses (call under _host_lock)."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    used = {int(m) for m in re.findall(r"\d+: nwrn(\d+)[:@]", links)}
    used |= {int(o["bridge"].removeprefix("nwrn")) for o in _owners().values() if o}
    for n in range(1, 250):
        if n not in used:
            return n
    raise RealNodeUnavailable("no free bridge index (nwrn1..nwrn249 all in use)")


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mnt = line.split()[4].replace("\\040", " ")
        if mnt.startswith(prefix) or mnt == prefix[:-1]:
            out.append(mnt)
    return out


def _cgroup_pids(cgroup: str, sub: str = "") -> set[int]:
    """Every process in a node's cgroup (or its ``sub`` folder) in any v1 hierarchy."""
    pids: set[int] = set()
    for mnt in _cgroup_v1_hierarchies().values():
        for d, _, _ in os.walk(mnt / cgroup.strip("/") / sub):
            try:
                pids.update(int(x) for x in (Path(d) / "cgroup.procs").read_text().split())
            except OSError:
                pass
    return pids


def _kill_cgroup(cgroup: str, sub: str = "", timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while (pids := _cgroup_pids(cgroup, sub)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _remove_host_state(cgroup: str, bridge: str, state_dir: Path | None) -> list[str]:
    """Kill every process left in a node's cgroup, remove its cgroups in every hierarchy and its bridge (and
    ``state_dir``); returns what could not be removed."""
    errors = []
    _kill_cgroup(cgroup)
    for mnt in _cgroup_v1_hierarchies().values():
        top = mnt / cgroup.strip("/")
        if not top.exists():
            continue
        for d in sorted((Path(d) for d, _, _ in os.walk(top)), key=lambda p: len(p.parts), reverse=True):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                errors.append(f"cgroup {d} not removed")
    subprocess.run(["ip", "link", "del", bridge], capture_output=True)
    if state_dir is not None:
        shutil.rmtree(state_dir, ignore_errors=True)
    return errors


def _process_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def reap_stale() -> list[str]:
    """Tear down nodes whose owning process is gone (a test run killed before ``stop``): their containerd, kubelet,
    containers and shims, cgroups, bridge and state folder. ``start`` runs it first. Returns their names."""
    reaped = []
    with _host_lock():
        for d, owner in _owners().items():
            if owner is None:        # start writes owner.json under the lock: a crash in between
                shutil.rmtree(d, ignore_errors=True)
                continue
            if _process_start(owner["pid"]) == owner["start"]:
                continue             # its owner still runs
            _remove_host_state(owner["cgroup"], owner["bridge"], d)
            reaped.append(owner["name"])
        _restore_sysctls(None)
    return reaped


# -- the node --------------------------------------------------------------------------------------------------
@dataclass
class RealNode:
    name: str
    cluster: KubeCluster
    workdir: Path
    node_id: str
    state_dir: Path
    socket: Path
    cgroup: str                          # the kubelet's cgroupRoot, holding all the node's processes
    kubelet_port: int
    healthz_port: int
    bridge: str
    subnet: str
    auth: str = ""                       # "client-cert" or "token"
    timings: dict[str, float] = field(default_factory=dict)
    _containerd: subprocess.Popen | None = field(default=None, repr=False)
    _kubelet: subprocess.Popen | None = field(default=None, repr=False)
    _relays: list = field(default_factory=list, repr=False)
    _stopped: bool = field(default=False, repr=False)
    _t0: float = field(default=0.0, repr=False)

    @property
    def containerd_log(self) -> Path:
        return self.workdir / "containerd.log"

    @property
    def kubelet_log(self) -> Path:
        return self.workdir / "kubelet.log"

    @property
    def root_dir(self) -> Path:
        return self.workdir / "kubelet"

    @property
    def log_dir(self) -> Path:
        """This node's /var/log/pods (container logs: NAMESPACE_POD_UID/CONTAINER/N.log)."""
        return self.workdir / "log-pods"

    def logs(self, chars: int = 4000) -> str:
        """The tails of the containerd and kubelet logs, for a failing test to print."""
        out = []
        for p in (self.containerd_log, self.kubelet_log):
            text = p.read_text(errors="replace") if p.exists() else "(none)"
            out.append(f"--- {p} (last {chars} chars) ---\n{text[-chars:]}")
        return "\n".join(out)

    def ctr(self, *args: str, check: bool = True) -> str:
        """``ctr --address SOCKET -n k8s.io ARGS``: this node's containerd, the CRI namespace."""
        r = subprocess.run(["ctr", "--address", str(self.socket), "-n", "k8s.io", *args],
                           capture_output=True, text=True, timeout=60)
        if check and r.returncode:
            raise RuntimeError(f"ctr {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def in_mount_namespace(self, *args: str) -> list[str]:
        """``args`` as a command run in this node's mount namespace, where containerd mounts containers' root
        filesystems (what a node's root component sees)."""
        return ["nsenter", "--target", str(self._containerd.pid), "--mount", "--", *args]

    def container_ids(self) -> list[str]:
        return self.ctr("containers", "ls", "-q").split()

    def running_tasks(self) -> dict[str, str]:
        """Container ID -> task status (RUNNING, STOPPED...) from this node's containerd."""
        out = {}
        for line in self.ctr("tasks", "ls").splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 3:
                out[parts[0]] = parts[2]
        return out

    def node(self) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        from nodewarm.controller.kube import NODES, Kube

        try:
            return Kube(self.cluster.api_client()).get(NODES, self.name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def ready(self) -> bool:
        n = self.node()
        conds = ((n or {}).get("status") or {}).get("conditions") or ()
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    def wait_ready(self, timeout_s: float = 120, lift_not_ready: bool = True) -> dict:
        """Until the Node is Ready (its containerd or kubelet exiting fails at once, with the logs); then, with
        ``lift_not_ready``, remove the not-ready taint as the node lifecycle controller would. Returns the Node."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for what, p in (("containerd", self._containerd), ("kubelet", self._kubelet)):
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"{what} of node {self.name} exited with {p.returncode}\n{self.logs()}")
            if self.ready():
                self.timings["ready_s"] = time.monotonic() - self._t0
                if lift_not_ready:
                    self.lift_not_ready_taint()
                return self.node()
            time.sleep(0.2)
        raise TimeoutError(f"node {self.name} not Ready after {timeout_s:.0f}s\n{self.logs()}")

    def advertise(self, resources: dict[str, str], timeout_s: float = 40) -> dict:
        """Extended resources on the Node's capacity (e.g. ``{"nvidia.com/gpu": "8"}``), PATCHed on its status as
        Kubernetes documents for advertising them; the kubelet keeps them and copies them to allocatable on its next
        status update (waited for), so the scheduler can place pods that request them. Nothing backs them: the
        containers get no device. Returns the Node."""
        from nodewarm.controller.kube import NODES, Kube

        k = Kube(self.cluster.api_client())
        esc = {k2: k2.replace("~", "~0").replace("/", "~1") for k2 in resources}
        k.json_patch(NODES, self.name, [{"op": "add", "path": f"/status/capacity/{esc[r]}", "value": v}
                                        for r, v in resources.items()], sub="status")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            node = k.get(NODES, self.name)
            if all(node["status"].get("allocatable", {}).get(r) == v for r, v in resources.items()):
                return node
            time.sleep(0.2)
        raise TimeoutError(f"the kubelet of {self.name} did not make {resources} allocatable in {timeout_s:.0f}s")

    def mounts(self) -> list[str]:
        """The mount points in the node's own mount namespace (its containerd's), where every mount it makes is."""
        pid = self._containerd.pid if self._containerd else None
        if pid is None:
            return []
        return [line.split()[4] for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()]

    def lift_not_ready_taint(self) -> None:
        """The node lifecycle controller's part (not run here): drop node.kubernetes.io/not-ready once Ready."""
        from kubernetes.client.exceptions import ApiException

        from nodewarm.controller.kube import NODES, Kube

        k = Kube(self.cluster.api_client())
        for _ in range(5):
            taints = k.get(NODES, self.name)["spec"].get("taints") or []
            idx = [i for i, t in enumerate(taints) if t["key"] == NOT_READY_TAINT]
            if not idx:
                return
            ops = []
            for i in reversed(idx):
                ops += [{"op": "test", "path": f"/spec/taints/{i}", "value": taints[i]},
                        {"op": "remove", "path": f"/spec/taints/{i}"}]
            try:
                k.json_patch(NODES, self.name, ops)
                return
            except ApiException as e:
                if e.status not in (409, 422):
                    raise

    # -- teardown ----------------------------------------------------------------------------------------------
    def stop(self, remove_data: bool = True) -> None:
        """Stop the kubelet, kill the pods' containers and the shims, stop containerd, remove the node's cgroups,
        bridge and (``remove_data``) its containerd and kubelet data; the logs stay in ``workdir``. The Node object
        stays in the API (delete it, or let Karpenter's stand-in terminate it). Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        errors = []
        if self._kubelet is not None and self._kubelet.poll() is None:
            self._kubelet.terminate()
            try:
                self._kubelet.wait(10)
            except subprocess.TimeoutExpired:
                self._kubelet.kill()
                self._kubelet.wait()
        _kill_cgroup(self.cgroup, "kubepods")             # the pods' containers
        if self._containerd is not None and self._containerd.poll() is None:
            self._containerd.terminate()
            try:
                self._containerd.wait(10)
            except subprocess.TimeoutExpired:
                self._containerd.kill()
                self._containerd.wait()
        for relay in self._relays:
            relay.close()
        errors += _remove_host_state(self.cgroup, self.bridge, None)   # shims and anything left, cgroups, bridge
        # The node's mounts lived in its own mount namespace, gone with its last process; a mount still visible
        # here under its folders would be a bug: unmount it rather than delete through it.
        for d in (self.workdir, self.state_dir):
            for m in sorted(_mounts_under(d), key=len, reverse=True):
                subprocess.run(["umount", "-l", m], capture_output=True)
                errors.append(f"mount {m} was left on the host (unmounted)")
        shutil.rmtree(self.state_dir, ignore_errors=True)
        _restore_sysctls(self.node_id)
        if remove_data:
            for d in ("containerd", "kubelet"):
                if not _mounts_under(self.workdir / d):
                    shutil.rmtree(self.workdir / d, ignore_errors=True)
        if errors:
            raise RuntimeError(f"node {self.name} stopped with leftovers: {errors}")

    def __enter__(self) -> "RealNode":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _can_lower_oom_score() -> bool:
    """CAP_SYS_RESOURCE (bit 24) in this process's effective set: without it (the project's VM) nothing may lower an
    oom_score_adj, and runc's init would die on a sandbox's -998 ("failed to update /proc/self/oom_score_adj:
    Permission denied", seen by the kubelet as "can't get final child's PID from pipe: EOF"), so containerd is told
    to restrict every container's oom_score_adj to no lower than its own."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> 24 & 1)
    return False


def _containerd_config(node: RealNode, root: Path, certs_d: Path, cni_conf: Path, cni_bin: Path,
                       runtime_handlers: dict[str, Path]) -> str:
    q = json.dumps     # TOML basic strings are JSON strings
    # A handler is the same runc shim with another runc binary, under the same runc root (as a node's drop-in adds
    # one): containerd calls the binary exactly as it calls runc.
    handlers = "".join(f"""      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{name}]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{name}.options]
          SystemdCgroup = false
          BinaryName = {q(str(binary))}
          Root = {q(str(node.state_dir / "runc"))}
""" for name, binary in sorted(runtime_handlers.items()))
    return f"""version = 2
root = {q(str(root))}
state = {q(str(node.state_dir / "containerd"))}
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = {q(str(node.socket))}

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = {q(str(root / "opt"))}
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = {q(PAUSE_IMAGE)}
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = {"false" if _can_lower_oom_score() else "true"}
    disable_apparmor = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = {q(str(node.state_dir / "runc"))}
{handlers}    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = {q(str(cni_bin))}
      conf_dir = {q(str(cni_conf))}
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = {q(str(certs_d))}
"""


def _write_registries(certs_d: Path, registries: dict[str, str]) -> None:
    """containerd hosts.toml: pulls of ``host`` (e.g. docker.io) go to ``mirror`` (e.g. http://127.0.0.1:5000)."""
    for host, mirror in registries.items():
        d = certs_d / host
        d.mkdir(parents=True, exist_ok=True)
        upstream = "https://registry-1.docker.io" if host == "docker.io" else f"https://{host}"
        (d / "hosts.toml").write_text(
            f'server = "{upstream}"\n\n[host."{mirror}"]\n  capabilities = ["pull", "resolve"]\n'
            + ("  skip_verify = true\n" if mirror.startswith("https://127.") else ""))


def _make_cgroup(name: str) -> None:
    for ctl, mnt in _cgroup_v1_hierarchies().items():
        d = mnt / name
        d.mkdir(exist_ok=True)
        if ctl == "cpuset":   # a v1 cpuset cgroup starts empty; copy the parent's
            for f in ("cpuset.cpus", "cpuset.mems"):
                (d / f).write_text((mnt / f).read_text())
    (_cgroup_v1_hierarchies()["name=systemd"] / name / "runtime").mkdir(exist_ok=True)


def _script(path: Path, lines: list[str]) -> Path:
    path.write_text("#!/bin/sh\nset -e\n" + "\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def _q(s) -> str:
    import shlex

    return shlex.quote(str(s))


def start(cluster: KubeCluster, name: str, workdir: Path, taints=(), labels: dict[str, str] | None = None,
          provider_id: str = "", auth: str = "auto", registries: dict[str, str] | None = None,
          node_ip: str | None = None, max_pods: int = 110, status_update_s: int = 10, wait: bool = True,
          lift_not_ready: bool = True, timeout_s: float = 120, extra_kubelet_args: tuple[str, ...] = (),
          host_dirs: dict[str, Path] | None = None, services: dict[str, str] | None = None,
          runtime_handlers: dict[str, Path] | None = None) -> RealNode:
    """Start containerd and a kubelet registering Node ``name`` with ``cluster``; return once the Node is Ready
    (and, with ``lift_not_ready``, the admission-added not-ready taint is gone). ``taints`` are passed as
    ``--register-with-taints`` exactly (use ``registration_taints``/``from_nodeclaim`` for Karpenter's set),
    ``labels`` as ``--node-labels`` (each must pass ``is_kubelet_label``). ``auth``: "auto" (client certificate when
    the API server trusts ``client_ca_args``' CA, else the tokens.csv token), "cert" or "token". On any failure
    everything started is stopped and the error carries both logs.

    ``status_update_s``: the kubelet's nodeStatusUpdateFrequency (its default and EKS's, 10 s: the Node turns
    Ready about one period after it registers). ``wait=False`` returns once the kubelet is started: start several
    nodes, then ``wait_ready()`` each (then stopping them on a failure is the caller's).

    ``host_dirs``: {path on the node: folder of the caller's}, bind-mounted in the node's mount namespace, so a pod's
    hostPath of that path is that folder (the NVMe RAID mount, ``/mnt/.ephemeral`` or ``/mnt/k8s-disks/0``, of
    this node alone). The path is made on the host as an empty mount point, as SHARED_HOST_DIRS' are.

    ``services``: {"VIP:PORT": "HOST:PORT"} the node's pod-network pods reach as a cluster's pods reach ClusterIPs
    (``kube.KUBERNETES_SERVICE`` to the API server, an S3 server's address): podservices says how.

    ``runtime_handlers``: {handler name: binary} more containerd runtime handlers, each the runc shim with that
    binary in runc's place (a RuntimeClass names one), as nodewarm's snapshot handler is installed on a node."""
    preflight()
    labels = dict(labels or {})
    bad = sorted(k for k in labels if not is_kubelet_label(k))
    if bad:
        raise ValueError(f"kubelet v1.20 refuses to set {bad} on its own Node (NodeRestriction): leave them to "
                         "Karpenter's registration (from_nodeclaim drops them)")
    workdir = Path(workdir).absolute()
    if len(str(workdir / "kubelet" / "pod-resources" / "kubelet.sock")) > 107:
        raise ValueError(f"workdir {workdir} is too long: the kubelet's unix sockets under it would pass 107 bytes")
    workdir.mkdir(parents=True, exist_ok=True)
    node_id = f"{re.sub(r'[^a-z0-9]', '', name.lower())[:12]}-{secrets.token_hex(3)}"
    with _host_lock():
        reap_stale()
        n = _pick_bridge()
        node = RealNode(name=name, cluster=cluster, workdir=workdir, node_id=node_id, state_dir=STATE_BASE / node_id,
                        socket=STATE_BASE / node_id / "containerd.sock", cgroup=f"/nodewarm-rn-{node_id}",
                        kubelet_port=free_port(), healthz_port=free_port(), bridge=f"nwrn{n}",
                        subnet=f"10.250.{n}.0/24")
        node.state_dir.mkdir()
        (node.state_dir / "owner.json").write_text(json.dumps({
            "pid": os.getpid(), "start": _process_start(os.getpid()), "name": name, "cgroup": node.cgroup,
            "bridge": node.bridge}))
    try:
        _start(node, taints, labels, provider_id, auth, registries or {}, node_ip, max_pods, status_update_s,
               extra_kubelet_args, host_dirs or {}, services or {}, runtime_handlers or {})
        if wait:
            node.wait_ready(timeout_s, lift_not_ready)
    except BaseException as e:
        logs = node.logs()
        try:
            node.stop(remove_data=False)
        except Exception as leftovers:
            logs += f"\n(and stopping it: {leftovers})"
        if isinstance(e, (RealNodeUnavailable, ValueError)) or not isinstance(e, Exception):
            raise
        raise RuntimeError(f"node {name} did not start: {e}\n{logs if '--- ' not in str(e) else ''}") from e
    return node


def _start(node: RealNode, taints, labels, provider_id, auth, registries, node_ip, max_pods, status_update_s,
           extra_kubelet_args, host_dirs, services, runtime_handlers) -> None:
    t0 = time.monotonic()
    w = node.workdir
    root, pki, certs_d, cni_conf, cni_bin = w / "containerd", w / "pki", w / "certs.d", w / "cni", w / "cni-bin"
    for d in (root, pki, certs_d, cni_conf, cni_bin, node.root_dir, *(w / k for k in SHARED_HOST_DIRS)):
        d.mkdir(parents=True, exist_ok=True)
    for target in (*SHARED_HOST_DIRS.values(), *host_dirs):
        Path(target).mkdir(parents=True, exist_ok=True)     # mount points on the host; left empty
    _write_registries(certs_d, registries)
    # The node's own CNI bin folder: Debian's plugins, and podservices' when the node carries services.
    for plugin in ("bridge", "host-local", "loopback"):
        link = cni_bin / plugin
        if not link.is_symlink():
            link.symlink_to(CNI_BIN_DIR / plugin)
    plugins = [{"type": "bridge", "bridge": node.bridge, "isGateway": True, "ipMasq": False,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": node.subnet}]],
                         "dataDir": str(w / "cni-ipam"), "routes": [{"dst": "0.0.0.0/0"}]}}]
    if services:
        # The gateway's address must exist before a relay can listen on it: make the bridge now (the bridge
        # plugin takes an existing bridge with its gateway address as it is).
        gateway = node.subnet.rsplit(".", 1)[0] + ".1"
        for cmd in (["ip", "link", "add", "name", node.bridge, "type", "bridge"],
                    ["ip", "addr", "add", f"{gateway}/24", "dev", node.bridge],
                    ["ip", "link", "set", node.bridge, "up"]):
            subprocess.run(cmd, check=True, capture_output=True)
        node._relays, rules = podservices.start_relays(gateway, services)
        podservices.write_plugin(cni_bin)
        plugins.append(podservices.plugin_conf(rules))
    (cni_conf / "10-nodewarm.conflist").write_text(json.dumps({
        "cniVersion": "0.4.0", "name": f"nodewarm-{node.node_id}", "plugins": plugins}, indent=1))
    (w / "containerd.toml").write_text(_containerd_config(node, root, certs_d, cni_conf, cni_bin, runtime_handlers))

    user, node.auth = _node_credentials(node.cluster, node.name, pki, auth)
    kubeconfig = w / "kubelet.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": node.cluster.server,
                                                   "certificate-authority": node.cluster.ca_file}}],
        "users": [{"name": f"system:node:{node.name}", "user": user}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": f"system:node:{node.name}"}}],
        "current-context": "local"}))
    kubeconfig.chmod(0o600)
    thresholds = {s: "0%" for s in ("memory.available", "nodefs.available", "nodefs.inodesFree",
                                    "imagefs.available", "imagefs.inodesFree")}
    (w / "kubelet-config.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": "127.0.0.1", "port": node.kubelet_port, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": node.healthz_port,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True}},
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs", "cgroupRoot": node.cgroup, "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "failSwapOn": False, "evictionHard": thresholds,
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "makeIPTablesUtilChains": False, "protectKernelDefaults": False,
        "resolvConf": "/etc/resolv.conf", "clusterDomain": "cluster.local",
        "serializeImagePulls": False, "maxPods": max_pods, "rotateCertificates": False,
        "nodeStatusUpdateFrequency": f"{status_update_s}s", "volumePluginDir": str(w / "volume-plugins"),
    }))

    _make_cgroup(node.cgroup.strip("/"))
    procs_file = _cgroup_v1_hierarchies()["name=systemd"] / node.cgroup.strip("/") / "runtime" / "cgroup.procs"
    binds = [f"mount --bind {_q(w / k)} {_q(v)}" for k, v in SHARED_HOST_DIRS.items()]
    # Shared, as a mount on a systemd host is: the agent's pod mounts it with HostToContainer propagation, which
    # containerd refuses on a private mount.
    binds += [f"mount --bind {_q(Path(src).absolute())} {_q(target)} && mount --make-shared {_q(target)}"
              for target, src in host_dirs.items()]
    inner = _script(w / "containerd-ns.sh", [*binds, f"exec containerd --config {_q(w / 'containerd.toml')}"])
    outer = _script(w / "run-containerd.sh", [f"echo $$ > {_q(procs_file)}",
                                              f"exec unshare --mount --propagation slave /bin/sh {_q(inner)}"])
    _save_sysctls(node.node_id)
    with open(node.containerd_log, "wb") as log:
        node._containerd = subprocess.Popen([str(outer)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while not node.socket.exists() or subprocess.run(
            ["ctr", "--address", str(node.socket), "version"], capture_output=True).returncode:
        if node._containerd.poll() is not None:
            raise RuntimeError(f"containerd of node {node.name} exited with {node._containerd.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"containerd of node {node.name} not answering on {node.socket} after 30s")
        time.sleep(0.1)
    node.timings["containerd_s"] = time.monotonic() - t0
    node.ctr("images", "import", str(pause_image_archive()))
    node.timings["image_s"] = time.monotonic() - t0

    kubelet = kube_bin_dir() / "kubelet"
    args = [str(kubelet), "--config", str(w / "kubelet-config.yaml"), "--kubeconfig", str(kubeconfig),
            "--root-dir", str(node.root_dir), "--cert-dir", str(pki), "--hostname-override", node.name,
            "--container-runtime=remote", f"--container-runtime-endpoint=unix://{node.socket}",
            f"--containerd={node.socket}",          # cAdvisor's containerd (stats), else /run/containerd's
            "--v=2"]
    if taints:
        args.append(f"--register-with-taints={taint_flag(taints)}")
    if labels:
        args.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    if provider_id:
        args.append(f"--provider-id={provider_id}")
    if node_ip:
        args.append(f"--node-ip={node_ip}")
    args += list(extra_kubelet_args)
    run = _script(w / "run-kubelet.sh", [
        f"echo $$ > {_q(procs_file)}",
        f"exec nsenter --target {node._containerd.pid} --mount -- " + " ".join(_q(a) for a in args)])
    with open(node.kubelet_log, "wb") as log:
        node._kubelet = subprocess.Popen([str(run)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    node.timings["kubelet_started_s"] = time.monotonic() - t0
    node._t0 = t0
