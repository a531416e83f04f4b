#!/usr/bin/env python
"""Benchmark: AL2023 unit start -> the agent's main running, through the real launcher and artifact.

    .venv/bin/python bench/launch.py [--rounds 3] [--engine rclone] [--out FILE]

Builds the artifact (`nodewarm package`) from this environment, uploads it to a real local S3 server and
runs the rendered `nodewarm-launch` exactly as the systemd unit does, with `--version` as the command: the
agent's main prints it once the whole CLI is imported and its parser built, the point where `bootstrap run`
starts its first step. Each time is from spawning the launcher (its first line stamps
NODEWARM_LAUNCH_STARTED) to that line arriving on the pipe, median of --rounds:

  fresh    a new node: fetch with `aws s3 cp`, sha256, unpack, first start (Python compiles and writes the
           .pyc files of everything it imports, as the artifact ships none)
  cached   a restart of the unit: the artifact is unpacked and its .pyc files were written by a first start
  first    bin/nodewarm of a freshly unpacked artifact, run directly: fresh minus first is fetch + unpack

Prints seconds and ratios and writes JSON to bench/results/ (gitignored). Client, S3 server and the agent
share this machine's cores: compare numbers from one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from nodewarm import __version__, logs
from nodewarm_dev.testenv import s3server
from nodewarm.userdata.al2023 import render_script
from nodewarm.userdata.launch import BootstrapLaunch
from nodewarm.userdata.package import build

REPO = Path(__file__).resolve().parents[1]
BUCKET = "bench-launch"


def launch_script(uri: str, sha256: str) -> str:
    """nodewarm-launch as the rendered user data writes it to /opt/nodewarm/bin."""
    launch = BootstrapLaunch(artifact_uri=uri, artifact_sha256=sha256, profile="p", cache_mount="/mnt/k8s-disks/0")
    match = re.search(r"^cat > /opt/nodewarm/bin/nodewarm-launch <<'NODEWARM_EOF'\n(.*?)\nNODEWARM_EOF$",
                      render_script(launch), re.S | re.M)
    return match.group(1) + "\n"


def until_version(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from spawning ``argv`` to the agent's version line arriving."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    seconds = time.monotonic() - start
    _, err = proc.communicate(timeout=300)
    if proc.returncode != 0 or line.strip() != f"nodewarm {__version__}":
        raise SystemExit(f"{argv[0]} failed (exit {proc.returncode}): {line}{err[-3000:]}")
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engine", choices=("rclone", "seaweedfs"), default="rclone")
    ap.add_argument("--out", type=Path, help="JSON report (default bench/results/launch-<UTC time>.json)")
    args = ap.parse_args()
    logs.setup("WARNING")        # nodewarm package warns when the artifact needs a newer glibc than AL2023's
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = args.out or REPO / "bench" / "results" / f"launch-{stamp}.json"
    aws = shutil.which("aws")
    if aws is None:
        raise SystemExit("the aws CLI is not on PATH; the launcher fetches with `aws s3 cp`")

    with tempfile.TemporaryDirectory(prefix="nodewarm-bench-launch-") as tmp:
        work = Path(tmp)
        artifact = build(work / "dist")
        server = s3server.start(args.engine, work / "s3")
        try:
            server.create_bucket(BUCKET)
            key = f"nodewarm/{artifact.path.name}"
            server.client().upload_file(str(artifact.path), BUCKET, key)
            uri = f"s3://{BUCKET}/{key}"
            script = work / "nodewarm-launch"
            script.write_text(launch_script(uri, artifact.sha256))
            root = work / "opt"
            env = {**os.environ, **server.env(), "NODEWARM_ROOT": str(root),
                   "NODEWARM_STATE_DIR": str(work / "state"), "NODEWARM_ARTIFACT_URI": uri,
                   "NODEWARM_ARTIFACT_SHA256": artifact.sha256}
            launcher = ["bash", str(script), "--version"]

            fresh, first, cached = [], [], []
            for i in range(args.rounds):
                shutil.rmtree(root, ignore_errors=True)
                fresh.append(until_version(launcher, env))
                unpacked = work / f"unpacked-{i}"
                with tarfile.open(artifact.path) as tar:
                    tar.extractall(unpacked, filter="data")
                first.append(until_version([str(unpacked / "bin/nodewarm"), "--version"], env))
            for _ in range(args.rounds):
                cached.append(until_version(launcher, env))
        finally:
            server.stop()

    result = {
        "artifact": {"size": artifact.size, "sha256": artifact.sha256, "python": artifact.python,
                     "glibc": artifact.glibc},
        "aws_cli": aws, "engine": args.engine, "rounds": args.rounds, "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "seconds": {"fresh": fresh, "first_start": first, "cached": cached},
        "median_s": {"fresh": statistics.median(fresh), "first_start": statistics.median(first),
                     "cached": statistics.median(cached),
                     "fetch_and_unpack": statistics.median(fresh) - statistics.median(first)},
    }
    m = result["median_s"]
    print(f"artifact {artifact.size / 1e6:.1f} MB, glibc >= {artifact.glibc}, aws CLI {aws}, "
          f"median of {args.rounds} (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    print(f"launcher start -> agent main, fresh node (fetch + unpack + first start): {m['fresh']:.2f} s")
    print(f"  of which first start of an unpacked artifact (.pyc written):          {m['first_start']:.2f} s")
    print(f"  of which fetch + sha256 + unpack:                                      {m['fetch_and_unpack']:.2f} s")
    print(f"launcher start -> agent main, unit restart (cached artifact):          {m['cached']:.2f} s "
          f"({m['cached'] / m['fresh']:.2f}x fresh)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
