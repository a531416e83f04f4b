"""Benchmark: how the verified pull scales with workers, and what one core costs per GB: the inputs of the
projection in docs/agent.md ("The pull at fleet scale") for a p5.48xlarge.

    .venv/bin/python bench/scaling.py [--shape 16x256] [--workers 1,2,4,8,16] [--processes 1,2,4]
                                      [--workdir /dev/shm] [--out PATH]

One local S3 server (SeaweedFS, objects uploaded with boto3's defaults: CRC32 composite checksums) serves the
model; the pull runs end to end (list, HEAD, GET, verify, fsync, rename) at each worker count in one
process (threads: ``--concurrency``), then as K processes each pulling a disjoint share of the files into its
own directory (``nodewarm bootstrap weights --exclude`` of the other shares), which no GIL limits. Each row:
MB/s and CPU-seconds per GB of the clients (the server's CPU is not counted). Then the per-core costs one
pulled GB pays (single thread, no server): CRC32 (zlib-ng), CRC32C and CRC64NVME (awscrt), MD5, a memory
copy, pwrite into the workdir, and a loopback TCP recv_into, each in CPU-s per GB.

The server shares the machine's cores with the client: on a machine with few cores the curve flattens where
the server does, not where the client would. The 16-core device script (bench/scaling_device.sh) runs this
with the server pinned to its own cores.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from weights import BUCKET, PREFIX, REPO, lay_model  # noqa: E402

MiB = 1024 * 1024
GB = 1e9


def _cpu_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def pull_threads(dest: Path, workers: int) -> dict:
    from nodewarm.bootstrap.weights import WeightsConfig, warm_weights
    from nodewarm.bootstrap.weights.capacity import Headroom

    s = warm_weights(WeightsConfig(uri=f"s3://{BUCKET}/{PREFIX}", dest=dest, allow_non_nvme=True, load_check=False,
                                   headroom=Headroom(0, 0), progress_interval_s=600,
                                   pull_overrides={"concurrency": workers}))
    return {"pull": s.pull, "verified": s.verified}


def pull_processes(dest: Path, procs: int, names: list[str], env: dict) -> dict:
    """K CLI processes, each excluding every file but its share (round-robin by name)."""
    shares = [names[i::procs] for i in range(procs)]
    running = []
    for i, share in enumerate(shares):
        excluded = [n for n in names if n not in share]
        argv = [sys.executable, "-m", "nodewarm.cli", "--log-level", "WARNING", "bootstrap", "weights",
                "--uri", f"s3://{BUCKET}/{PREFIX}", "--dest", str(dest / f"p{i}"), "--allow-non-nvme",
                "--skip-load-check", "--headroom-gib", "0", *[a for n in excluded for a in ("--exclude", n)]]
        running.append(subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True))
    for p in running:
        _, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"a pull process failed (exit {p.returncode}): {err.strip()[-500:]}")
    return {"shares": [len(s) for s in shares]}


def measure(run, work: Path, total: int) -> dict:
    dest = work / "dest"
    dest.mkdir()
    os.sync()
    try:
        cpu0, start = _cpu_s(), time.monotonic()
        info = run(dest) or {}
        wall = time.monotonic() - start
        cpu = _cpu_s() - cpu0
        got = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and ".nodewarm" not in p.parts)
        if got < total:
            raise RuntimeError(f"only {got} of {total} bytes arrived")
        return {"seconds": round(wall, 3), "mb_s": round(total / wall / 1e6, 1),
                "cpu_s_per_gb": round(cpu / (total / GB), 3), **info}
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def _rate(fn, nbytes: int) -> float:
    """CPU seconds per GB of ``fn()`` over ``nbytes`` (thread CPU time: this thread only)."""
    fn()  # warm: first-touch page faults and lazy imports are not the steady cost
    t = time.thread_time()
    fn()
    return round((time.thread_time() - t) / (nbytes / GB), 4)


def per_core_costs(workdir: Path) -> dict:
    """What one pulled GB costs one core, piece by piece (CPU-s per GB; 1 / value = GB/s per core)."""
    from awscrt import checksums
    from zlib_ng import zlib_ng

    size = 256 * MiB
    data = memoryview(bytearray(os.urandom(MiB) * (size // MiB)))
    chunk = 4 * MiB
    out = bytearray(size)
    out_addr = ctypes.addressof((ctypes.c_char * size).from_buffer(out))
    data_addr = ctypes.addressof((ctypes.c_char * size).from_buffer(data))
    costs = {
        "crc32_zlib_ng": _rate(lambda: zlib_ng.crc32(data), size),
        "crc32c_awscrt": _rate(lambda: checksums.crc32c(data), size),
        "crc64nvme_awscrt": _rate(lambda: checksums.crc64nvme(data), size),
        "md5_hashlib": _rate(lambda: hashlib.md5(data).digest(), size),
        # ctypes.memmove: a bytearray slice assignment from a memoryview copies twice (through a temporary).
        "memcpy": _rate(lambda: ctypes.memmove(out_addr, data_addr, size), size),
    }
    path = workdir / "pwrite.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        def pwrite():
            for off in range(0, size, chunk):
                os.pwrite(fd, data[off:off + chunk], off)
        costs["pwrite_4mib"] = _rate(pwrite, size)
    finally:
        os.close(fd)
        path.unlink()
    costs["recv_into_4mib_loopback"] = _recv_cost(4 * size)
    return costs


def _recv_cost(nbytes: int) -> float:
    """CPU-s per GB of the receiving side of a loopback TCP stream read with recv_into into a 4 MiB buffer
    (the pull's transport), the sender on another thread."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    block = os.urandom(MiB)

    def send():
        c, _ = srv.accept()
        with c:
            for _ in range(nbytes // MiB):
                c.sendall(block)

    def once() -> None:
        t = threading.Thread(target=send)
        t.start()
        with socket.create_connection(("127.0.0.1", port)) as s:
            buf = memoryview(bytearray(4 * MiB))
            got = 0
            while got < nbytes:
                n = s.recv_into(buf)
                if not n:
                    break
                got += n
        t.join()

    try:
        return _rate(once, nbytes)
    finally:
        srv.close()


def _cpu_list(spec: str) -> set[int]:
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="16x256", help="FILESxMiB of the model (default 16x256: 4 GiB)")
    ap.add_argument("--workers", default="1,2,4,8,16", help="thread counts of one pull (default 1,2,4,8,16)")
    ap.add_argument("--processes", default="1,2,4", help="process counts, files split between them (default 1,2,4)")
    ap.add_argument("--workdir", type=Path, default=None, help="server data and the pulled copies (default: temp)")
    ap.add_argument("--out", type=Path, default=None, help="JSON results (default bench/results/scaling-<ts>.json)")
    ap.add_argument("--client-cpus", default=None, metavar="LIST",
                    help="pin the pulls to these CPUs (taskset list, e.g. 0-7); default: all")
    ap.add_argument("--server-cpus", default=None, metavar="LIST",
                    help="pin the S3 server (all its threads) to these CPUs, e.g. 8-15; default: all")
    args = ap.parse_args()
    if args.client_cpus:
        os.sched_setaffinity(0, _cpu_list(args.client_cpus))  # threads and processes started later inherit it

    from nodewarm import logs
    from nodewarm_dev.testenv import s3server

    logs.setup("WARNING")
    files, _, mib = args.shape.partition("x")
    work = Path(tempfile.mkdtemp(prefix="nodewarm-scaling-", dir=args.workdir))
    doc: dict = {"shape": args.shape, "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "threads": {},
                 "processes": {}}
    server = s3server.start("seaweedfs", work / "data")
    if args.server_cpus:
        subprocess.run(["taskset", "-a", "-cp", args.server_cpus, str(server._proc.pid)], check=True,
                       stdout=subprocess.DEVNULL)
    doc.update(client_cpus=args.client_cpus, server_cpus=args.server_cpus)
    try:
        objects = lay_model(work / "staging", int(files), int(mib))
        server.upload_tree(work / "staging", BUCKET)
        total = sum(size for _, size in objects)
        names = [Path(k).name for k, _ in objects]
        env = server.env()
        os.environ.update(env)
        measure(lambda d: pull_threads(d, 8), work, total)  # untimed: warms the server's caches
        for n in [int(x) for x in args.workers.split(",")]:
            doc["threads"][n] = measure(lambda d: pull_threads(d, n), work, total)
            print(f"threads   {n:3d}: {json.dumps(doc['threads'][n])}", flush=True)
        for k in [int(x) for x in args.processes.split(",")]:
            doc["processes"][k] = measure(lambda d: pull_processes(d, k, names, env), work, total)
            print(f"processes {k:3d}: {json.dumps(doc['processes'][k])}", flush=True)
    finally:
        server.stop()
    doc["per_core_cpu_s_per_gb"] = per_core_costs(work)
    shutil.rmtree(work, ignore_errors=True)
    print("per-core CPU-s/GB:", json.dumps(doc["per_core_cpu_s_per_gb"]))
    doc["load_avg_end"] = os.getloadavg()
    out = args.out or REPO / "bench/results" / f"scaling-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
