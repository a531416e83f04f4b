"""Benchmark: nodewarm's verified weight pull against peer S3 clients and raw HTTP, on one local S3 server.

    .venv/bin/python bench/weights.py [--shapes 4x256,1x1024,64x16] [--engine seaweedfs] [--workdir DIR] [--out PATH]

For each shape (FILES x MiB "safetensors" + small JSON) the model is put into a local S3 server, then,
in one run, each client downloads the same bytes into a fresh directory: MB/s, CPU-seconds per GB
(the client's own process and children; the server's CPU is not counted) and the ratios to the best
peer and to raw HTTP (curl of presigned URLs, one connection per file) are printed and written to
bench/results/ (gitignored) as JSON. Client and server share this machine's cores: compare numbers
from the same run only.

Objects as real uploaders make them: with the default engine (SeaweedFS) they are uploaded by boto3's
upload_file with its defaults (multipart, CRC32 composite checksums, "-N" ETags), as a model pushed
with the aws CLI or boto3 is; nodewarm verifies every file against them. ``--engine rclone`` serves
files laid on disk instead: single-part MD5 ETags, the worst case for verification (one MD5 stream per
file, ~600 MB/s per core here). The awscrt client runs with response checksum validation on (it can
check full-object checksums only); the other peers verify nothing.

Two nodewarm rows: ``nodewarm`` runs warm_weights in this process (its imports paid once, like the peers'
in-process clients), ``nodewarm-cli`` runs `nodewarm bootstrap weights` as a fresh process, as a node does.
The latter also gives the start-up: process start -> warm_weights -> the first GET of model bytes. With the
local kube-apiserver built (testenv), the same is timed for `nodewarm bootstrap run --once` (the node agent:
it reads its WarmProfile as the node before it pulls), once per bench run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024
BUCKET = "bench"
PREFIX = "model/"


def lay_model(data_dir: Path, files: int, file_mib: int) -> list[tuple[str, int]]:
    model = data_dir / BUCKET / PREFIX
    model.mkdir(parents=True, exist_ok=True)
    chunk = os.urandom(MiB)
    objects = []
    for i in range(files):
        name = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        with open(model / name, "wb") as f:
            for j in range(file_mib):
                # Distinct MiBs (so no layer can dedupe) without paying urandom for every byte.
                f.write(j.to_bytes(8, "little") + i.to_bytes(8, "little") + chunk[16:])
        objects.append((PREFIX + name, file_mib * MiB))
    for name, text in (("config.json", '{"architectures": ["Bench"]}'), ("tokenizer.json", "{}"),
                       ("model.safetensors.index.json", "{}")):
        (model / name).write_text(text)
        objects.append((PREFIX + name, len(text)))
    return objects


def start_rclone(data_dir: Path):
    """rclone like testenv's, but with a long directory cache.

    testenv's 1 s cache suits fixtures copied in during tests, but when it expires rclone re-hashes the
    whole file for the ETag of the next GET, so every ranged-GET client (nodewarm, boto3, CRT) pays an
    MD5 of the file per request while curl's one GET per file does not. The files exist before start.
    """
    from nodewarm_dev.testenv import ports, s3server

    port = ports.free_port()
    cmd = [s3server._binary("rclone"), "serve", "s3", "--addr", f"127.0.0.1:{port}",
           "--auth-key", f"{s3server.ACCESS_KEY},{s3server.SECRET_KEY}", "--no-checksum",
           "--dir-cache-time", "1000h", "--config", "/dev/null", str(data_dir)]
    log = open(data_dir.parent / "rclone.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = s3server.S3Server("rclone", f"http://127.0.0.1:{port}", data_dir, _proc=proc)
    ports.wait_until(lambda: server.client().list_buckets() is not None, 30, "rclone", proc)
    return server


def run_nodewarm(dest: Path, env: dict) -> dict:
    from nodewarm.bootstrap.weights.capacity import Headroom
    from nodewarm.bootstrap.weights import WeightsConfig, warm_weights

    os.environ.update(env)
    summary = warm_weights(WeightsConfig(uri=f"s3://{BUCKET}/{PREFIX}", dest=dest, allow_non_nvme=True,
                                         load_check=False, headroom=Headroom(0, 0), progress_interval_s=60))
    return {"seconds": summary.seconds, "download_s": summary.phases["download"], "pull": summary.pull,
            "verified": summary.verified, "fsync_s": summary.fsync_s, "verify_s": summary.verify_s,
            "note": "end to end: list + HEAD of every object, download, fsync and verification of every file"}


def _nodewarm_bin() -> str:
    """The console script a node runs (``nodewarm ...``), beside this Python."""
    local = Path(sys.executable).parent / "nodewarm"
    return str(local) if local.exists() else shutil.which("nodewarm") or "nodewarm"


def run_nodewarm_cli(dest: Path, env: dict) -> dict:
    """`nodewarm bootstrap weights` as a fresh process: what a node pays, imports and all."""
    started = time.time()
    p = subprocess.run([_nodewarm_bin(), "--log-level", "WARNING", "bootstrap", "weights", "--uri",
                        f"s3://{BUCKET}/{PREFIX}", "--dest", str(dest), "--allow-non-nvme", "--skip-load-check",
                        "--headroom-gib", "0", "--json"], env={**os.environ, **env}, capture_output=True, text=True,
                       check=True)
    s = json.loads(p.stdout)
    return {"startup": _startup(started, s), "download_s": s["phases"]["download"],
            "note": "a fresh process: interpreter start, imports, then as nodewarm"}


def _startup(spawned: float, summary: dict) -> dict:
    """Seconds from the process's start to warm_weights (interpreter, imports, argument parsing; the agent
    also reads its profile) and to the first GET of model bytes (plus storage check, listing, first HEAD)."""
    return {"to_weights_s": round(summary["started_at"] - spawned, 3),
            "to_first_get_s": round(summary["first_request_at"] - spawned, 3)}


def _agent_run(work: Path, server, kubeconfig: Path, node: str, profile: str, env: dict) -> dict:
    """One `bootstrap run --once` on a fresh mount, stopped once its weights are in: its start-up."""
    mount = work / "nvme"
    shutil.rmtree(mount, ignore_errors=True)
    mount.mkdir()
    os.sync()
    spawned = time.time()
    agent = subprocess.Popen([_nodewarm_bin(), "--log-level", "WARNING", "bootstrap", "run", "--profile", profile,
                              "--mount", str(mount), "--node-name", node, "--kubeconfig", str(kubeconfig),
                              "--skip-load-check", "--once", "--state-dir", str(work / "agent-state")],
                             env={**os.environ, **server.env(), **env}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (found := list(mount.rglob(".nodewarm/summary.json"))):
            if agent.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the agent wrote no weights summary (exit {agent.returncode})")
            time.sleep(0.05)
    finally:
        agent.terminate()
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)  # its own session: only the agent and its children
            agent.wait()
    summary = json.loads(found[0].read_text())
    if not summary["ok"]:
        raise RuntimeError(f"the agent's pull failed: {summary['reason']}: {summary['message']}")
    return _startup(spawned, summary)


# What a fresh process costs here before any of nodewarm runs, timed like the agent (spawn -> the moment named),
# alternated with its rounds: the floor under its start-up. Any pull through botocore pays the S3 client's.
STARTUP_FLOORS = {
    "interpreter": "import time; print(time.time())",
    "botocore_s3_client": "import botocore.session, time; botocore.session.get_session().create_client('s3'); "
                          "print(time.time())",
    "jsonschema_import": "import jsonschema, time; print(time.time())",
}


def _floor_run(code: str, env: dict) -> float:
    spawned = time.time()
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True).stdout
    return round(float(out.split()[-1]) - spawned, 3)


def agent_startup(server, work: Path, rounds: int, baseline_src: Path | None = None) -> dict:
    """`nodewarm bootstrap run --once` as a node starts it, against a local kube-apiserver (testenv): the node's
    own kubelet identity reads the WarmProfile, then the pull. Timed from the process's start to the first
    GET of model bytes; the agent is stopped once the weights are in (its compile-cache and GPU waits are not
    start-up). With ``baseline_src`` (another checkout's src/, e.g. `git worktree add /tmp/before HEAD~3`) each
    round also runs that code's agent (same interpreter and venv, PYTHONPATH first), alternated with this one.
    Each round also times STARTUP_FLOORS, so the agent's figure sits beside what it cannot go below here."""
    import yaml
    from kubernetes import client as k8s

    from nodewarm.kubeapply import apply
    from nodewarm.nodeclasses import agentaccess
    from nodewarm_dev.testenv import kube as kubeenv
    from nodewarm_dev.testenv.crds import all_crds

    node, name = "bench-node", "bench"
    cluster = kubeenv.start(work / "kube", node_names=(node,))
    try:
        cluster.apply_crds(all_crds())
        admin = cluster.api_client()
        apply(admin, agentaccess.node_rbac())
        doc = yaml.safe_load((REPO / "examples/karpenter-al2023.yaml").read_text())
        doc["metadata"]["name"] = name
        doc["spec"]["model"]["uri"] = f"s3://{BUCKET}/{PREFIX}"
        doc["spec"]["nodes"]["region"] = server.region
        doc["spec"]["bootstrap"]["allowNonNvme"] = True
        apply(admin, [doc])
        k8s.CoreV1Api(admin).create_node({"metadata": {"name": node}, "spec": {"taints": [
            {"key": doc["spec"]["readiness"]["taintKey"], "effect": "NoSchedule"}]}})
        kubeconfig = cluster.write_kubeconfig(work / "kubeconfig-node", cluster.node_token(node), f"system:node:{node}")
        variants = {"this": {}, **({"baseline": {"PYTHONPATH": str(baseline_src)}} if baseline_src else {})}
        runs: dict[str, list] = {v: [] for v in variants}
        floors: dict[str, list] = {f: [] for f in STARTUP_FLOORS}
        order = list(variants)
        for round_ in range(rounds):
            for variant in order[round_ % len(order):] + order[:round_ % len(order)]:
                runs[variant].append(_agent_run(work, server, kubeconfig, node, name, variants[variant]))
            for floor, code in STARTUP_FLOORS.items():
                floors[floor].append(_floor_run(code, server.env()))
        out = {"runs": runs["this"],
               **{k: round(statistics.median(r[k] for r in runs["this"]), 3) for k in runs["this"][0]}}
        out["floors"] = {f: {"median_s": round(statistics.median(t), 3), "runs": t} for f, t in floors.items()}
        out["above_s3_client_floor_s"] = round(out["to_first_get_s"] - out["floors"]["botocore_s3_client"]["median_s"],
                                               3)
        if baseline_src:
            out["baseline"] = {"src": str(baseline_src), "runs": runs["baseline"],
                               **{k: round(statistics.median(r[k] for r in runs["baseline"]), 3) for k in runs["baseline"][0]}}
        return out
    finally:
        cluster.stop()


def run_boto3(server, dest: Path, objects, tuned: bool) -> dict:
    from boto3.s3.transfer import TransferConfig

    client = server.client(max_pool_connections=64)
    if tuned:
        # preferred_transfer_client="classic": the default ("auto") would switch to the CRT on p5 instances.
        cfg = TransferConfig(max_concurrency=32, multipart_chunksize=16 * MiB, multipart_threshold=16 * MiB,
                             preferred_transfer_client="classic")
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda o: client.download_file(BUCKET, o[0], str(dest / Path(o[0]).name), Config=cfg),
                          objects))
    else:
        for key, _ in objects:
            client.download_file(BUCKET, key, str(dest / Path(key).name))
    return {"config": "4 files in parallel, max_concurrency=32, 16 MiB chunks" if tuned else "defaults, files in turn"}


def run_crt(server, dest: Path, objects) -> dict:
    """The awscrt S3 client directly (boto3's own CRT path insists on TLS: docs/testing.md, "The local S3 servers")."""
    from awscrt.auth import AwsCredentialsProvider
    from awscrt.http import HttpHeaders, HttpRequest
    from awscrt.io import ClientBootstrap, DefaultHostResolver, EventLoopGroup
    from awscrt.s3 import S3Client, S3RequestTlsMode, S3RequestType

    elg = EventLoopGroup()
    bootstrap = ClientBootstrap(elg, DefaultHostResolver(elg))
    from awscrt.s3 import S3ChecksumConfig

    client = S3Client(bootstrap=bootstrap, region=server.region, tls_mode=S3RequestTlsMode.DISABLED,
                      credential_provider=AwsCredentialsProvider.new_static(server.access_key, server.secret_key),
                      part_size=8 * MiB, throughput_target_gbps=100)
    host = urlparse(server.endpoint).netloc
    requests = []
    for key, _ in objects:
        req = HttpRequest("GET", f"/{BUCKET}/{key}", HttpHeaders([("Host", host)]))
        requests.append(client.make_request(type=S3RequestType.GET_OBJECT, request=req,
                                            checksum_config=S3ChecksumConfig(validate_response=True),
                                            recv_filepath=str(dest / Path(key).name)))
    for r in requests:
        r.finished_future.result()
    return {"config": "awscrt S3Client, 8 MiB parts, throughput_target_gbps=100, validate_response=True"}


def run_aws_cli(server, dest: Path, env: dict) -> dict:
    aws = shutil.which("aws")
    if not aws:
        raise FileNotFoundError("aws CLI not installed")
    subprocess.run([aws, "s3", "cp", "--recursive", "--only-show-errors", f"s3://{BUCKET}/{PREFIX}", str(dest)],
                   env={**os.environ, **env}, check=True)
    version = subprocess.run([aws, "--version"], capture_output=True, text=True).stdout.strip() or "?"
    return {"config": version}


def run_curl(server, dest: Path, objects) -> dict:
    client = server.client(signature_version="s3v4")
    args = ["curl", "--silent", "--show-error", "--fail", "--no-progress-meter", "--parallel", "--parallel-max", str(len(objects))]
    for key, _ in objects:
        url = client.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=3600)
        args += ["-o", str(dest / Path(key).name), url]
    subprocess.run(args, check=True)
    return {"config": "one presigned GET per file, all in parallel"}


def _cpu_s() -> float:
    """CPU seconds of this process (all its threads, the CRT's native ones too) and its reaped children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measure(name: str, runner, work: Path, total: int) -> dict:
    dest = work / f"dest-{name}"
    dest.mkdir()
    # Flush earlier writes (the model itself, the previous client's copy) outside the timed region, or
    # whoever runs next waits on their writeback; nodewarm fsyncs, so it would pay the most.
    os.sync()
    try:
        cpu0, start = _cpu_s(), time.monotonic()
        info = runner(dest) or {}
        wall = time.monotonic() - start
        cpu = _cpu_s() - cpu0
        seconds = info.pop("seconds", None) or wall
        # nodewarm returns only once every file is fsynced (a node can die right after); the peers leave
        # dirty pages behind. "durable" adds the sync a peer would need to promise the same.
        synced = time.monotonic()
        os.sync()
        durable = seconds if name == "nodewarm" else seconds + (time.monotonic() - synced)
        got = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and ".nodewarm" not in p.parts)
        if got < total:
            raise RuntimeError(f"only {got} of {total} bytes arrived")
        return {"seconds": round(seconds, 3), "durable_s": round(durable, 3),
                "cpu_s_per_gb": round(cpu / (total / 1e9), 3), **info}
    except Exception as e:  # noqa: BLE001 - a missing peer client must not hide the others
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def bench_shape(args, files: int, file_mib: int) -> dict:
    from nodewarm_dev.testenv import s3server

    work = Path(tempfile.mkdtemp(prefix="nodewarm-bench-", dir=args.workdir))
    results: dict = {"files": files, "file_mib": file_mib, "engine": args.engine, "clients": {}}
    if args.engine == "rclone":
        objects = lay_model(work / "data", files, file_mib)
        server = start_rclone(work / "data")
    else:
        server = s3server.start(args.engine, work / "data")
        objects = lay_model(work / "staging", files, file_mib)
        server.upload_tree(work / "staging", BUCKET)
    try:
        head = server.client().head_object(Bucket=BUCKET, Key=objects[0][0], ChecksumMode="ENABLED")
        results["object"] = {"etag": head["ETag"], **{k: v for k, v in head.items() if k.startswith("Checksum")}}
        for key, _ in objects:
            server.client().head_object(Bucket=BUCKET, Key=key)  # rclone hashes a file on first access
        total = sum(size for _, size in objects)
        results["bytes"] = total
        env = server.env()
        runners = {
            "nodewarm": lambda d: run_nodewarm(d, env),
            "nodewarm-cli": lambda d: run_nodewarm_cli(d, env),
            "boto3-default": lambda d: run_boto3(server, d, objects, tuned=False),
            "boto3-tuned": lambda d: run_boto3(server, d, objects, tuned=True),
            "crt": lambda d: run_crt(server, d, objects),
            "aws-cli": lambda d: run_aws_cli(server, d, env),
            "curl": lambda d: run_curl(server, d, objects),
        }
        names = args.clients.split(",")
        runs: dict[str, list] = {n: [] for n in names}
        # An untimed pass first: whoever goes first otherwise pays for cold server caches.
        measure("warm-up", runners["curl"], work, total)
        for round_ in range(args.repeat):
            # Rotate the order each round so drift on this shared machine does not favour one client.
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                runs[name].append(measure(name, runners[name], work, total))
                print(f"{files}x{file_mib}MiB round {round_ + 1} {name:14s} {json.dumps(runs[name][-1])}", flush=True)
        for name, got in runs.items():
            ok = [r for r in got if "seconds" in r]
            if not ok:
                results["clients"][name] = got[-1]
                continue
            seconds = statistics.median(r["seconds"] for r in ok)
            durable = statistics.median(r["durable_s"] for r in ok)
            if name == "nodewarm-cli":
                results["startup"] = {k: statistics.median(r["startup"][k] for r in ok) for k in ok[0]["startup"]}
            results["clients"][name] = {"seconds": seconds, "mb_s": round(total / seconds / 1e6, 1),
                                        "durable_mb_s": round(total / durable / 1e6, 1),
                                        "cpu_s_per_gb": statistics.median(r["cpu_s_per_gb"] for r in ok),
                                        "runs_mb_s": [round(total / r["seconds"] / 1e6, 1) for r in ok],
                                        **{k: v for k, v in ok[-1].items()
                                           if k not in ("seconds", "durable_s", "cpu_s_per_gb")}}
        if args.agent_startup:
            args.agent_startup = False  # once per bench run: it starts an API server
            try:
                results["agent_startup"] = agent_startup(server, work, args.agent_rounds or args.repeat,
                                                         args.baseline_src)
            except Exception as e:  # noqa: BLE001 - no API server here must not hide the transfer figures
                results["agent_startup"] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{files}x{file_mib}MiB agent start-up {json.dumps(results['agent_startup'])}", flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    results["ratios"] = ratios(results["clients"])
    return results


def ratios(clients: dict) -> dict:
    """nodewarm against the fastest peer and raw HTTP (speed), and against the leanest peer (CPU)."""
    ok = {n: c for n, c in clients.items() if "mb_s" in c}
    if "nodewarm" not in ok:
        return {}
    nw = ok["nodewarm"]
    peers = {n: c for n, c in ok.items() if not n.startswith("nodewarm") and n != "curl"}
    out: dict = {}
    if peers:
        best = max(peers, key=lambda n: peers[n]["mb_s"])
        lean = min(peers, key=lambda n: peers[n]["cpu_s_per_gb"])
        best_durable = max(peers, key=lambda n: peers[n]["durable_mb_s"])
        out.update(best_peer=best, speed_vs_best_peer=round(nw["mb_s"] / peers[best]["mb_s"], 2),
                   durable_vs_best_peer=round(nw["mb_s"] / peers[best_durable]["durable_mb_s"], 2),
                   leanest_peer=lean, cpu_vs_leanest_peer=round(nw["cpu_s_per_gb"] / peers[lean]["cpu_s_per_gb"], 2))
    if "nodewarm-cli" in ok and peers:
        cli = ok["nodewarm-cli"]
        out["cli_speed_vs_best_peer"] = round(cli["mb_s"] / peers[best]["mb_s"], 2)
        out["cli_cpu_vs_leanest_peer"] = round(cli["cpu_s_per_gb"] / peers[lean]["cpu_s_per_gb"], 2)
        if "curl" in ok:
            out["cli_speed_vs_raw_http"] = round(cli["mb_s"] / ok["curl"]["mb_s"], 2)
    if "curl" in ok:
        out["speed_vs_raw_http"] = round(nw["mb_s"] / ok["curl"]["mb_s"], 2)
        out["durable_vs_raw_http"] = round(nw["mb_s"] / ok["curl"]["durable_mb_s"], 2)
        out["cpu_vs_raw_http"] = round(nw["cpu_s_per_gb"] / ok["curl"]["cpu_s_per_gb"], 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4x256,1x1024,64x16",
                    help="comma-separated FILESxMiB model shapes (default: 4x256,1x1024,64x16)")
    ap.add_argument("--engine", default="seaweedfs", choices=["seaweedfs", "rclone"])
    ap.add_argument("--clients", default="nodewarm,nodewarm-cli,boto3-default,boto3-tuned,crt,aws-cli,curl",
                    help="nodewarm: warm_weights in this process (imports paid once, as the peers' in-process "
                         "clients); nodewarm-cli: `nodewarm bootstrap weights` as a fresh process, which also "
                         "gives the start-up figures")
    ap.add_argument("--agent-startup", action=argparse.BooleanOptionalAction, default=True,
                    help="also time `nodewarm bootstrap run` start -> first GET against a local kube-apiserver "
                         "(testenv; skipped with an error line when it cannot start)")
    ap.add_argument("--agent-rounds", type=int, default=None, help="rounds of the agent start-up (default --repeat)")
    ap.add_argument("--baseline-src", type=Path, default=None,
                    help="also time the agent start-up of another checkout's src/ (e.g. `git worktree add /tmp/before "
                         "HEAD~3`: /tmp/before/src), alternated with this one in the same run, same API server")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where the server's data and every client's copy go (default: the temp dir). This VM's "
                         "disk, not the network, limits a durable pull here; /dev/shm stands in for a GPU node's "
                         "NVMe RAID0, whose writes are several GB/s")
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds per client; the median is reported")
    ap.add_argument("--out", type=Path, default=None, help="JSON results (default bench/results/weights-<ts>.json)")
    args = ap.parse_args()

    from nodewarm import logs

    logs.setup("WARNING")
    shapes = []
    for shape in args.shapes.split(","):
        files, _, mib = shape.partition("x")
        shapes.append((int(files), int(mib)))
    doc = {"engine": args.engine, "repeat": args.repeat, "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
           "workdir": str(args.workdir or tempfile.gettempdir()), "shapes": {}}
    for files, mib in shapes:
        doc["shapes"][f"{files}x{mib}MiB"] = bench_shape(args, files, mib)
    print(f"\n{'shape':12s} {'client':14s} {'MB/s':>8s} {'durable':>8s} {'CPU-s/GB':>9s}")
    for shape, res in doc["shapes"].items():
        for name, c in res["clients"].items():
            print(f"{shape:12s} {name:14s} {c.get('mb_s', 'error'):>8} {c.get('durable_mb_s', ''):>8} "
                  f"{c.get('cpu_s_per_gb', ''):>9}")
        print(f"{shape:12s} ratios: {json.dumps(res['ratios'])}")
        if "startup" in res:
            print(f"{shape:12s} start-up, `bootstrap weights` process start -> warm_weights / first GET: "
                  f"{res['startup']['to_weights_s']} / {res['startup']['to_first_get_s']} s")
        if "to_first_get_s" in res.get("agent_startup", {}):
            a = res["agent_startup"]
            print(f"{shape:12s} start-up, `bootstrap run` process start -> warm_weights / first GET: "
                  f"{a['to_weights_s']} / {a['to_first_get_s']} s (runs: {[r['to_first_get_s'] for r in a['runs']]})")
            floors = ", ".join(f"{f} {v['median_s']}" for f, v in a["floors"].items())
            print(f"{shape:12s} start-up floors, a fresh process here (spawn -> done, s): {floors}; the agent's first "
                  f"GET is {a['above_s3_client_floor_s']} s above botocore's S3 client alone")
            if "baseline" in a:
                b = a["baseline"]
                print(f"{shape:12s} start-up, baseline {b['src']}: {b['to_weights_s']} / {b['to_first_get_s']} s "
                      f"(runs: {[r['to_first_get_s'] for r in b['runs']]})")
    doc["load_avg_end"] = os.getloadavg()
    print(f"load average at start / end: {doc['load_avg']} / {doc['load_avg_end']}")
    out = args.out or REPO / "bench/results" / f"weights-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
