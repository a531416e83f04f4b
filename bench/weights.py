"""Benchmark: nodewarm's weight pull against peer S3 clients and raw HTTP, on one local S3 server.

    .venv/bin/python bench/weights.py [--files 4] [--file-mib 256] [--engine rclone] [--out PATH]

Lays a model-like set of files (N x M MiB "safetensors" + small JSON) into a local S3 server, then, in
one run, downloads the same bytes with each client into a fresh local directory and prints MB/s and the
ratio to nodewarm and to raw HTTP (curl of presigned URLs, one connection per file: the local limit).
Client and server share this machine's cores, so only compare numbers from the same run. Results go
to bench/results/ (gitignored) as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
    from nodewarm.testenv import ports, s3server

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
    return {"seconds": summary.phases["download"], "end_to_end_s": summary.seconds, "pull": summary.pull,
            "verified": summary.verified, "fsync_s": summary.fsync_s, "verify_s": summary.verify_s,
            "note": "download phase incl. fsync + verification of every file; end_to_end adds list/HEAD"}


def run_nodewarm_transfer_only(dest: Path, env: dict) -> dict:
    """Diagnostic, not a product mode: the same pull with fsync and verification stubbed out, to show
    what they cost on this machine (the peers do neither)."""
    from unittest import mock

    from nodewarm.bootstrap.weights import s3pull

    with mock.patch.object(s3pull, "verify_file", lambda path, obj, **kw: "none"), \
            mock.patch.object(s3pull.StreamHash, "applies", staticmethod(lambda m: False)), \
            mock.patch.object(s3pull.os, "fsync"):
        info = run_nodewarm(dest, env)
    info["note"] = "DIAGNOSTIC: no fsync, no verification"
    return info


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
    """The awscrt S3 client directly (boto3's own CRT path insists on TLS, see testenv.md)."""
    from awscrt.auth import AwsCredentialsProvider
    from awscrt.http import HttpHeaders, HttpRequest
    from awscrt.io import ClientBootstrap, DefaultHostResolver, EventLoopGroup
    from awscrt.s3 import S3Client, S3RequestTlsMode, S3RequestType

    elg = EventLoopGroup()
    bootstrap = ClientBootstrap(elg, DefaultHostResolver(elg))
    client = S3Client(bootstrap=bootstrap, region=server.region, tls_mode=S3RequestTlsMode.DISABLED,
                      credential_provider=AwsCredentialsProvider.new_static(server.access_key, server.secret_key),
                      part_size=8 * MiB, throughput_target_gbps=100)
    host = urlparse(server.endpoint).netloc
    requests = []
    for key, _ in objects:
        req = HttpRequest("GET", f"/{BUCKET}/{key}", HttpHeaders([("Host", host)]))
        requests.append(client.make_request(type=S3RequestType.GET_OBJECT, request=req,
                                            recv_filepath=str(dest / Path(key).name)))
    for r in requests:
        r.finished_future.result()
    return {"config": "awscrt S3Client, 8 MiB parts, throughput_target_gbps=100"}


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


def measure(name: str, runner, work: Path, total: int) -> dict:
    dest = work / f"dest-{name}"
    dest.mkdir()
    # Flush earlier writes (the model itself, the previous client's copy) outside the timed region, or
    # whoever runs next waits on their writeback; nodewarm fsyncs, so it would pay the most.
    os.sync()
    try:
        start = time.monotonic()
        info = runner(dest) or {}
        seconds = info.pop("seconds", None) or (time.monotonic() - start)
        got = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and ".nodewarm" not in p.parts)
        if got < total:
            raise RuntimeError(f"only {got} of {total} bytes arrived")
        return {"seconds": round(seconds, 3), **info}
    except Exception as e:  # noqa: BLE001 - a missing peer client must not hide the others
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--file-mib", type=int, default=256, help="size of each safetensors file (default 256)")
    ap.add_argument("--engine", default="rclone", choices=["rclone", "seaweedfs"])
    ap.add_argument("--clients", default="nodewarm,nodewarm-transfer-only,boto3-default,boto3-tuned,crt,aws-cli,curl")
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds per client; the median is reported")
    ap.add_argument("--out", type=Path, default=None, help="JSON results (default bench/results/weights-<ts>.json)")
    args = ap.parse_args()

    from nodewarm import logs
    from nodewarm.testenv import s3server

    logs.setup("WARNING")
    work = Path(tempfile.mkdtemp(prefix="nodewarm-bench-"))
    results: dict = {"files": args.files, "file_mib": args.file_mib, "engine": args.engine, "clients": {}}
    if args.engine == "rclone":
        objects = lay_model(work / "data", args.files, args.file_mib)
        server = start_rclone(work / "data")
    else:
        server = s3server.start(args.engine, work / "data")
        staging = work / "staging"
        objects = lay_model(staging, args.files, args.file_mib)
        server.create_bucket(BUCKET)
        for key, _ in objects:
            server.client().upload_file(str(staging / BUCKET / key), BUCKET, key)
    try:
        for key, _ in objects:
            server.client().head_object(Bucket=BUCKET, Key=key)  # rclone hashes a file on first access
        total = sum(size for _, size in objects)
        results["bytes"] = total
        env = server.env()
        runners = {
            "nodewarm": lambda d: run_nodewarm(d, env),
            "nodewarm-transfer-only": lambda d: run_nodewarm_transfer_only(d, env),
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
                print(f"round {round_ + 1} {name:22s} {json.dumps(runs[name][-1])}", flush=True)
        for name, got in runs.items():
            ok = [r for r in got if "seconds" in r]
            if not ok:
                results["clients"][name] = got[-1]
                continue
            seconds = statistics.median(r["seconds"] for r in ok)
            results["clients"][name] = {"seconds": seconds, "mb_s": round(total / seconds / 1e6, 1),
                                        "runs_mb_s": [round(total / r["seconds"] / 1e6, 1) for r in ok],
                                        **{k: v for k, v in ok[-1].items() if k != "seconds"}}
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    ok = {n: c["mb_s"] for n, c in results["clients"].items() if "mb_s" in c}
    if "nodewarm" in ok:
        peers = {n: v for n, v in ok.items() if not n.startswith("nodewarm") and n != "curl"}
        results["ratios"] = {
            "nodewarm_vs_best_peer": round(ok["nodewarm"] / max(peers.values()), 2) if peers else None,
            "best_peer": max(peers, key=peers.get) if peers else None,
            "nodewarm_vs_raw_http": round(ok["nodewarm"] / ok["curl"], 2) if "curl" in ok else None,
            **{f"nodewarm_vs_{n}": round(ok["nodewarm"] / v, 2) for n, v in ok.items() if n != "nodewarm"},
        }
        print(json.dumps({n: c.get("mb_s", c.get("error")) for n, c in results["clients"].items()}, indent=1))
        print(json.dumps(results["ratios"], indent=1))
    out = args.out or REPO / "bench/results" / f"weights-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
