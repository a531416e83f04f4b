"""The demo, step by step. Every part is the real one; only the machines are simulated:

* each node's "NVMe" is a directory of its own (so the bootstrap runs with --allow-non-nvme, and the
  timeline says so), on tmpfs when /dev/shm has room: this machine's disk writes ~100 MB/s, a GPU node's
  NVMe RAID0 several GB/s, and the agent fsyncs every file before it is trusted (the baseline pods'
  downloads go to the same kind of storage); its kubelet and Karpenter are played by testenv.karpenter,
  as Karpenter's docs describe;
* the vLLM Deployment is the rendered one with the container swapped for a pause image (nothing runs
  pods here: there are no kubelets), so the real kube-scheduler decides where replicas are bound;
* "serving starts" is a fresh CPU process doing the first torch.compile call of a small model against
  the node's restored Inductor cache (the hit/miss proof), the same way vLLM's first call would.

The no-warm baseline is measured in the same run, through the same kube-scheduler: as many nodes of a
second NodePool without the startup taint, registered the same way, with a replica each of a Deployment
pending for them as the vLLM one was; its time from registration to the first compiled call is the
scheduler's wait for those pods, plus streaming the weights from S3 in the pod (boto3 `download_file`
defaults, all pods at once), plus a cold compile.
"""

from __future__ import annotations

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
from nodewarm.kubeapply import apply
from nodewarm.nodeclasses import prepull, vllm
from nodewarm.nodeclasses.podlayout import cache_dirs, model_path
from nodewarm.nodeclasses.render import render
from nodewarm.sizing import GB

from . import live, seed, servers, timeline
from .timeline import NodeTimeline

log = logs.get("demo")

MODEL_BUCKET, CACHE_BUCKET, PROFILE_NAME = "models", "compile-cache", "demo-llm"
BASELINE_POOL = "demo-baseline"
NAMESPACE = "demo"
PAUSE_IMAGE = "registry.k8s.io/pause:3.9"
LOG_FILE = "demo-log.jsonl"
BOOTSTRAP_TIMEOUT_S = 900


@dataclass(frozen=True)
class DemoOptions:
    nodes: int = 3
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


def seed_model(work: Path, model_mb: int, s3_engine: str) -> list[Path]:
    return seed.write_model(seed_root(work, s3_engine) / MODEL_BUCKET / PROFILE_NAME, model_mb)


def model_listed(srv: servers.Servers, files: list[Path]) -> float:
    """Wait until the server lists every seeded file; the model's size in GB, as S3 lists it."""
    client = srv.s3.client()
    listing: list[dict] = []

    def listed() -> bool:
        listing[:] = client.list_objects_v2(Bucket=MODEL_BUCKET, Prefix=f"{PROFILE_NAME}/").get("Contents", [])
        return len(listing) == len(files)

    from nodewarm.testenv.ports import wait_until

    wait_until(listed, 30, "seeded model listed by the S3 server")
    total = sum(o["Size"] for o in listing)
    log.info("demo.model.seeded", files=len(files), bytes=total)
    return total / GB


def compile_probe(cache_dir: Path, env: dict | None = None) -> dict:
    """One 'first request' in a fresh process: the first torch.compile call against ``cache_dir``."""
    proc = subprocess.run([sys.executable, "-m", "nodewarm.testenv.compile_probe", "--cache-dir", str(cache_dir)],
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


def demo_profile(size_gb: float, verify_key: str, nodes: int) -> profile.WarmProfile:
    doc = {
        "apiVersion": "nodewarm.io/v1alpha1", "kind": "WarmProfile", "metadata": {"name": PROFILE_NAME},
        "spec": {
            "model": {"uri": f"s3://{MODEL_BUCKET}/{PROFILE_NAME}/", "sizeGB": round(size_gb, 3)},
            "serving": {"image": "vllm/vllm-openai:v0.21.0", "tensorParallelSize": 1, "replicas": nodes,
                        "namespace": NAMESPACE},
            "nodes": {"mode": "karpenter", "nodePool": "demo-gpu", "nodeClass": "demo-gpu",
                      "instanceTypes": ["g6e.xlarge"], "role": "KarpenterNodeRole-demo", "region": "us-east-1",
                      "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
                      "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}]},
            "compileCache": {"uri": f"s3://{CACHE_BUCKET}/{PROFILE_NAME}/", "verifyKey": verify_key},
            "readiness": {"deadline": "10m", "onDeadline": "keep"},
            # Rendered into the EC2NodeClass userData but never executed here (no EC2 instance boots).
            "bootstrap": {"artifactUri": f"s3://{CACHE_BUCKET}/nodewarm/not-built-in-demo.tar.gz",
                          "artifactSha256": "0" * 64},
        },
    }
    p = profile.from_dict(doc)
    from nodewarm import instancetypes

    profile.check(p, instancetypes.lookup(list(p.nodes.instance_types)))
    return p


def stand_in_deployment(p: profile.WarmProfile) -> dict:
    """The rendered vLLM Deployment with a pause container (same tolerations, hostPaths, nodeSelector,
    GPU requests), one replica per node so each node's gating is visible."""
    d = vllm.deployment(p)
    pod = d["spec"]["template"]["spec"]
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


def baseline_objects(p: profile.WarmProfile, nodepool: dict) -> list[dict]:
    """The no-warm world beside nodewarm's: the same NodePool and vLLM stand-in without nodewarm (no startup
    taint, no generation selector, nothing a WarmProfile names)."""
    import copy

    pool = copy.deepcopy(nodepool)
    pool["metadata"] = {"name": BASELINE_POOL}
    pool["spec"]["template"]["metadata"] = {}
    pool["spec"]["template"]["spec"].pop("startupTaints", None)
    d = stand_in_deployment(p)
    labels = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": BASELINE_POOL}
    d["metadata"] = {"name": BASELINE_POOL, "namespace": d["metadata"]["namespace"], "labels": labels}
    d["spec"]["selector"] = {"matchLabels": labels}
    pod = d["spec"]["template"]
    pod["metadata"] = {"labels": labels}
    pod["spec"]["nodeSelector"] = {"karpenter.sh/nodepool": BASELINE_POOL}
    pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "labelSelector"] = {"matchLabels": labels}
    return [pool, d]


def baseline_scheduling_s(admin, sim, p: profile.WarmProfile, nodepool: dict, nodes: int, timeout_s: float) -> float:
    """Registration to pod bound without nodewarm, mean over ``nodes``: the Deployment waits pending (the
    scheduler has tried it, as it tried the vLLM pods before the scale-up), then the nodes are launched
    and registered exactly as nodewarm's were and the real kube-scheduler binds."""
    from kubernetes import client

    core = client.CoreV1Api(admin)
    apply(admin, baseline_objects(p, nodepool))
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
    for i in range(nodes):
        c = sim.create_nodeclaim(BASELINE_POOL)["metadata"]["name"]
        sim.launch(c)
        claims.append((c, f"{BASELINE_POOL}-node-{i}"))
    for c, n in claims:
        registered[n] = register(sim, c, n)
    bound: dict[str, float] = {}
    while time.time() < end and len(bound) < nodes:
        for x in pods():
            if x.spec.node_name in registered and x.spec.node_name not in bound:
                bound[x.spec.node_name] = time.time()
        for c, _ in claims:
            sim.sync_initialized(c)
        time.sleep(0.05)
    if len(bound) < nodes:
        raise RuntimeError(f"the scheduler bound {len(bound)}/{nodes} baseline pods within {timeout_s:.0f}s")
    return sum(bound[n] - registered[n] for n in bound) / nodes


class Watcher:
    """Records, with wall-clock precision, when each node loses the startup taint and when pods are bound."""

    def __init__(self, api_client, taint_key: str, timelines: dict[str, NodeTimeline]):
        self.api, self.taint_key, self.timelines = api_client, taint_key, timelines
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
            if "registered" in tl.times and self.taint_key not in keys:
                tl.mark("taint_lifted", time.time())

        self._loop(client.CoreV1Api(self.api).list_node, handle)

    def _pods(self) -> None:
        from kubernetes import client

        def handle(pod) -> None:
            node = pod.spec.node_name
            if node and pod.metadata.name not in self.bound:
                self.bound[pod.metadata.name] = node
                if node in self.timelines:
                    self.timelines[node].mark("pod_bound", time.time())

        self._loop(client.CoreV1Api(self.api).list_namespaced_pod, handle, namespace=NAMESPACE)


def bootstrap_node(srv: servers.Servers, p: profile.WarmProfile, node: str, mount: Path,
                   view: live.LiveView | None = None, log_line: Callable[[str], None] | None = None) -> dict:
    """The real `nodewarm bootstrap run` as a process, with this node's own kubelet identity. Its JSON log lines
    (stderr) feed the live view and go where the demo's own logs go, tagged with the node."""
    kcfg = srv.kube.write_kubeconfig(srv.workdir / f"kubeconfig-{node}", srv.kube.node_token(node), f"system:node:{node}")
    # The agent reads model, serving and compile-cache settings from the WarmProfile object, as on a real
    # node; --once because the demo waits for each node's result.
    argv = [sys.executable, "-m", "nodewarm.cli", "bootstrap", "run", "--profile", p.name, "--mount", str(mount),
            "--node-name", node, "--kubeconfig", str(kcfg), "--allow-non-nvme", "--once", "--json",
            "--state-dir", str(mount / "state")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **srv.s3.env()})
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


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


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


# -- the whole run --------------------------------------------------------------------------------------
def execute(opts: DemoOptions, out: TextIO) -> DemoResult:
    """Start the servers, run the scale-up, stop everything (also on Ctrl-C / SIGTERM).

    ``out`` gets what a person reads: step messages and, while the nodes warm, a live table (redrawn in place
    on a terminal, plain lines otherwise). The JSON logs (the demo's, the controller's, each node agent's) go
    to ``opts.log_path``, named first, or to stderr with ``opts.log_json``."""
    names = tuple(f"demo-node-{i}" for i in range(opts.nodes))
    work = Path(opts.workdir or tempfile.mkdtemp(prefix="nodewarm-demo-"))
    # With the JSON logs on stderr (the same terminal, most likely), a table redrawn in place would be torn apart.
    view = live.LiveView(out, {n: NodeTimeline(n) for n in names}, tty=False if opts.log_json else None)
    if not opts.log_json:
        view.say(f"JSON logs (the demo's, the controller's, each node agent's): {opts.log_path}")
    saved = dict(os.environ)
    import shutil

    storage = node_storage(work, 2 * len(names) * opts.model_mb * 1024 * 1024)
    try:
        with logs.to_file(None if opts.log_json else opts.log_path) as log_line:
            files = seed_model(work, opts.model_mb, opts.s3_engine)
            with servers.running(work, names, scheduler_max_backoff_s=opts.scheduler_max_backoff_s,
                                 s3_engine=opts.s3_engine) as srv:
                # This process plays "node A" (the publisher) and the baseline pods: the nodes' AWS environment.
                os.environ.update(srv.s3.env())
                try:
                    return _run(srv, opts, names, work, storage, files, view, log_line)
                finally:
                    view.close()
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


def _run(srv: servers.Servers, opts: DemoOptions, names: tuple[str, ...], work: Path, storage: Path,
         files: list[Path], view: live.LiveView, log_line: Callable[[str], None]) -> DemoResult:
    from kubernetes import client

    from nodewarm.bootstrap.compilecache import cachekey
    from nodewarm.controller.controller import Controller, ControllerOptions
    from nodewarm.testenv.karpenter import KarpenterSim

    say = view.say
    admin = srv.kube.api_client()
    say(f"1. servers up: kube-apiserver {srv.kube.server}, S3 {srv.s3.endpoint}"
        + (f", kube-scheduler (podMaxBackoffSeconds {opts.scheduler_max_backoff_s}, for both worlds)" if srv.scheduler
           else " (no kube-scheduler built: pods are not bound)"))
    srv.s3.create_bucket(CACHE_BUCKET)
    if opts.s3_engine != "rclone":
        srv.s3.upload_tree(seed_root(work, opts.s3_engine), MODEL_BUCKET)
    size_gb = model_listed(srv, files)
    spec = cachekey.ServingSpec(model=model_path(PROFILE_NAME), tp=1, image="vllm/vllm-openai:v0.21.0",
                                engine={"dtype": "auto"})
    verify_key, cold = seed_compile_cache(srv, work, spec)
    say(f"2. S3 seeded: {size_gb:.2f} GB model (safetensors) and a signed compile-cache bundle from a real "
        f"CPU torch.compile (cold first call {cold['first_call_s']:.1f}s)")

    p = demo_profile(size_gb, verify_key, opts.nodes)
    from nodewarm import instancetypes

    rendered = render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
    # The Deployment is applied as its stand-in later; the local v1.20 API server serves no policy/v1 (1.21+).
    docs = [d for d in rendered if d["kind"] not in ("Deployment", "PodDisruptionBudget")]
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": NAMESPACE}})
    for a in apply(admin, docs):
        say(f"   applied {a.kind}/{a.name}: {a.action}")
    say("3. WarmProfile, EC2NodeClass (RAID0 + bootstrap user data), NodePool (startup taint) applied")

    stop = threading.Event()
    ctl = Controller(admin, ControllerOptions(metrics_port=0, health_port=0, bind_address="127.0.0.1", workers=4))
    ctl_thread = threading.Thread(target=ctl.run_until, args=(stop,), daemon=True)
    ctl_thread.start()

    timelines = view.timelines
    watcher = Watcher(admin, p.readiness.taint_key, timelines)
    watcher.start()
    apply(admin, [stand_in_deployment(p)])
    say(f"4. controller running; vLLM stand-in Deployment ({opts.nodes} replicas) applied: pending, no node yet")

    sim = KarpenterSim(admin, default_instance_type="g6e.xlarge")
    mounts = {n: storage / n / "nvme" for n in names}
    claims = {}
    for n in names:
        c = sim.create_nodeclaim(p.nodes.node_pool)
        claims[n] = c["metadata"]["name"]
        sim.launch(claims[n])
        timelines[n].mark("launched", time.time())
    for n in names:
        timelines[n].mark("registered", register(sim, claims[n], n))
        mounts[n].mkdir(parents=True, exist_ok=True)
        # No container runtime here: the serving image's pre-pull pod is "pulled" at once by the stand-in
        # kubelet; on a real node that pull overlaps the weights and the compile-cache restore.
        sim.run_daemonset_pod(n, p.bootstrap.namespace, prepull.daemonset_name(p.name))
    say(f"5. scale-up of {opts.nodes}: NodeClaims launched, Nodes registered with {p.readiness.taint_key}:NoSchedule;"
        f" bootstrap running on each node (its NVMe: {'tmpfs' if str(storage).startswith('/dev/shm') else 'a disk folder'})")
    say("   per node, live (time: seconds since the node registered):")
    view.start()

    reports: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        futures = {n: pool.submit(bootstrap_node, srv, p, n, mounts[n], view, log_line) for n in names}
        for n, f in futures.items():
            reports[n] = f.result()
            tl, r = timelines[n], reports[n]["timeline"]
            for phase in ("weights_started", "first_byte", "weights_done", "compile_cache_started",
                          "compile_cache_restored", "image_prepull_started", "image_prepull_done", "warm_reported"):
                if phase in r:
                    tl.mark(phase, _epoch(r[phase]))
            w = reports[n]["weights"]
            tl.facts.update(bytes=w["bytes"], downloaded_bytes=w["downloaded_bytes"],
                            throughput_mb_s=w["throughput_mb_s"], instance_store=w["storage"].get("instance_store"),
                            compile_cache=(reports[n]["compileCache"] or {}).get("status"))

    deadline = time.time() + opts.bind_timeout_s
    while time.time() < deadline and not all("pod_bound" in t.times for t in timelines.values()):
        for n in names:
            sim.sync_initialized(claims[n])
        time.sleep(0.2)
    lifted = sum("taint_lifted" in t.times for t in timelines.values())
    bound = sum("pod_bound" in t.times for t in timelines.values())
    say(f"6. controller lifted the taint on {lifted}/{len(names)} nodes; scheduler bound {bound}/{len(names)} replicas")

    # Serving starts: the first compiled call on each node, against the cache the bootstrap restored.
    warm_calls = {}
    for n in names:
        d = cache_dirs(mounts[n] / "compile-cache")      # where the bootstrap restored, as the pod sees it
        probe = compile_probe(Path(d["inductor"]), {"TMPDIR": str(d["tmp"])})
        hit = probe["counters"].get("inductor.fxgraph_cache_hit", 0) > 0
        timelines[n].facts.update(first_call_s=probe["first_call_s"], compile_cache_hit=hit)
        warm_calls[n] = probe["first_call_s"]
        if "pod_bound" in timelines[n].times:
            # The pod's first compiled call, had it started the moment it was bound (measured just now).
            timelines[n].mark("serving", timelines[n].times["pod_bound"] + probe["first_call_s"])
        view.served(n, probe["first_call_s"], hit)
    view.close()
    say("7. first compiled call on each node done" + (": measuring the no-warm baseline (its nodes, the scheduler, "
                                                     "S3 pulls in the pods, a cold compile)" if opts.baseline else ""))

    base = None
    if opts.baseline:
        nodepool = next(d for d in rendered if d["kind"] == "NodePool")
        sched_s = baseline_scheduling_s(admin, sim, p, nodepool, len(names), opts.bind_timeout_s)
        pull_s = baseline_pull_s(srv, storage, len(names))
        mean_reg_to_serve = sum(
            (t.times.get("pod_bound", t.times["registered"]) - t.times["registered"]) + warm_calls[t.node]
            for t in timelines.values()) / len(timelines)
        base = {"pods": len(names), "scheduler_wait_s": round(sched_s, 3), "pull_from_s3_s": round(pull_s, 3),
                "cold_compile_first_call_s": cold["first_call_s"],
                "registered_to_serving_s": round(sched_s + pull_s + cold["first_call_s"], 3),
                "nodewarm_registered_to_serving_s": round(mean_reg_to_serve, 3)}
        base["ratio"] = round(base["nodewarm_registered_to_serving_s"] / base["registered_to_serving_s"], 3)
        lifted = [t for t in timelines.values() if "pod_bound" in t.times and "taint_lifted" in t.times]
        if lifted:
            # Apart, because this scheduler (v1.20, no queueing hints) retries the pods on the Warm condition
            # write and backs off before the taint goes; README "The warm-up's critical path".
            nw_wait = sum(t.times["pod_bound"] - t.times["taint_lifted"] for t in lifted) / len(lifted)
            base["nodewarm_scheduler_wait_s"] = round(nw_wait, 3)
            base["ratio_without_scheduler_waits"] = round(
                (base["nodewarm_registered_to_serving_s"] - nw_wait) / (base["registered_to_serving_s"] - sched_s), 3)

    stop.set()
    watcher.stop.set()
    ctl_thread.join(timeout=30)
    summary = timeline.summary(list(timelines.values()), base)
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    timeline.write_json(summary, opts.out_dir / "timeline.json")
    timeline.write_png(list(timelines.values()), opts.out_dir / "timeline.png", base)
    say("\nPer-node timeline (seconds since the first launch):")
    say(timeline.table(list(timelines.values())))
    for n in names:
        f = timelines[n].facts
        say(f"  {n}: {f['bytes'] / 1e6:.0f} MB verified ({f['throughput_mb_s']:.0f} MB/s), compile cache "
            f"{f['compile_cache']}, first compiled call {f['first_call_s']:.2f}s "
            f"({'HIT' if f['compile_cache_hit'] else 'MISS'}), NVMe proof: "
            f"{'instance store' if f['instance_store'] else 'a plain directory (demo, --allow-non-nvme)'}")
    if base:
        say(f"\nNo-warm baseline, measured in this run: {base['pods']} nodes without the startup taint, registered the "
            f"same way; the scheduler binds their pods {base['scheduler_wait_s']:.1f}s after registration, each pod pulls "
            f"the model from S3 ({base['pull_from_s3_s']:.1f}s, all at once) and compiles cold "
            f"({base['cold_compile_first_call_s']:.1f}s) = {base['registered_to_serving_s']:.1f}s from registration to the "
            f"first compiled call; with nodewarm {base['nodewarm_registered_to_serving_s']:.1f}s (mean over nodes).")
        say(f"nodewarm / no-warm baseline, registration to first compiled call: {base['ratio']:.2f} (lower is better)")
        if "nodewarm_scheduler_wait_s" in base:
            say(f"  of which waiting for the scheduler: nodewarm {base['nodewarm_scheduler_wait_s']:.1f}s after the taint "
                f"lifts, baseline {base['scheduler_wait_s']:.1f}s after registration; without both waits the ratio is "
                f"{base['ratio_without_scheduler_waits']:.2f}. This kube-scheduler (v1.20) retries pending pods on any "
                "node condition change, so the Warm report itself starts a back-off the taint lift then waits out (up to "
                f"podMaxBackoffSeconds, {opts.scheduler_max_backoff_s}s in this run; --scheduler-max-backoff); schedulers "
                "with queueing hints (default from 1.32) do not retry on it.")
        say(f"Note: the {len(names)} simulated nodes share this machine's cores, so per-node pulls, load checks and "
            "restores contend with each other; the baseline pulls with the same concurrency.")
    bad = {n: v["order_violations"] for n, v in summary["nodes"].items() if v["order_violations"]}
    say(f"\nOrdering: {'OK (no pod bound before its taint was lifted)' if not bad else bad}")
    say(f"Wrote {opts.out_dir / 'timeline.json'} and {opts.out_dir / 'timeline.png'}"
        + ("" if opts.log_json else f"; the JSON logs are in {opts.log_path}"))
    return DemoResult(list(timelines.values()), summary, reports)
