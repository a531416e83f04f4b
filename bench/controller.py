"""Controller benchmarks on the local kube-apiserver.

    .venv/bin/python bench/controller.py --nodes 1000          # burst: N NodeClaims, then every node turns Warm
    .venv/bin/python bench/controller.py --nodes --fleet 5000   # memory: a standing fleet of N Nodes + NodeClaims

Fleet: N realistic Nodes (~28 KB of JSON each: 50 images with 4 names, 60 labels, the usual conditions
and nodeInfo, like a GPU node in a real cluster) and N NodeClaims, warm and untainted, in one NodePool
bound to a WarmProfile. The controller (`nodewarm controller`, a separate process) is started on the
empty cluster first (baseline RSS), then again on the full one: its RSS once its caches have synced and
it has reconciled every NodeClaim, and its peak (VmHWM, the lists included), against the 150 MB target.

For each N: a fresh API server (+ etcd) with the Karpenter CRDs, one WarmProfile with its NodeClass
and NodePool, the controller as a separate process (`nodewarm controller`, as deployed), the
Karpenter stand-in creating N NodeClaims and registering their Nodes concurrently, then N Warm
conditions reported as fast as the API server takes them. Measured:
* Warm -> taint removed: from just *before* the bench sends the Warm status patch to the moment its
  own watch sees the taint gone (both ends include an API round trip, so this over- rather than
  under-states the controller's latency);
* API writes per node, from the controller's own nodewarm_api_writes_total counter;
* the controller's peak RSS (VmHWM) and RSS at the end, from /proc.
Events are rate-limited by the controller (10/s, burst 100), so they are counted apart from the object
writes and only as far as they were sent during the run. Prints the numbers against the targets
(p99 <= 1 s, <= 2 writes/node, RSS <= 150 MB) without judging them, and writes JSON to bench/results/. The API server and the bench share the machine's cores with
the controller, so the numbers are upper bounds for a real cluster's control plane.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kubernetes import watch  # noqa: E402

from nodewarm import profile  # noqa: E402
from nodewarm.bootstrap.nodestatus import report_warm  # noqa: E402
from nodewarm.controller.kube import EC2NODECLASSES, NODECLAIMS, NODEPOOLS, NODES, WARMPROFILES, Kube  # noqa: E402
from nodewarm.api.names import STATE_ANNOTATION  # noqa: E402
from nodewarm.api.timeutil import fmt_time  # noqa: E402
from nodewarm.api.views import WarmState  # noqa: E402
from nodewarm.nodeclasses import ec2nodeclass, nodepool, render  # noqa: E402
from nodewarm_dev.testenv import kube as kubeenv  # noqa: E402
from nodewarm_dev.testenv.crds import all_crds  # noqa: E402
from nodewarm_dev.testenv.karpenter import KarpenterSim  # noqa: E402
from nodewarm_dev.testenv.ports import free_port  # noqa: E402

TAINT = "nodewarm.io/warming"
PROFILE = {
    "apiVersion": "nodewarm.io/v1alpha1", "kind": "WarmProfile", "metadata": {"name": "bench"},
    "spec": {
        "model": {"uri": "s3://models-bucket/qwen3-35b/", "sizeGB": 67},
        "serving": {"image": "vllm/vllm-openai:v0.21.0", "tensorParallelSize": 2},
        "nodes": {"mode": "karpenter", "nodePool": "bench-pool", "nodeClass": "bench-class",
                  "instanceTypes": ["p5.48xlarge"], "role": "KarpenterNodeRole-bench", "region": "us-west-2",
                  "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "bench"}}],
                  "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "bench"}}]},
        "compileCache": {"uri": "s3://cache-bucket/compile-cache/"},
        "readiness": {"taintKey": TAINT, "deadline": "60m", "onDeadline": "untaint"},
        "bootstrap": {"artifactUri": "s3://cache-bucket/nodewarm/nodewarm.pyz", "artifactSha256": "a" * 64},
    },
}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * len(xs) + 0.5)) - 1))]


def proc_mem_mb(pid: int) -> tuple[float, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, val = line.partition(":")
        fields[k] = val.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def scrape_writes(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("nodewarm_api_writes_total{"):
            labels, value = line[len("nodewarm_api_writes_total{"):].split("} ")
            d = dict(x.split("=") for x in labels.split(","))
            out[f"{d['resource'].strip(chr(34))} {d['verb'].strip(chr(34))}"] = float(value)
    return out


class TaintWatcher(threading.Thread):
    """Records when each node is first seen without the readiness taint."""

    def __init__(self, k: Kube):
        super().__init__(daemon=True)
        self.k, self.removed, self.stop_flag = k, {}, threading.Event()
        self.rv = k.list(NODES)["metadata"]["resourceVersion"]
        self.w = watch.Watch()

    def run(self):
        while not self.stop_flag.is_set():
            try:
                for ev in self.w.stream(self.k.watch_fn(NODES), resource_version=self.rv, timeout_seconds=60):
                    obj = ev["object"]
                    self.rv = obj["metadata"]["resourceVersion"]
                    name = obj["metadata"]["name"]
                    if name not in self.removed and not any(t["key"] == TAINT for t in obj["spec"].get("taints") or ()) \
                            and "nodewarm.io/state" in (obj["metadata"].get("annotations") or {}):
                        self.removed[name] = time.time()
            except Exception:
                if self.stop_flag.is_set():
                    return
                time.sleep(0.1)


def setup_cluster(workdir: Path, tag: str, threads: int):
    cluster = kubeenv.start(workdir / f"kube-{tag}")
    cluster.apply_crds(all_crds())
    admin = cluster.api_client()
    admin.rest_client.pool_manager.connection_pool_kw["maxsize"] = threads * 2
    k = Kube(admin)
    p = profile.from_dict(PROFILE)
    k.create(EC2NODECLASSES, ec2nodeclass.render(p, render.node_user_data(p, None)[0]))
    k.create(NODEPOOLS, nodepool.render(p))
    k.create(WARMPROFILES, render.warmprofile_document(p))
    return cluster, admin, k


PARTS = ("bootstrap", "nodeclasses", "userdata", "controller", "testenv")   # the top-level folders before src/


def importable(repo: Path, dest: Path) -> Path:
    """A PYTHONPATH entry importing ``nodewarm.*`` from ``repo`` (a plain checkout): the installed editable
    package would otherwise resolve the parts (nodewarm.controller ...) to this checkout. A checkout with the
    src layout is its own src/; an older one (parts in top-level folders) gets a package of links in ``dest``."""
    if (repo / "src" / "nodewarm").is_dir():
        return repo / "src"
    pkg = dest / "nodewarm"
    pkg.mkdir(parents=True, exist_ok=True)
    for entry in (repo / "nodewarm").iterdir():
        (pkg / entry.name).symlink_to(entry)
    for part in PARTS:
        (pkg / part).symlink_to(repo / part)
    return dest


def start_controller(cluster, workdir: Path, tag: str, workers: int, timeout_s: float = 300,
                     pythonpath: Path = REPO / "src"):
    kcfg = cluster.write_kubeconfig(workdir / f"kubeconfig-{tag}")
    mport, hport = free_port(), free_port()
    log = open(workdir / f"controller-{tag}.log", "wb")
    ctl = subprocess.Popen([sys.executable, "-m", "nodewarm.cli", "--log-level", "WARNING", "controller",
                            "--kubeconfig", str(kcfg), "--metrics-port", str(mport), "--health-port", str(hport),
                            "--bind-address", "127.0.0.1", "--workers", str(workers)],
                           # cwd too: `python -m` puts it first on sys.path
                           cwd=pythonpath, stdout=subprocess.DEVNULL, stderr=log,
                           env={**os.environ, "PYTHONPATH": str(pythonpath)})
    deadline = time.time() + timeout_s
    while True:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{hport}/readyz", timeout=1).status == 200:
                return ctl, mport
        except Exception:
            if time.time() > deadline or ctl.poll() is not None:
                stop_controller(ctl)
                raise RuntimeError("controller did not become ready; see " + str(workdir / f"controller-{tag}.log"))
            time.sleep(0.1)


def stop_controller(ctl) -> None:
    if ctl is None:
        return
    ctl.terminate()
    try:
        ctl.wait(15)
    except subprocess.TimeoutExpired:
        ctl.kill()


def scrape_gauge(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return next(float(x.split()[-1]) for x in text.splitlines() if x.startswith(name + " "))


def run_one(n: int, workdir: Path, threads: int, workers: int, repo: Path | None = None) -> dict:
    cluster, ctl = None, None
    tag = f"burst-{n}" + ("-baseline" if repo else "")
    try:
        cluster, admin, k = setup_cluster(workdir, tag, threads)
        ctl, mport = start_controller(cluster, workdir, tag, workers, **(
            {"pythonpath": importable(repo, workdir / f"{tag}-path")} if repo else {}))
        writes_before = scrape_writes(mport)

        sim = KarpenterSim(admin)
        t0 = time.time()
        with ThreadPoolExecutor(threads) as pool:
            nodes = list(pool.map(lambda i: sim.scale_up("bench-pool", node_name=f"bench-{i:05d}"), range(n)))
        burst_s = time.time() - t0

        watcher = TaintWatcher(k)
        watcher.start()
        warm_at: dict[str, float] = {}

        def make_warm(node: str) -> None:
            warm_at[node] = time.time()
            report_warm(admin, node, True, "WeightsVerified", "bench", {"nodewarm.io/compile-cache": "hit"})

        t1 = time.time()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(make_warm, [x.node for x in nodes]))
        warm_burst_s = time.time() - t1
        end = time.time() + 120
        while len(watcher.removed) < n and time.time() < end:
            time.sleep(0.05)
        all_done_s = time.time() - t1
        rss, hwm = proc_mem_mb(ctl.pid)
        # Events are posted off the hot path and rate-limited: counted apart, as far as sent by now.
        writes = {key: val - writes_before.get(key, 0) for key, val in scrape_writes(mport).items()}
        watcher.stop_flag.set()
        watcher.w.stop()

        lat = [watcher.removed[x.node] - warm_at[x.node] for x in nodes if x.node in watcher.removed]
        object_writes = writes.get("nodes PATCH", 0) + writes.get("nodeclaims DELETE", 0)
        return {
            "nodes": n, "untainted": len(lat), "scale_up_burst_s": round(burst_s, 2),
            "warm_reports_s": round(warm_burst_s, 2), "all_untainted_after_s": round(all_done_s, 2),
            "warm_to_untaint_s": {"p50": round(statistics.median(lat), 3) if lat else None,
                                  "p99": round(pct(lat, 0.99), 3) if lat else None,
                                  "max": round(max(lat), 3) if lat else None},
            "writes_per_node": {"object_writes": round(object_writes / n, 3),
                                "events_sent_so_far": round(writes.get("events POST", 0) / n, 3)},
            "writes_by_kind": writes,
            "controller_rss_mb": round(rss, 1), "controller_peak_rss_mb": round(hwm, 1),
            "controller_workers": workers, "client_threads": threads, "controller_repo": str(repo or REPO),
        }
    finally:
        stop_controller(ctl)
        if cluster is not None:
            cluster.stop()


def fleet_node(i: int, provider_id: str) -> dict:
    """A warm, untainted GPU node as a real cluster holds it (~28 KB of JSON)."""
    now = fmt_time(time.time())
    repo = "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml-platform/inference-serving-team"
    labels = {f"label-{j}.example.com/key": f"value-{j}-{i}" for j in range(60)}
    labels.update({"karpenter.sh/nodepool": "bench-pool", "node.kubernetes.io/instance-type": "p5.48xlarge",
                   "karpenter.sh/registered": "true", "karpenter.sh/initialized": "true", "nodewarm.io/warm": "true"})
    state = WarmState(profile="bench", node_claim=f"fleet-{i:05d}", decision="Untainted", decided=now)
    cond = lambda t, st, r: {"type": t, "status": st, "reason": r, "message": "x" * 200,  # noqa: E731
                             "lastHeartbeatTime": now, "lastTransitionTime": now}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": f"fleet-{i:05d}", "labels": labels,
                     "annotations": {STATE_ANNOTATION: state.to_json(), "nodewarm.io/compile-cache": "hit",
                                     "node.alpha.kubernetes.io/ttl": "0", "csi.volume.kubernetes.io/nodeid": "{}" * 50}},
        "spec": {"providerID": provider_id, "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {
            "conditions": [cond("Ready", "True", "KubeletReady"), cond("nodewarm.io/Warm", "True", "WeightsVerified")]
            + [cond(t, "False", f"Kubelet{t}") for t in ("MemoryPressure", "DiskPressure", "PIDPressure")],
            "images": [{"names": [f"{repo}/image-{j}@sha256:{'a' * 64}", f"{repo}/image-{j}:v{j}.{i}",
                                  f"{repo}/image-{j}:latest-build-{i}", f"public.ecr.aws/mirror/team/image-{j}:v{j}.{i}"],
                        "sizeBytes": 1_000_000_000 + j} for j in range(50)],
            "nodeInfo": {k: f"{k}-value-{'x' * 40}" for k in (
                "machineID", "systemUUID", "bootID", "kernelVersion", "osImage", "containerRuntimeVersion",
                "kubeletVersion", "kubeProxyVersion", "operatingSystem", "architecture")},
            "capacity": {"cpu": "192", "memory": "2048Gi", "nvidia.com/gpu": "8", "pods": "110"},
            "allocatable": {"cpu": "191", "memory": "2000Gi", "nvidia.com/gpu": "8", "pods": "110"},
        },
    }


def fleet_claim(i: int, provider_id: str, template_spec: dict) -> tuple[dict, dict]:
    now = fmt_time(time.time())
    body = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": f"fleet-{i:05d}", "labels": {"karpenter.sh/nodepool": "bench-pool",
                                                             "node.kubernetes.io/instance-type": "p5.48xlarge"}},
            "spec": {"nodeClassRef": template_spec["nodeClassRef"], "requirements": template_spec["requirements"],
                     "startupTaints": template_spec.get("startupTaints") or [], "resources": {"requests": {"cpu": "1"}}}}
    status = {"providerID": provider_id, "nodeName": f"fleet-{i:05d}",
              "conditions": [{"type": t, "status": "True", "reason": t, "message": t, "lastTransitionTime": now}
                             for t in ("Launched", "Registered", "Initialized")]}
    return body, status


def settled_memory(ctl, mport: int) -> tuple[float, float]:
    """RSS and peak once every NodeClaim was reconciled (the queue drained) and things settled."""
    end = time.time() + 300
    while scrape_gauge(mport, "nodewarm_workqueue_depth") > 0 and time.time() < end:
        time.sleep(0.5)
    time.sleep(5)
    return proc_mem_mb(ctl.pid)


def run_fleet(n: int, workdir: Path, threads: int, workers: int, baseline: Path | None) -> dict:
    cluster, ctl = None, None
    try:
        cluster, admin, k = setup_cluster(workdir, f"fleet-{n}", threads)
        ctl, mport = start_controller(cluster, workdir, f"fleet-{n}-empty", workers)
        time.sleep(3)
        base_rss, base_hwm = proc_mem_mb(ctl.pid)
        stop_controller(ctl)
        ctl = None

        tmpl = k.get(NODEPOOLS, "bench-pool")["spec"]["template"]["spec"]
        node_bytes = len(json.dumps(fleet_node(0, "aws:///us-west-2a/i-0")))

        def make(i: int) -> None:
            pid = f"aws:///us-west-2a/i-{i:017x}"
            k.create(NODES, fleet_node(i, pid))
            body, status = fleet_claim(i, pid, tmpl)
            k.create(NODECLAIMS, body)
            k.merge_patch(NODECLAIMS, body["metadata"]["name"], {"status": status}, sub="status")

        t0 = time.time()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(make, range(n)))
        populate_s = time.time() - t0

        t1 = time.time()
        ctl, mport = start_controller(cluster, workdir, f"fleet-{n}", workers, timeout_s=600)
        synced_s = time.time() - t1
        rss, hwm = settled_memory(ctl, mport)
        writes = scrape_writes(mport)
        stop_controller(ctl)
        ctl = None
        other = {}
        if baseline is not None:
            # The same fleet under another checkout's controller (e.g. before paginated, projected lists).
            ctl, mport = start_controller(cluster, workdir, f"fleet-{n}-baseline", workers, timeout_s=600,
                                          pythonpath=importable(baseline, workdir / "baseline-path"))
            b_rss, b_hwm = settled_memory(ctl, mport)
            other = {"baseline_repo": str(baseline), "baseline_rss_mb": round(b_rss, 1),
                     "baseline_peak_rss_mb": round(b_hwm, 1)}
        return {**other,"fleet_nodes": n, "fleet_nodeclaims": n, "node_json_bytes": node_bytes,
                "populate_s": round(populate_s, 1), "controller_ready_s": round(synced_s, 1),
                "controller_rss_mb": round(rss, 1), "controller_peak_rss_mb": round(hwm, 1),
                "empty_cluster_rss_mb": round(base_rss, 1), "empty_cluster_peak_rss_mb": round(base_hwm, 1),
                "cache_kb_per_node_and_claim": round((rss - base_rss) * 1024 / n, 2),
                "node_patches": writes.get("nodes PATCH", 0), "controller_workers": workers}
    finally:
        stop_controller(ctl)
        if cluster is not None:
            cluster.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="*", default=[100, 1000], help="burst sizes (none: skip the burst)")
    ap.add_argument("--fleet", type=int, nargs="*", default=[], help="standing fleet sizes for the memory run")
    ap.add_argument("--baseline-repo", type=Path, help="also measure the controller of this checkout (e.g. "
                    "`git archive <commit> | tar -x -C DIR`) on the same fleet / burst, side by side")
    ap.add_argument("--threads", type=int, default=8, help="bench client threads (Karpenter stand-in, Warm reports)")
    ap.add_argument("--workers", type=int, default=4, help="controller --workers")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="nodewarm-bench-") as tmp:
        for n in args.fleet:
            r = run_fleet(n, Path(tmp), args.threads, args.workers, args.baseline_repo)
            results.append(r)
            if "baseline_peak_rss_mb" in r:
                print(f"fleet N={n}: baseline {r['baseline_repo']}: RSS {r['baseline_rss_mb']} MB, peak "
                      f"{r['baseline_peak_rss_mb']} MB -> this controller's peak is "
                      f"{r['controller_peak_rss_mb'] / r['baseline_peak_rss_mb']:.2f}x the baseline's", flush=True)
            print(f"fleet N={n} ({r['node_json_bytes'] / 1024:.1f} KB/Node): controller RSS {r['controller_rss_mb']} MB, "
                  f"peak {r['controller_peak_rss_mb']} MB (target <= 150 MB: {r['controller_peak_rss_mb'] / 150:.2f}x) | "
                  f"same process on the empty cluster {r['empty_cluster_rss_mb']} MB -> caches "
                  f"{r['cache_kb_per_node_and_claim']} KB per Node+NodeClaim | ready after {r['controller_ready_s']} s "
                  f"| node patches {r['node_patches']:.0f}", flush=True)
        for n in args.nodes:
            r = run_one(n, Path(tmp), args.threads, args.workers)
            results.append(r)
            lat, w = r["warm_to_untaint_s"], r["writes_per_node"]
            print(f"burst N={n}: untainted {r['untainted']}/{n} | Warm->untaint p50 {lat['p50']} s, p99 {lat['p99']} s "
                  f"(target p99 <= 1 s: {lat['p99'] / 1.0 if lat['p99'] is not None else float('nan'):.2f}x) | "
                  f"object writes/node {w['object_writes']} (target <= 2) + events sent so far "
                  f"{w['events_sent_so_far']}/node (rate-limited) | controller RSS {r['controller_rss_mb']} MB, peak "
                  f"{r['controller_peak_rss_mb']} MB | scale-up burst {r['scale_up_burst_s']} s, "
                  f"Warm reports sent in {r['warm_reports_s']} s", flush=True)
            if args.baseline_repo is not None:
                b = run_one(n, Path(tmp), args.threads, args.workers, args.baseline_repo)
                results.append(b)
                bl, bw = b["warm_to_untaint_s"], b["writes_per_node"]
                print(f"burst N={n}, baseline {args.baseline_repo}: p50 {bl['p50']} s, p99 {bl['p99']} s, object "
                      f"writes/node {bw['object_writes']}, events so far {bw['events_sent_so_far']}/node -> this "
                      f"controller's p99 is {lat['p99'] / bl['p99']:.2f}x the baseline's in the same run", flush=True)
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"controller-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps({"results": results, "cpus": os.cpu_count()}, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
