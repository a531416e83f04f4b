"""Benchmark: N nodes scaling up together, with peers before S3 against today's pull, in one run on loopback.

    .venv/bin/python bench/peers.py [--nodes 1,4,8] [--model-mib 256] [--files 4] [--s3-mbps 60] [--out PATH]

The model (FILES safetensors-sized objects) sits in a local S3 server (rclone) behind the fault proxy, which caps
everything S3 sends, all nodes together, to --s3-mbps: a stand-in for an S3 prefix's request rate or a VPC
endpoint, the limit a fleet meets before its NICs. For each N, N agent processes (one per "node", each on its own
loopback address 127.0.0.<i>) start together, first pulling as today (S3 only), then with peers: each serves what it
holds (peers/serve.py) and reads from the others first (peers/fetch.py), every byte verified against S3's checksums
either way. A node keeps serving until every node is done, as a warm node's agent does.

Per N and mode it prints and writes (bench/results/peers-<time>.json): the bytes S3 sent (the proxy's count) as a
multiple of the model's size, the seconds until the last node was done, and for peers the serving side's CPU per GB
(the peer servers' request threads' CPU time over the bytes they served). Discovery is the directory a node would
build from the Nodes' annotations, given here up front (tests/bootstrap/peers/test_peering.py covers the API side). All
processes share this machine's cores: compare numbers within one run only; never read them as a node's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUCKET, PREFIX = "bench-peers", "models/m/"
MiB = 1024 * 1024


def lay_model(data: Path, files: int, model_mib: int) -> int:
    root = data / BUCKET / PREFIX
    root.mkdir(parents=True)
    per = model_mib * MiB // files
    for i in range(files):
        with open(root / f"model-{i + 1:05d}-of-{files:05d}.safetensors", "wb") as f:
            for _ in range(per // MiB):
                f.write(os.urandom(MiB))
    (root / "config.json").write_text('{"model_type": "llama"}')
    return per * files + len('{"model_type": "llama"}')


def node_main(spec_path: str) -> None:
    """One node: wait for the common start, pull (with or without peers), keep serving until all are done."""
    from nodewarm.bootstrap.weights import WeightsConfig, warm_weights
    from nodewarm.bootstrap.weights.capacity import Headroom
    from nodewarm.bootstrap.peers.auth import PeerKeys
    from nodewarm.bootstrap.peers.fetch import Peer, PeerSource
    from nodewarm.bootstrap.peers.holdings import Holdings
    from nodewarm.bootstrap.peers.serve import PeerServer

    spec = json.loads(Path(spec_path).read_text())
    os.environ.update(spec["env"])
    dest, run = Path(spec["dest"]), Path(spec["run_dir"])
    keys = PeerKeys(bytes.fromhex(spec["key"]))
    server = source = holdings = None
    if spec["peers"]:
        holdings = Holdings(dest)
        server = PeerServer(spec["host"], spec["port"], holdings, lambda: keys, 8, 1e9).start()
        others = [Peer(p["name"], p["host"], p["port"], "pulling") for p in spec["others"]]
        source = PeerSource(spec["name"], lambda: others, lambda: keys)
    (run / f"{spec['name']}.ready").touch()
    while not (run / "go").exists():
        time.sleep(0.01)
    start = time.time()
    summary = warm_weights(WeightsConfig(uri=f"s3://{BUCKET}/{PREFIX}", dest=dest, allow_non_nvme=True,
                                         load_check=False, headroom=Headroom(0, 0), progress_interval_s=3600,
                                         peers=source, holdings=holdings))
    done = time.time()
    (run / f"{spec['name']}.done").touch()
    if server is not None:  # a warm node goes on serving the others
        while len(list(run.glob("*.done"))) < spec["n"]:
            time.sleep(0.05)
        server.stop()
    out = {"ok": summary.ok, "reason": summary.reason, "start": start, "done": done, "peers": summary.peers,
           "serve": server.stats() if server is not None else None}
    (run / f"{spec['name']}.json").write_text(json.dumps(out))


def run_fleet(work: Path, server, proxy, n: int, peers: bool, base_port: int) -> dict:
    run = work / f"run-{n}-{'peers' if peers else 's3'}"
    run.mkdir()
    env = {**server.env(), "AWS_ENDPOINT_URL": proxy.endpoint}
    nodes = [{"name": f"node-{i}", "host": f"127.0.0.{i + 2}", "port": base_port} for i in range(n)]
    key = os.urandom(32).hex()
    procs = []
    for node in nodes:
        spec = {**node, "n": n, "peers": peers, "env": env, "key": key, "dest": str(run / node["name"]),
                "run_dir": str(run), "others": [o for o in nodes if o is not node]}
        path = run / f"{node['name']}.spec.json"
        path.write_text(json.dumps(spec))
        procs.append(subprocess.Popen([sys.executable, __file__, "--node", str(path)]))
    while len(list(run.glob("*.ready"))) < n:
        if any(p.poll() not in (None, 0) for p in procs):
            raise SystemExit("a node process failed before the start")
        time.sleep(0.05)
    proxy.reset_counters()
    (run / "go").touch()
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise SystemExit(f"a node process exited {p.returncode}")
    results = [json.loads((run / f"{node['name']}.json").read_text()) for node in nodes]
    if not all(r["ok"] for r in results):
        raise SystemExit(f"a pull failed: {[r['reason'] for r in results]}")
    out = {"s3_bytes": proxy.body_bytes, "seconds": round(max(r["done"] for r in results) -
                                                         min(r["start"] for r in results), 2)}
    if peers:
        served = sum(r["serve"]["bytes_served"] for r in results)
        cpu = sum(r["serve"]["cpu_s"] for r in results)
        out.update(peer_bytes=served, serve_cpu_s=round(cpu, 2),
                   serve_cpu_s_per_gb=round(cpu / (served / 1e9), 3) if served else None,
                   dropped=sorted({d for r in results for d in (r["peers"] or {}).get("dropped", {})}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1,4,8", help="fleet sizes, comma-separated (default 1,4,8)")
    ap.add_argument("--model-mib", type=int, default=256, help="model size in MiB (default 256)")
    ap.add_argument("--files", type=int, default=4, help="safetensors files the model is split into (default 4)")
    ap.add_argument("--s3-mbps", type=float, default=60.0,
                    help="what S3 sends to all nodes together, MB/s (default 60: the proxy's cap)")
    ap.add_argument("--workdir", default=None, help="where the model and the nodes' copies go (default: /tmp)")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/peers-<time>.json)")
    ap.add_argument("--node", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.node:
        return node_main(args.node)

    from nodewarm_dev.testenv import ports, s3server
    from nodewarm_dev.testenv.faultproxy import FaultProxy

    work = Path(tempfile.mkdtemp(prefix="nodewarm-bench-peers-", dir=args.workdir))
    size = lay_model(work / "data", args.files, args.model_mib)
    server = s3server.start("rclone", work / "data", dir_cache_time="1000h")
    proxy = FaultProxy(server.endpoint, cap_bps=args.s3_mbps * 1e6)
    results = {"model_bytes": size, "files": args.files, "s3_cap_mbps": args.s3_mbps, "cpus": os.cpu_count(),
               "fleets": {}}
    try:
        for n in [int(x) for x in args.nodes.split(",")]:
            row = {}
            for peers in (False, True):
                row["peers" if peers else "s3"] = run_fleet(work, server, proxy, n, peers, ports.free_port())
            s3, pr = row["s3"], row["peers"]
            row["ratios"] = {"s3_bytes_per_model": {"s3": round(s3["s3_bytes"] / size, 2),
                                                    "peers": round(pr["s3_bytes"] / size, 2)},
                             "time_peers_over_s3": round(pr["seconds"] / s3["seconds"], 2)}
            results["fleets"][str(n)] = row
            print(f"{n} node(s): S3 sent {s3['s3_bytes'] / size:.2f}x the model today, {pr['s3_bytes'] / size:.2f}x "
                  f"with peers; all done in {s3['seconds']:.1f} s today, {pr['seconds']:.1f} s with peers "
                  f"(x{row['ratios']['time_peers_over_s3']}); serving CPU {pr['serve_cpu_s_per_gb']} s/GB; "
                  f"dropped peers: {pr['dropped'] or 'none'}", flush=True)
    finally:
        proxy.stop()
        server.stop()
    out = Path(args.out) if args.out else Path(__file__).parent / "results" / f"peers-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
