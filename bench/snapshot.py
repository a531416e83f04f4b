#!/usr/bin/env python
"""Benchmark: an engine snapshot's restore against a warm-cache boot of the same vLLM serving container, side by
side on one real node (docs/snapshots.md).

One real node (kubelet v1.20.2, containerd, runc: nodewarm_dev.testenv.realnode) with nodewarm's snapshot handler as
a second runtime handler and its RuntimeClass, CRIU as setup builds it, the serving image of this checkout (vLLM's
CPU build with nodewarm, scripts/build-images.sh) pulled from a registry on 127.0.0.1, the tiny Llama and vLLM's
compile caches on hostPaths. Every pod is the same container: the serving image running vLLM's OpenAI server on
the tiny model, runAsUser 0, the snapshot RuntimeClass, the seccomp profile refusing io_uring and the engine's
loopback environment (nodewarm.api.snapshot), restartPolicy Never.

  fill         a first boot: pulls the image and fills the compile caches (reported, not in the medians)
  then per round, alternating:
  boot-N       the handler finds no snapshot of this round's container (the round is in its environment, which
               the snapshot key holds), so it boots: vLLM on warm compile caches. Pod create -> Running ->
               /health -> first completion; vLLM's own engine init time and compile evidence from its log
  checkpoint   the checkpoint CLI dumps boot-N's container (after its one answer) into the store, as the node's
               root component does: seconds and image bytes; the container stops
  restore-N    the same container again: the handler restores boot-N's process. Pod create -> Running ->
               /health -> first completion, and the handler's own restore time from the pod's log

The boots go through the handler too (it checks the key, then runs runc's create): the few hundred milliseconds
that costs are in the boot times. Prints each round, the medians and the ratio restore/boot (create to first
completion), writes JSON with the machine's facts.

    sudo PYTHONPATH=src:dev/src .venv/bin/python bench/snapshot.py [--rounds 2] [--layers 4] [--out FILE]

Root only (containerd, the kubelet, CRIU). Each boot is one to two minutes of vLLM on a small machine's shared
cores, and other real-node work may share them: compare within one run only; the load average is in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from kubernetes import client as kc
from kubernetes.client.exceptions import ApiException

from nodewarm.api import snapshot as snap
from nodewarm.bootstrap.compilecache import hitcheck
from nodewarm_dev.testenv import enginenode, podrun, realnode, snapshotnode, vllmclient
from nodewarm_dev.testenv import kube as kubeenv
from nodewarm_dev.testenv import registry as registry_server
from nodewarm_dev.testenv.criu import criu_binary, criu_version

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "scripts" / "build-images.sh"
NODE, MODEL, PORT = "node-bench-snapshot", "tiny", 8000
MODELS_DIR, CACHE_DIR = "/nwbench-models", "/nwbench-cache"     # hostPaths on the node (realnode host_dirs)
# vLLM's caches on the hostPath, so the boots after the first find them warm; the CPU backend's settings.
CACHE_ENV = {"VLLM_CACHE_ROOT": "/cache/vllm", "TORCHINDUCTOR_CACHE_DIR": "/cache/inductor",
             "TRITON_CACHE_DIR": "/cache/triton", "XDG_CACHE_HOME": "/cache/xdg"}
ROUND_ENV = "NODEWARM_BENCH_ROUND"      # in the snapshot key (the environment is), in no compile cache key
POD_TIMEOUT_S = 900
SERVING_NAME = "localhost/nodewarm-bench/vllm-openai-nodewarm"


def _pod(name: str, image: str, seccomp: str, round_id: str) -> dict:
    env = {**CACHE_ENV, **enginenode.CPU_RUNTIME_ENV, **snap.ENGINE_ENV,
           ROUND_ENV: round_id}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": NODE, "restartPolicy": "Never", "runtimeClassName": snap.RUNTIME_CLASS,
                     "terminationGracePeriodSeconds": 10,
                     "containers": [{
                         "name": snap.CONTAINER, "image": image,
                         "securityContext": {"runAsUser": 0, "seccompProfile": {"type": "Localhost",
                                                                                "localhostProfile": seccomp}},
                         "command": ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny",
                                     "--served-model-name", MODEL, "--max-model-len", "512", "--dtype", "bfloat16",
                                     "--port", str(PORT)],
                         "env": [{"name": k, "value": v} for k, v in env.items()],
                         "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True},
                                          {"name": "cache", "mountPath": "/cache"}]}],
                     "volumes": [{"name": "models", "hostPath": {"path": MODELS_DIR}},
                                 {"name": "cache", "hostPath": {"path": CACHE_DIR}}]}}


def _healthy(base: str, deadline: float) -> None:
    """Until GET /health answers 200 (tried every 0.1 s: a restore is seconds, so the poll must not be)."""
    while True:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{base}/health did not answer 200 in time")
        time.sleep(0.1)


class Bench:
    def __init__(self, core: kc.CoreV1Api, node: realnode.RealNode, image: str, seccomp: str, store: Path):
        self.core, self.node, self.image, self.seccomp, self.store = core, node, image, seccomp, store

    def log(self, pod: str) -> str:
        return snapshotnode.container_log(self.node, pod, snap.CONTAINER)

    def serve(self, name: str, round_id: str) -> dict:
        """Create the pod, and time it to Running, to /health and to its first completion (from its create)."""
        t0 = time.monotonic()
        self.core.create_namespaced_pod("default", _pod(name, self.image, self.seccomp, round_id))
        deadline = t0 + POD_TIMEOUT_S
        while True:
            p = self.core.read_namespaced_pod(name, "default")
            if p.status.phase in ("Failed", "Succeeded"):
                raise RuntimeError(f"pod {name} {p.status.phase} before serving; its log ends:\n{self.log(name)[-4000:]}")
            st = p.status.container_statuses or ()
            if p.status.phase == "Running" and p.status.pod_ip and st and st[0].container_id:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"pod {name} not Running after {POD_TIMEOUT_S}s")
            time.sleep(0.1)
        running = time.monotonic() - t0
        base = f"http://{p.status.pod_ip}:{PORT}"
        try:
            _healthy(base, deadline)
        except TimeoutError:
            raise TimeoutError(f"pod {name}: vLLM not serving after {POD_TIMEOUT_S}s; its log ends:\n"
                               f"{self.log(name)[-4000:]}") from None
        ready = time.monotonic() - t0
        answer = vllmclient.complete(base, MODEL, max_tokens=12)["choices"][0]["text"]
        first = time.monotonic() - t0
        # The handler's line about this create (booted and why, or restored): written before the engine's, but the
        # kubelet's log file may lag the answer.
        until = time.monotonic() + 30
        while True:
            text = self.log(name)
            handler = snap.handler_message(text)
            if handler or time.monotonic() > until:
                break
            time.sleep(0.5)
        ev, cc = enginenode.evidence(text), hitcheck.scan_log(text)
        return {"pod": name, "createToRunningSeconds": round(running, 2), "createToHealthSeconds": round(ready, 2),
                "createToFirstCompletionSeconds": round(first, 2), "handler": handler,
                "engine": {**ev.to_dict(), "compileCacheLoaded": cc.loaded, "graphsCompiled": cc.compiled},
                "answer": answer,
                "containerID": p.status.container_statuses[0].container_id.split("//", 1)[1]}

    def delete(self, name: str, timeout_s: float = 120) -> None:
        """Delete the pod and wait until the kubelet has stopped it (the next pod must not share the cores with
        a dying engine)."""
        try:
            self.core.delete_namespaced_pod(name, "default", grace_period_seconds=10)
        except ApiException as e:
            if e.status == 404:
                return
            raise
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                self.core.read_namespaced_pod(name, "default")
            except ApiException as e:
                if e.status == 404:
                    return
                raise
            time.sleep(0.5)
        self.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def _cache(run: dict) -> str:
    """What vLLM's log says of its compile cache (hitcheck.scan_log: its own load / compile / load-failure lines)."""
    e = run["engine"]
    return (f"compile cache: {e['compileCacheLoaded']} loaded, {e['graphsCompiled']} compiled, "
            f"{e['aotLoadFailures']} AOT load failures")


def _restore_seconds(handler_line: str | None) -> tuple[float | None, dict[str, float]]:
    """The handler's own time and where it went, from its line "restored from the snapshot SLOT in N.Ns (key
    N.Ns, verify N.Ns, criu N.Ns)"."""
    m = re.match(re.escape(snap.RESTORED_PREFIX) + r"\S+ in ([0-9.]+)s(?: \((.*)\))?", handler_line or "")
    if not m:
        return None, {}
    laps = dict(re.findall(r"(\w+) ([0-9.]+)s", m.group(2) or ""))
    return float(m.group(1)), {k: float(v) for k, v in laps.items()}


def _machine() -> dict:
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor() or None)
    mem = next((int(ln.split()[1]) * 1024 for ln in Path("/proc/meminfo").read_text().splitlines()
                if ln.startswith("MemTotal:")), None)
    return {"nproc": os.cpu_count(), "cpuModel": model, "memTotalBytes": mem, "kernel": platform.release(),
            "loadAverageStart": list(os.getloadavg())}


def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(vals), 2) if vals else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _serving_image() -> str:
    """This checkout's serving image (scripts/build-images.sh, as the demo's build_images runs it), under a name of
    the bench's own: a checkout's tests build the default name from their own tree and drop the image they
    replace, which would pull the image from under this bench's push. Only the nodewarm layer is the bench's build;
    the CPU vLLM base is the one setup built."""
    r = subprocess.run(["bash", str(BUILD_SCRIPT), "--only", "serving", "--serving-name", SERVING_NAME],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode:
        raise RuntimeError(f"scripts/build-images.sh failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    return r.stdout.split()[-1]


def _start_cluster(tmp: Path) -> kubeenv.KubeCluster:
    """The API server, tried again when a free port it was given was taken meanwhile (other real-node work on this
    machine picks its ports too)."""
    for attempt in range(3):
        try:
            return kubeenv.start(tmp / f"kube{attempt}", node_names=(NODE,))
        except RuntimeError as e:
            if "address already in use" not in str(e) or attempt == 2:
                raise
            print(f"(the API server lost its port to another process: starting it again: {str(e).splitlines()[0]})",
                  file=sys.stderr)
    raise AssertionError("unreachable")


def _push(local: str, registry: str) -> str:
    # A registry on this machine: gzip of the serving image's ~4 GB engine layer would cost more than it saves.
    ref = f"{registry}/{local.split('/', 1)[1]}"
    r = subprocess.run(["buildah", "push", "--quiet", "--tls-verify=false", "--disable-compression", local,
                        f"docker://{ref}"], capture_output=True, text=True, timeout=900)
    if r.returncode:
        raise RuntimeError(f"buildah push {local} exited {r.returncode}: {r.stderr.strip()[-2000:]}")
    return ref


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="boot/checkpoint/restore rounds (default 2)")
    ap.add_argument("--layers", type=int, default=4, help="layers of the tiny Llama (default 4)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "snapshot.json",
                    help="JSON report (default bench/results/snapshot.json)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print(f"bench/snapshot.py needs root (uid {os.geteuid()}): containerd, the kubelet and CRIU", file=sys.stderr)
        return 2
    realnode.preflight()
    criu = criu_binary()
    podrun.require_serving_venv()
    report: dict = {"rounds": args.rounds, "layers": args.layers, "machine": _machine(),
                    "criu": ".".join(map(str, criu_version(criu)))}
    local = _serving_image()
    report["servingImage"] = local
    print(f"serving image {local}; CRIU {report['criu']}; {report['machine']['nproc']} CPUs "
          f"({report['machine']['cpuModel']}), load {report['machine']['loadAverageStart'][0]:.2f}", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="nw-bench-snap-"))     # short: the kubelet's sockets live under it
    seccomp_dir = Path(snap.SECCOMP_DIR)
    seccomp = f"nodewarm-bench-{uuid.uuid4().hex[:8]}.json"
    reg = cluster = node = bench = None
    live: list[str] = []
    try:
        models, cache, store = tmp / "models", tmp / "cache", tmp / "snapshots"
        cache.mkdir()
        enginenode.make_model(models / "tiny", layers=args.layers)
        reg = registry_server.start(tmp / "registry")
        image = _push(local, reg.host)
        cluster = _start_cluster(tmp)
        seccomp_dir.mkdir(parents=True, exist_ok=True)
        (seccomp_dir / seccomp).write_text(json.dumps(snap.SECCOMP))
        node = realnode.start(cluster, NODE, tmp / "n", registries={reg.host: reg.url},
                              host_dirs={MODELS_DIR: models, CACHE_DIR: cache},
                              runtime_handlers={snap.RUNTIME_HANDLER: snapshotnode.handler_script(
                                  tmp / "nodewarm-runc", store)})
        snapshotnode.create_runtime_class(cluster.api_client(), snap.RUNTIME_CLASS)
        bench = Bench(kc.CoreV1Api(cluster.api_client()), node, image, seccomp, store)

        live.append("fill")
        fill = bench.serve("fill", "fill")
        bench.delete("fill")
        live.remove("fill")
        report["fill"] = fill
        print(f"fill (image pull, compile caches filled): first completion {fill['createToFirstCompletionSeconds']} s "
              f"after create; engine init {fill['engine']['engineInitSeconds']} s, "
              f"{_cache(fill)}", flush=True)

        rounds = []
        for r in range(1, args.rounds + 1):
            rid = f"r{r}"
            live.append(f"boot-{r}")
            boot = bench.serve(f"boot-{r}", rid)
            if not (boot["handler"] or "").startswith("booting instead"):
                raise RuntimeError(f"boot-{r} did not boot: the handler said {boot['handler']!r}")
            taken = snapshotnode.checkpoint(node, store, boot["containerID"])
            bench.delete(f"boot-{r}")
            live.remove(f"boot-{r}")
            live.append(f"restore-{r}")
            rest = bench.serve(f"restore-{r}", rid)
            bench.delete(f"restore-{r}")
            live.remove(f"restore-{r}")
            if not snap.restored(rest["handler"]):
                raise RuntimeError(f"restore-{r} was not restored: the handler said {rest['handler']!r}")
            handler_s, phases = _restore_seconds(rest["handler"])
            row = {"round": r, "boot": boot,
                   "checkpoint": {"seconds": taken["seconds"], "imageBytes": taken["imageBytes"]},
                   "restore": {**rest, "handlerRestoreSeconds": handler_s, "handlerPhases": phases},
                   "sameAnswer": rest["answer"] == boot["answer"],
                   "loadAverage": os.getloadavg()[0]}
            rounds.append(row)
            print(f"round {r}: boot {boot['createToFirstCompletionSeconds']} s to first completion (engine init "
                  f"{boot['engine']['engineInitSeconds']} s, {_cache(boot)}); "
                  f"checkpoint {taken['seconds']:.1f} s, {taken['imageBytes'] / 1e9:.2f} GB; restore "
                  f"{rest['createToFirstCompletionSeconds']} s (handler {row['restore']['handlerRestoreSeconds']} s: "
                  f"{row['restore']['handlerPhases']}); "
                  f"same answer: {row['sameAnswer']}", flush=True)
        report["roundsDetail"] = rounds
    except BaseException:
        if node is not None:
            print(node.logs(), file=sys.stderr)
            if bench is not None:
                for pod in live:
                    print(f"--- pod {pod}'s log (end) ---\n{bench.log(pod)[-4000:]}", file=sys.stderr)
        raise
    finally:
        if bench is not None:
            for pod in live:
                try:
                    bench.delete(pod, timeout_s=30)
                except Exception as e:
                    print(f"(deleting pod {pod}: {e})", file=sys.stderr)
        if node is not None:
            node.stop()
        if cluster is not None:
            cluster.stop()
        if reg is not None:
            reg.stop()
        (seccomp_dir / seccomp).unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)

    boots = [row["boot"] for row in rounds]
    restores = [row["restore"] for row in rounds]
    cps = [row["checkpoint"] for row in rounds]
    med = {
        "bootToFirstCompletionSeconds": _median(boots, "createToFirstCompletionSeconds"),
        "bootToHealthSeconds": _median(boots, "createToHealthSeconds"),
        "bootEngineInitSeconds": _median([b["engine"] for b in boots], "engineInitSeconds"),
        "checkpointSeconds": _median(cps, "seconds"),
        "checkpointImageBytes": _median(cps, "imageBytes"),
        "restoreToFirstCompletionSeconds": _median(restores, "createToFirstCompletionSeconds"),
        "restoreToHealthSeconds": _median(restores, "createToHealthSeconds"),
        "restoreHandlerSeconds": _median(restores, "handlerRestoreSeconds"),
    }
    report["medians"] = med
    report["ratios"] = {
        "restore/boot to first completion": _ratio(med["restoreToFirstCompletionSeconds"],
                                                   med["bootToFirstCompletionSeconds"]),
        "restore/boot to /health": _ratio(med["restoreToHealthSeconds"], med["bootToHealthSeconds"])}
    report["machine"]["loadAverageEnd"] = list(os.getloadavg())

    print(f"\nmedians of {len(rounds)} round(s), seconds from the pod's create:")
    print(f"  {'':24} {'warm-cache boot':>16} {'restore':>10} {'restore/boot':>13}")
    for label, b, r, ratio in (
            ("to /health", med["bootToHealthSeconds"], med["restoreToHealthSeconds"],
             report["ratios"]["restore/boot to /health"]),
            ("to first completion", med["bootToFirstCompletionSeconds"], med["restoreToFirstCompletionSeconds"],
             report["ratios"]["restore/boot to first completion"])):
        print(f"  {label:24} {b!s:>16} {r!s:>10} {ratio!s:>13}")
    print(f"  boot: vLLM engine init {med['bootEngineInitSeconds']} s; restore: the handler's restore "
          f"{med['restoreHandlerSeconds']} s")
    size = med["checkpointImageBytes"]
    print(f"  checkpoint: {med['checkpointSeconds']} s, {size / 1e9 if size else 0:.2f} GB of CRIU images")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
