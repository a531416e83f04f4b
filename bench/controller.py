"""Controller benchmark on the local kube-apiserver: N NodeClaims in a burst, then every node turns Warm.

    .venv/bin/python bench/controller.py --nodes 100 1000

For each N: a fresh API server (+ etcd) with the Karpenter CRDs, one WarmProfile with its NodeClass
and NodePool, the controller as a separate process (`nodewarm controller`, as deployed), the
Karpenter stand-in creating N NodeClaims and registering their Nodes concurrently, then N Warm
conditions reported as fast as the API server takes them. Measured:
* Warm -> taint removed: from just *before* the bench sends the Warm status patch to the moment its
  own watch sees the taint gone (both ends include an API round trip, so this over- rather than
  under-states the controller's latency);
* API writes per node, from the controller's own nodewarm_api_writes_total counter;
* the controller's peak RSS (VmHWM) and RSS at the end, from /proc.
Prints the numbers against the targets (p99 <= 1 s, <= 2 writes/node, RSS <= 150 MB) without judging
them, and writes JSON to bench/results/. The API server and the bench share the machine's cores with
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
from nodewarm.controller.kube import EC2NODECLASSES, NODEPOOLS, NODES, WARMPROFILES, Kube  # noqa: E402
from nodewarm.nodeclasses import ec2nodeclass, nodepool, render  # noqa: E402
from nodewarm.testenv import kube as kubeenv  # noqa: E402
from nodewarm.testenv.crds import all_crds  # noqa: E402
from nodewarm.testenv.karpenter import KarpenterSim  # noqa: E402
from nodewarm.testenv.ports import free_port  # noqa: E402

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


def run_one(n: int, workdir: Path, threads: int, workers: int) -> dict:
    cluster = kubeenv.start(workdir / f"kube-{n}")
    ctl = None
    try:
        cluster.apply_crds(all_crds())
        admin = cluster.api_client()
        admin.rest_client.pool_manager.connection_pool_kw["maxsize"] = threads * 2
        k = Kube(admin)
        p = profile.from_dict(PROFILE)
        k.create(EC2NODECLASSES, ec2nodeclass.render(p, render.node_user_data(p, None)[0]))
        k.create(NODEPOOLS, nodepool.render(p))
        k.create(WARMPROFILES, render.warmprofile_document(p))
        kcfg = cluster.write_kubeconfig(workdir / f"kubeconfig-{n}")
        mport, hport = free_port(), free_port()
        log = open(workdir / f"controller-{n}.log", "wb")
        ctl = subprocess.Popen([sys.executable, "-m", "nodewarm.cli", "--log-level", "WARNING", "controller",
                                "--kubeconfig", str(kcfg), "--metrics-port", str(mport), "--health-port", str(hport),
                                "--bind-address", "127.0.0.1", "--workers", str(workers)],
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "PYTHONPATH": str(REPO)})
        deadline = time.time() + 60
        while True:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{hport}/readyz", timeout=1).status == 200:
                    break
            except Exception:
                if time.time() > deadline or ctl.poll() is not None:
                    raise RuntimeError("controller did not become ready; see " + str(workdir / f"controller-{n}.log"))
                time.sleep(0.1)
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
        # Events are posted off the hot path: give the backlog a moment to drain before counting writes.
        for _ in range(100):
            w = scrape_writes(mport)
            if w.get("events POST", 0) - writes_before.get("events POST", 0) >= 2 * len(watcher.removed):
                break
            time.sleep(0.1)
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
                                "events": round(writes.get("events POST", 0) / n, 3),
                                "total": round(sum(v for k_, v in writes.items() if k_ != "leases PUT") / n, 3)},
            "writes_by_kind": writes,
            "controller_rss_mb": round(rss, 1), "controller_peak_rss_mb": round(hwm, 1),
            "controller_workers": workers, "client_threads": threads,
        }
    finally:
        if ctl is not None:
            ctl.terminate()
            try:
                ctl.wait(15)
            except subprocess.TimeoutExpired:
                ctl.kill()
        cluster.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--threads", type=int, default=8, help="bench client threads (Karpenter stand-in, Warm reports)")
    ap.add_argument("--workers", type=int, default=4, help="controller --workers")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="nodewarm-bench-") as tmp:
        for n in args.nodes:
            r = run_one(n, Path(tmp), args.threads, args.workers)
            results.append(r)
            lat, w = r["warm_to_untaint_s"], r["writes_per_node"]
            print(f"N={n}: untainted {r['untainted']}/{n} | Warm->untaint p50 {lat['p50']} s, p99 {lat['p99']} s "
                  f"(target p99 <= 1 s) | writes/node: {w['object_writes']} object + {w['events']} events = "
                  f"{w['total']} (target <= 2) | controller RSS {r['controller_rss_mb']} MB, peak "
                  f"{r['controller_peak_rss_mb']} MB (target <= 150 MB) | scale-up burst {r['scale_up_burst_s']} s, "
                  f"Warm reports sent in {r['warm_reports_s']} s", flush=True)
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"controller-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps({"results": results, "cpus": os.cpu_count()}, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
