"""`nodewarm demo --models 2` (spec.models, docs/models.md): two models on every node of one profile, served from
each node's NVMe copy, then a roll of the second one.

The servers, the seeding, the profile, the Deployments and the vLLM pods are run.py's; what differs:

* the profile lists a second model, not required, so the startup taint waits for the first model only and the
  second warms in the background on a node that already serves. Its pods require the model's own Node label
  (``models.nodewarm.io/<profile>-second``), which the controller sets from the agent's report;
* the node agents run in this process as the real ``Follower`` (each with its node's kubelet identity), not as
  ``bootstrap run --once`` processes: the second model's background pull and the roll are the agent *following*
  its profile after the first warm, and the demo reads what the agent did (``follower.models.results``/``evicted``)
  from it directly;
* the nodes' instance type has several GPUs, so each node takes one pod of each model;
* nothing is compiled or published first (no "node A", no baseline): the point is where each model's pods land
  and what a roll moves, so both models' compile caches start cold.

The roll changes one safetensors shard of the second model under a new S3 prefix: the agent pulls the new version
beside the old one, links every file whose content did not change, and removes the old folder once no pod mounts
it. No kubelet runs here, so the demo plays the part of it a roll needs (Observer.kubelet): a bound pod is
reported running and Ready, a deleted one is removed.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import struct
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, TextIO

from nodewarm import instancetypes, logs
from nodewarm.api import models, prepullpod
from nodewarm.api.generation import generation
from nodewarm.api.models import WARM
from nodewarm.api.names import GENERATION_LABEL, MODEL_LABEL_PREFIX, MODELS_ANNOTATION
from nodewarm.api.warmprofile import WarmProfile
from nodewarm_dev.testenv import kube as kubeenv
from nodewarm.bootstrap.follow import Follower
from nodewarm.bootstrap.followplan import FollowOptions
from nodewarm.kubeapply import apply
from nodewarm.nodeclasses import vllm
from nodewarm.nodeclasses.render import render
from nodewarm.sizing import GB

from . import engine as vllm_engine
from . import run, seed, servers
from .run import MODEL_BUCKET, NAMESPACE, DemoOptions

log = logs.get("demo.models")

SECOND = "second"
SECOND_PREFIX = f"{run.PROFILE_NAME}-{SECOND}"
# Four GPUs: one pod of each model fits on every node (g6e.xlarge, the one-model demo's, has one).
INSTANCE_TYPE = "g6e.12xlarge"
# How often an agent's model worker looks again without a profile change: a pod gone frees an old folder then.
ROUND_S = 3.0
POLL_S = 0.2
WAIT_S = 600.0
SUMMARY_FILE = "models.json"
# Flipping the top bit of every 2-byte element negates F16/BF16 values: the changed shard stays a valid checkpoint.
_SIGN_FLIP = bytes(b ^ 0x80 for b in range(256))


# -- the second model and its roll -----------------------------------------------------------------------
def make_second(work: Path, engine: str, model_mb: int) -> Path:
    """The second model, kept in ``work`` (the S3 staging copy is removed by the upload; the roll starts from this
    one): another seed and a smaller config than the first, in several shards so that a roll can change one."""
    dest = work / "second-v1"
    if engine == "vllm":
        from nodewarm_dev.testenv import enginenode, podrun

        podrun.require_serving_venv()
        enginenode.make_model(dest, seed=1, layers=2, shards=2)
    else:
        seed.write_model(dest, max(4, model_mb // 2))
        (dest / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 128,
                                                      "num_hidden_layers": 1, "torch_dtype": "float16"}))
    return dest


def changed_copy(v1: Path, dest: Path) -> Path:
    """``v1``'s files in ``dest`` with the last safetensors shard's weights changed (its header kept); returns it."""
    shutil.copytree(v1, dest)
    shard = sorted(dest.glob("*.safetensors"))[-1]
    raw = bytearray(shard.read_bytes())
    start = 8 + struct.unpack("<Q", raw[:8])[0]
    raw[start + 1::2] = bytes(raw[start + 1::2]).translate(_SIGN_FLIP)
    shard.write_bytes(raw)
    return shard


def upload(srv: servers.Servers, src: Path, prefix: str) -> str:
    """Put ``src``'s files under ``prefix`` through the S3 API (rclone lists files laid behind its back only after
    its listing cache expires); returns the model's URI."""
    client = srv.s3.client()
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        client.upload_file(str(f), MODEL_BUCKET, f"{prefix}/{f.relative_to(src).as_posix()}")
    return f"s3://{MODEL_BUCKET}/{prefix}/"


def listed_gb(srv: servers.Servers, prefix: str, files: int) -> float:
    from nodewarm_dev.testenv.ports import wait_until

    client, listing = srv.s3.client(), []

    def done() -> bool:
        listing[:] = client.list_objects_v2(Bucket=MODEL_BUCKET, Prefix=f"{prefix}/").get("Contents", [])
        return len(listing) == files

    wait_until(done, 30, f"{prefix} listed by the S3 server")
    return sum(o["Size"] for o in listing) / GB


# -- the profile and its Deployments --------------------------------------------------------------------
def profile_doc(size_gb: float, second_uri: str, second_gb: float, verify_key: str, nodes: int, engine: str,
                port: int) -> dict:
    doc = run.demo_profile_doc(size_gb, verify_key, nodes, engine, port)
    doc["spec"]["nodes"]["instanceTypes"] = [INSTANCE_TYPE]
    doc["spec"]["models"] = [{"name": SECOND, "uri": second_uri, "sizeGB": round(second_gb, 6), "required": False,
                              "priority": 0, "replicas": nodes}]
    return doc


def rolled(doc: dict, uri: str) -> dict:
    doc = copy.deepcopy(doc)
    doc["spec"]["models"][0]["uri"] = uri
    return doc


def deployment(v: WarmProfile, engine: str) -> dict:
    """run.demo_deployment (one replica per node, a pause container with the probe) with the view's node affinity on
    its model label kept: run.py's podAntiAffinity would replace it.

    A roll replaces a node's pod in place, one node at a time: with one replica per node (that anti-affinity) a
    surge pod has no node to go to, and the default strategy (no replica unavailable) would wait for it forever."""
    d = run.demo_deployment(v, engine)
    d["spec"]["template"]["spec"]["affinity"].update(vllm.placement(v).get("affinity", {}))
    d["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    return d


def apply_profile(admin, p: WarmProfile, engine: str) -> tuple[list[dict], list]:
    """The rendered objects applied, each model's Deployment as the demo runs it; returns what was rendered (the
    vLLM pods' ConfigMaps) and kubeapply's actions."""
    rendered = render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
    docs = [d for d in rendered if d["kind"] not in ("Deployment", *kubeenv.NOT_SERVED)]
    docs += [deployment(v, engine) for v in models.views(p)]
    return rendered, apply(admin, docs)


# -- the node agents ------------------------------------------------------------------------------------
@dataclass
class Agent:
    """One node's agent: the real Follower in a thread, as the systemd unit runs it."""
    follower: Follower
    thread: threading.Thread
    mount: Path


def start_agent(srv: servers.Servers, p: WarmProfile, node: str, mount: Path, stop: threading.Event) -> Agent:
    from kubernetes import config

    kcfg = srv.kube.write_kubeconfig(srv.workdir / f"kubeconfig-{node}", srv.kube.node_token(node),
                                     f"system:node:{node}")
    api = config.new_client_from_config(config_file=str(kcfg))
    f = Follower(api, FollowOptions(profile=p.name, mount=mount, node_name=node, allow_non_nvme=True,
                                    watch_timeout_s=5, poll_s=0.5, retry_s=ROUND_S, state_dir=mount / "state"), stop)
    t = threading.Thread(target=f.run, name=f"agent-{node}", daemon=True)
    t.start()
    return Agent(f, t, mount)


# -- what the cluster says --------------------------------------------------------------------------------
class Observer:
    """Reads the demo's Nodes and Pods each round and prints each new fact once, per node in seconds since it
    registered: the taint lifted, a model reported and labelled, a pod bound (with the node's label for that
    model as the scheduler saw it: the label comes first, so a Node read after the Pod list shows it)."""

    def __init__(self, admin, p: WarmProfile, names: tuple[str, ...], say: Callable[[str], None]):
        from kubernetes import client

        self.core, self.p, self.names, self.say = client.CoreV1Api(admin), p, names, say
        self.label_keys = {v.name: models.label_key(v) for v in models.views(p)}    # a roll keeps names and keys
        self.registered: dict[str, float] = {}
        self.events: dict[str, dict[str, float]] = {n: {} for n in names}
        self.placed: dict[str, dict] = {}         # pod uid -> where it was bound and the node's label then
        self.finished: list[str] = []             # pods finished by the kubelet's part
        self.nodes: dict[str, object] = {}

    def _once(self, node: str, key: str, text: str) -> None:
        if key in self.events[node]:
            return
        t = time.time()
        self.events[node][key] = round(t - self.registered.get(node, t), 3)
        self.say(f"   {node} +{self.events[node][key]:6.1f}s  {text}")

    def poll(self) -> None:
        pods = [x for x in self.core.list_namespaced_pod(NAMESPACE).items if x.spec.node_name in self.names]
        self.nodes = {n.metadata.name: n for n in self.core.list_node().items if n.metadata.name in self.names}
        for name, node in self.nodes.items():
            labels = node.metadata.labels or {}
            if self.p.readiness.taint_key not in {t.key for t in node.spec.taints or ()}:
                self._once(name, "taint_lifted", f"startup taint lifted (the first model is warm: "
                                                 f"{GENERATION_LABEL}={labels.get(GENERATION_LABEL)})")
            report = models.decode((node.metadata.annotations or {}).get(MODELS_ANNOTATION))
            for m in report.values():
                if m.pending:
                    self._once(name, f"pulling:{m.name}:{m.pending}",
                               f"agent pulling {m.name} generation {m.pending} in the background (state {m.state})")
                if m.state == WARM and m.generation:
                    self._once(name, f"warm:{m.name}:{m.generation}",
                               f"agent reports {m.name} warm, generation {m.generation} ({m.bytes / 1e6:.1f} MB)")
            for key, value in labels.items():
                if key.startswith(MODEL_LABEL_PREFIX):
                    self._once(name, f"label:{key}={value}", f"labelled {key}={value} (the controller)")
        for pod in pods:
            if pod.metadata.uid in self.placed or pod.metadata.deletion_timestamp:
                continue
            view = pod.metadata.labels["app.kubernetes.io/instance"]
            key = self.label_keys[view]
            node_label = (self.nodes[pod.spec.node_name].metadata.labels or {}).get(key)
            want = pod.metadata.labels.get(GENERATION_LABEL)
            self.placed[pod.metadata.uid] = {"pod": pod.metadata.name, "model": view, "node": pod.spec.node_name,
                                             "label": key, "wants": want, "nodeLabel": node_label}
            self._once(pod.spec.node_name, f"bound:{pod.metadata.uid}",
                       f"scheduler bound {pod.metadata.name} ({view}; node has {key}={node_label})")

    def kubelet(self) -> None:
        """The kubelets' part (no containers run here): a pod bound to a node is reported running and Ready, and a
        pod deleted on a node is removed, as once its containers stopped. A Deployment rolls only past Ready pods."""
        from kubernetes.client.exceptions import ApiException

        for pod in self.core.list_namespaced_pod(NAMESPACE).items:
            if pod.spec.node_name not in self.names:
                continue
            if not pod.metadata.deletion_timestamp and pod.status.phase != "Running":
                ready = [{"type": t, "status": "True"} for t in ("Initialized", "ContainersReady", "Ready")]
                self.core.patch_namespaced_pod_status(pod.metadata.name, NAMESPACE, {"status": {
                    "phase": "Running", "conditions": ready}})
            if pod.metadata.deletion_timestamp:
                try:
                    self.core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)
                except ApiException as e:
                    if e.status == 404:     # gone since the list
                        continue
                    raise
                self.finished.append(pod.metadata.name)
                self.say(f"   kubelet on {pod.spec.node_name}: {pod.metadata.name} stopped and removed")

    def labels(self, node: str) -> dict[str, str]:
        return dict(self.nodes[node].metadata.labels or {}) if node in self.nodes else {}

    def pods_of(self, view: str, wants: str) -> list[dict]:
        return [x for x in self.placed.values() if x["model"] == view and x["wants"] == wants]


def settled(observer: Observer, p: WarmProfile) -> bool:
    """Every node labelled with every model's generation of ``p``, and every pod of those generations bound."""
    vs = models.views(p)
    return (all(observer.labels(n).get(models.label_key(v)) == generation(v) for n in observer.names for v in vs)
            and all(len(observer.pods_of(v.name, generation(v))) == v.serving.replicas for v in vs))


def wait(observer: Observer, done: Callable[[], bool], what: str, sync: Callable[[], None]) -> None:
    deadline = time.time() + WAIT_S
    while True:
        observer.poll()
        observer.kubelet()
        sync()
        if done():
            return
        if time.time() > deadline:
            pending = [x.metadata.name for x in observer.core.list_namespaced_pod(NAMESPACE).items
                       if not x.spec.node_name]
            raise RuntimeError(f"gave up after {WAIT_S:.0f}s waiting for {what}; pods not bound: {pending}; node "
                               f"labels: { {n: observer.labels(n) for n in observer.names} }")
        time.sleep(POLL_S)


# -- serving both models on one node ----------------------------------------------------------------------
def _catch_models(port: int, seen: dict, stop: threading.Event) -> None:
    """What the OpenAI server says it serves (/v1/models: the served name and the model path it loaded), read while
    the pod runs: engine.serve stops the pod as soon as its first completion is answered."""
    while not stop.is_set():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                seen.update(json.load(r)["data"][0])
                return
        except (OSError, ValueError, KeyError, IndexError):
            stop.wait(0.05)


def serve_models(admin, serving: run.Serving, views: tuple[WarmProfile, ...], node: str, root: Path,
                 work: Path) -> dict[str, dict]:
    """Each model's bound pod on ``node``, one at a time (one serving port on this machine): real vLLM from the
    node's NVMe copy of that model."""
    from kubernetes import client

    core = client.CoreV1Api(admin)
    out = {}
    for v in views:
        (pod,) = [x for x in core.list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={node}",
                                                      label_selector=f"app.kubernetes.io/instance={v.name}").items
                  if not x.metadata.deletion_timestamp]
        seen: dict = {}
        stop = threading.Event()
        catcher = threading.Thread(target=_catch_models, args=(serving.port, seen, stop), daemon=True)
        catcher.start()
        try:
            served = vllm_engine.serve(run.with_service_account_token(admin.sanitize_for_serialization(pod)),
                                       serving.env(root, work / "pods" / f"{node}-{v.name}"), serving.port, v.name,
                                       with_publisher=False)
        finally:
            stop.set()
            catcher.join(timeout=5)
        out[v.name] = {"pod": pod.metadata.name, "servedModel": seen.get("id"), "modelPath": seen.get("root"),
                       "startPath": served.evidence.start_path, "bootS": round(served.boot_s, 3),
                       "firstCompletionS": round(served.first_completion_s, 3), "completion": served.completion}
    return out


# -- the whole run ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Session:
    srv: servers.Servers
    summary: dict


@contextlib.contextmanager
def session(opts: DemoOptions, out: TextIO) -> Iterator[Session]:
    """Start the servers, run the two-model flow, yield with the servers and the nodes' disks still there (the
    tests read the cluster), then stop everything, also on Ctrl-C. The summary is also OUT/models.json."""
    if opts.engine not in run.ENGINES:
        raise ValueError(f"DemoOptions.engine {opts.engine!r}: one of {', '.join(run.ENGINES)}")

    def say(msg: str) -> None:
        out.write(msg + "\n")
        out.flush()

    names = tuple(f"demo-node-{i}" for i in range(opts.nodes))
    work = Path(opts.workdir or tempfile.mkdtemp(prefix="nodewarm-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    if not opts.log_json:
        say(f"JSON logs (the demo's, the controller's, each node agent's): {opts.log_path}")
    need_mb = opts.model_mb if opts.engine == "probe" else 64
    # Each node holds both models, and the second one twice during the roll.
    storage = run.node_storage(work, 3 * len(names) * need_mb * 1024 * 1024)
    saved = dict(os.environ)
    try:
        with logs.to_file(None if opts.log_json else opts.log_path):
            first = run.seed_model(work, opts.model_mb, opts.s3_engine, opts.engine)
            second = make_second(work, opts.engine, opts.model_mb)
            shutil.copytree(second, run.seed_root(work, opts.s3_engine) / MODEL_BUCKET / SECOND_PREFIX / "v1")
            with servers.running(work, names, scheduler_max_backoff_s=opts.scheduler_max_backoff_s,
                                 s3_engine=opts.s3_engine) as srv:
                os.environ.update(srv.s3.env())     # the agents run in this process: the nodes' AWS environment
                yield Session(srv, _run(srv, opts, names, work, storage, first, second, say))
    finally:
        os.environ.clear()
        os.environ.update(saved)
        if not storage.is_relative_to(work):
            shutil.rmtree(storage, ignore_errors=True)
        if not opts.keep and opts.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def _run(srv: servers.Servers, opts: DemoOptions, names: tuple[str, ...], work: Path, storage: Path,
         first: list[Path], second: Path, say: Callable[[str], None]) -> dict:
    from kubernetes import client

    from nodewarm.bootstrap.compilecache import signing
    from nodewarm_dev.testenv.karpenter import KarpenterSim
    from nodewarm_dev.testenv.ports import free_port

    real = opts.engine == "vllm"
    admin = srv.kube.api_client()
    say(f"1. servers up: kube-apiserver {srv.kube.server}, S3 {srv.s3.endpoint}"
        + (", kube-scheduler" if srv.scheduler else " (no kube-scheduler built: pods are not bound)"))
    if opts.s3_engine != "rclone":
        srv.s3.upload_tree(run.seed_root(work, opts.s3_engine), MODEL_BUCKET)
    size_gb = run.model_listed(srv, first)
    second_files = sorted(f for f in second.rglob("*") if f.is_file())
    second_gb = listed_gb(srv, f"{SECOND_PREFIX}/v1", len(second_files))
    client.CoreV1Api(admin).create_namespace({"metadata": {"name": NAMESPACE}})
    pair = signing.generate(work / "signing.key")
    doc = profile_doc(size_gb, f"s3://{MODEL_BUCKET}/{SECOND_PREFIX}/v1/", second_gb, pair.public, opts.nodes,
                      opts.engine, free_port() if real else 8000)
    p = run.checked_profile(doc)
    views = models.views(p)
    say(f"2. S3 seeded: {run.PROFILE_NAME} ({size_gb * 1e3:.1f} MB) and {views[1].name} ({second_gb * 1e3:.1f} MB, "
        f"{sum(f.suffix == '.safetensors' for f in second_files)} safetensors shards, another seed and config)"
        + (": both tiny Llamas real vLLM serves" if real else ""))
    rendered, applied = apply_profile(admin, p, opts.engine)
    for a in applied:
        say(f"   applied {a.kind}/{a.name}: {a.action}")
    bg = p.weights.background
    say(f"3. WarmProfile {p.name} with spec.models [{SECOND}] (required: false) applied, with one Deployment per "
        f"model ({', '.join(vllm.deployment(v)['metadata']['name'] for v in views)}), pending: no node yet.\n"
        f"   The startup taint waits for {p.name} only; {views[1].name} warms in the background once the node "
        f"serves (spec.weights.background: {asdict(bg)}), and its pods require {models.label_key(views[1])}")

    stop = threading.Event()
    ctl_thread, ctl_user = run.start_controller(srv, stop)
    sim = KarpenterSim(admin, default_instance_type=INSTANCE_TYPE)
    roots = {n: storage / n for n in names}
    claims = {}
    for n in names:
        claims[n] = sim.create_nodeclaim(p.nodes.node_pool)["metadata"]["name"]
        sim.launch(claims[n])
    observer = Observer(admin, p, names, say)
    agents: dict[str, Agent] = {}
    summary: dict = {"engine": opts.engine, "profile": p.name, "nodes": {}, "pods": [], "served": {}}
    try:
        for n in names:
            observer.registered[n] = run.register(sim, claims[n], n)
            run.node_mount(p, roots[n]).mkdir(parents=True, exist_ok=True)
            sim.run_daemonset_pod(n, p.bootstrap.namespace, prepullpod.daemonset_name(p.name))
            agents[n] = start_agent(srv, p, n, run.node_mount(p, roots[n]), stop)
        say(f"4. controller running as {ctl_user}; {opts.nodes} {INSTANCE_TYPE} node(s) launched and registered "
            "(startup taint), a node agent following the profile on each (its kubelet identity). Per node, "
            "seconds since it registered:")

        def sync() -> None:
            for c in claims.values():
                sim.sync_initialized(c)

        wait(observer, lambda: settled(observer, p), "both models labelled on every node and every pod bound", sync)
        bad = [x for x in observer.placed.values() if x["nodeLabel"] != x["wants"]]
        say(f"5. every node holds both models, each labelled by the controller; the scheduler placed "
            f"{len(observer.placed)} pods, each on a node labelled for its model"
            + (f" EXCEPT {bad}" if bad else ""))

        if real:
            serving = run.serving_setup(srv, p, rendered, work, pair.private_path)
            node = names[0]
            say(f"6. serving both models on {node}: each bound pod's rendered vLLM container, real vLLM (CPU) from "
                "the node's NVMe copy, one at a time ...")
            summary["served"] = serve_models(admin, serving, views, node, roots[node], work)
            for name, s in summary["served"].items():
                say(f"   {name}: /v1/models says {s['servedModel']} from {s['modelPath']} (start path "
                    f"{s['startPath']}); ready {s['bootS']:.1f}s after start, first completion {s['completion']!r} "
                    f"in {s['firstCompletionS']:.2f}s")
        else:
            say("6. --engine probe: the pods are pause containers, no vLLM is booted (run with --engine vllm to "
                "serve both models)")

        summary["roll"] = roll(srv, admin, opts.engine, doc, agents, observer, second, work, sync)
    finally:
        stop.set()
        for a in agents.values():
            a.thread.join(timeout=30)
        ctl_thread.join(timeout=30)

    for n in names:
        summary["nodes"][n] = {"events": observer.events[n], "labels": {
            k: v for k, v in observer.labels(n).items() if k == GENERATION_LABEL or k.startswith(MODEL_LABEL_PREFIX)}}
    summary["pods"] = list(observer.placed.values())
    summary["finishedPods"] = observer.finished
    summary["ok"] = (not [x for x in summary["pods"] if x["nodeLabel"] != x["wants"]]
                     and all(x["startPath"] == "local" for x in summary["served"].values())
                     and all(r["oldFolderGone"] and r["labelSwitched"] for r in summary["roll"]["nodes"].values()))
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    (opts.out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str))
    say(f"\n{'OK' if summary['ok'] else 'NOT OK'}: every pod on a node labelled for its model"
        + (", each model served from the node's copy" if summary["served"] else "")
        + f", the roll linked what did not change and removed the old folder. Wrote {opts.out_dir / SUMMARY_FILE}"
        + ("" if opts.log_json else f"; the JSON logs are in {opts.log_path}"))
    return summary


def roll(srv: servers.Servers, admin, engine: str, doc: dict, agents: dict[str, Agent], observer: Observer,
         second: Path, work: Path, sync: Callable[[], None]) -> dict:
    """Second model v1 -> v2 (one shard changed, a new prefix): what each node linked, pulled and removed."""
    from nodewarm.bootstrap.modelcache import plan

    say, names, p = observer.say, observer.names, observer.p
    shard = changed_copy(second, work / "second-v2")
    uri = upload(srv, work / "second-v2", f"{SECOND_PREFIX}/v2")
    p2 = run.checked_profile(rolled(doc, uri))
    old, new = models.views(p)[1], models.views(p2)[1]
    key = models.label_key(new)
    say(f"7. rolling {new.name} to {uri} (same files, {shard.name} changed: {shard.stat().st_size / 1e6:.2f} MB): "
        f"generation {generation(old)} -> {generation(new)}")
    for n in names:
        observer.events[n]["rollApplied"] = round(time.time() - observer.registered[n], 3)
    apply_profile(admin, p2, engine)
    say(f"   applied the WarmProfile and {new.name}'s Deployment: its pods now require {key}={generation(new)}")
    old_dirs = {n: plan.targets(p, agents[n].mount)[1].dest for n in names}
    new_dirs = {n: plan.targets(p2, agents[n].mount)[1].dest for n in names}

    def done() -> bool:
        return settled(observer, p2) and all(
            (agents[n].follower.models.results.get(new.name) or {}).get("generation") == generation(new)
            and not old_dirs[n].exists() for n in names)

    wait(observer, done, f"{new.name} rolled on every node and the old folder removed", sync)
    out = {"uri": uri, "changedFile": shard.name, "changedBytes": shard.stat().st_size, "from": generation(old),
           "to": generation(new), "nodes": {}}
    for n in names:
        r = agents[n].follower.models.results[new.name]
        evicted = list(agents[n].follower.models.evicted)
        out["nodes"][n] = {**r, "evicted": evicted, "oldFolder": str(old_dirs[n]), "newFolder": str(new_dirs[n]),
                           "oldFolderGone": not old_dirs[n].exists(),
                           "labelSwitched": observer.labels(n).get(key) == generation(new),
                           "labelSwitchedS": round(observer.events[n][f"label:{key}={generation(new)}"]
                                                   - observer.events[n]["rollApplied"], 3)}
        say(f"   {n}: linked {r['linkedFiles']}/{r['files']} files ({r['linkedBytes'] / 1e6:.2f} MB), pulled "
            f"{r['downloadedBytes'] / 1e6:.2f} MB; removed {', '.join(evicted) or 'nothing'}; {key}: "
            f"{generation(old)} -> {observer.labels(n).get(key)}")
    return out


def execute(opts: DemoOptions, out: TextIO) -> dict:
    with session(opts, out) as s:
        return s.summary


def run_models_demo(opts: DemoOptions, out: TextIO) -> int:
    return 0 if execute(opts, out)["ok"] else 1
