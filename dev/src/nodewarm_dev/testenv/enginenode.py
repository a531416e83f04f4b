"""Simulated nodes that warm and serve like real ones, with real vLLM (CPU): for the compile-cache tests and bench.

A node is a directory standing for its root filesystem. Its node agent is nodewarm's own (``agent.warm`` with the
config the DaemonSet/host agent builds from the profile: weights pulled from S3, the compile cache restored from
the bucket, the baseline saved for the publisher). Its serving pod is the rendered Deployment's pod, run by
``podrun``: the vLLM container (the rendered start script, argv and env) and, beside it, the publisher sidecar
(the rendered ``nodewarm publish`` argv and env), sharing the pod's emptyDirs as a pod's containers do. Both see
the node's hostPaths at the pod's own paths, so vLLM hashes and writes exactly what it would on the node.

What this CPU "node" adds to the rendered pod, as its container runtime would (never part of the profile):
``CPU_RUNTIME_ENV`` (vLLM's CPU backend settings) and ``EVIDENCE_ENV`` (Inductor's cache log lines: vLLM's own
evidence of what it loaded and what it compiled).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import podrun, vllmclient

# vLLM's CPU backend: a 1 GiB KV cache, and no CPU pinning (the cores are shared with other processes here).
CPU_RUNTIME_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
# torch logs every Inductor FX-graph cache lookup at INFO under this logger: "fx graph cache hit for key K" /
# "fx graph cache miss for key K". In no cache key (neither vLLM's env hash nor Inductor's config).
EVIDENCE_ENV = {"TORCH_LOGS": "torch._inductor.codecache"}

_FX_HIT = re.compile(r"fx graph cache hit for key (\w+)")
_FX_MISS = re.compile(r"fx graph cache miss for key (\w+)")
_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")
_PUBLISHER_DONE = re.compile(r"^(hit|miss|cold|None): (\w+): ", re.M)


@dataclass(frozen=True)
class EngineEvidence:
    """What vLLM's own log says about its compile: Inductor's cache lookups and the engine's init time."""
    fx_hits: tuple[str, ...]
    fx_misses: tuple[str, ...]
    aot_load_failures: int
    init_s: float | None

    @property
    def loaded_without_compiling(self) -> bool:
        """Every compiled graph came from the cache (at least one), none was compiled, no AOT load failed."""
        return bool(self.fx_hits) and not self.fx_misses and not self.aot_load_failures

    def to_dict(self) -> dict:
        return {"fxHits": len(self.fx_hits), "fxMisses": len(self.fx_misses),
                "aotLoadFailures": self.aot_load_failures, "engineInitSeconds": self.init_s}


def evidence(log_text: str) -> EngineEvidence:
    """AOT load failures are counted in vLLM's words as the publisher's judge knows them (hitcheck.scan_log)."""
    from nodewarm.bootstrap.compilecache import hitcheck

    init = _INIT.findall(log_text)
    return EngineEvidence(tuple(_FX_HIT.findall(log_text)), tuple(_FX_MISS.findall(log_text)),
                          hitcheck.scan_log(log_text).aot_failed, float(init[-1]) if init else None)


def make_model(dest: Path, **kw) -> Path:
    """The tiny Llama (tinymodel.py, beside this module) written into ``dest`` by the serving environment, which has
    torch and transformers; nothing is downloaded."""
    import subprocess

    args = [f"--{k}={v}" for k, v in kw.items()]
    subprocess.run([podrun.which_python(), str(Path(__file__).with_name("tinymodel.py")), str(dest), *args],
                   check=True, capture_output=True)
    return dest


def upload_model(server, work: Path, layers: int = 4, bucket: str | None = None) -> str:
    """The tiny Llama made into ``work/model`` and uploaded to a new bucket of the local S3 ``server`` as a model
    pushed with boto3 is (``upload_file`` defaults); its bucket. The model lies under ``models/tiny/`` there."""
    import uuid

    bucket = bucket or "tiny-" + uuid.uuid4().hex[:10]
    model = make_model(work / "model", layers=layers)
    server.create_bucket(bucket)
    client = server.client()
    for f in sorted(model.iterdir()):
        client.upload_file(str(f), bucket, f"models/tiny/{f.name}")
    return bucket


def rendered_pod(p) -> tuple[dict, dict[str, dict], list[dict]]:
    """(pod spec, ConfigMaps by name, all documents) of ``nodewarm render`` for this profile."""
    from nodewarm import instancetypes
    from nodewarm.nodeclasses.render import render

    docs = render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == f"{p.name}-vllm")
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    return deployment["spec"]["template"]["spec"], configmaps, docs


def serving_runtime(p, runtime_env: dict[str, str]):
    """(RuntimeProbe, env): the serving image's software and env, read there (``compile-cache key --runtime-only`` in
    the serving environment), as its publisher sidecar reads them."""
    import json
    import subprocess

    from nodewarm.bootstrap.compilecache import cachekey

    spec, _, _ = rendered_pod(p)
    c = next(c for c in spec["containers"] if c["name"] == "vllm")
    env = {"PATH": f"{podrun.serving_venv() / 'bin'}:/usr/bin:/bin",
           **{e["name"]: e["value"] for e in c["env"] if "value" in e}, **runtime_env}
    out = subprocess.run([str(podrun.serving_venv() / "bin" / "nodewarm"), "bootstrap", "compile-cache", "key",
                          "--runtime-only"], env=env, capture_output=True, text=True, check=True).stdout
    doc = json.loads(out)
    return cachekey.probe_from_dict(doc["runtime"]), doc["env"]


def publish(node: "Node", p, signing_pem: Path, *, spec_of=None):
    """What the publisher sidecar of ``node`` would publish for profile ``p`` (its own code, signed with the
    profile's key): this node's cache dirs as the bundle of the key that ``spec_of`` (default ``p``) gives, with the
    serving image's runtime descriptor. ``spec_of`` another profile: a bundle built for other settings at its key."""
    from nodewarm.api.servingspec import serving_spec
    from nodewarm.bootstrap.compilecache import cachekey, hardware, publish as publisher, signing
    from nodewarm.bootstrap.compilecache.cachestore import CacheStore, parse_uri

    keyed = spec_of or p
    probe, env = serving_runtime(keyed, node.runtime_env)
    factors = cachekey.build_factors(probe, hardware.probe(env=env), serving_spec(keyed), env)
    return publisher.publish_once(CacheStore(parse_uri(keyed.compile_cache.uri)), node.cache_roots(p), factors,
                                  signing.load_private(signing_pem), {"node": node.name}, runtime=probe)


@dataclass
class Node:
    name: str
    root: Path                       # the node's "/": hostPath volumes live under it
    runtime_env: dict[str, str] = field(default_factory=lambda: {**CPU_RUNTIME_ENV, **EVIDENCE_ENV})

    def host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def compile_cache(self, p) -> Path:
        """The host side of the pod's /compile-cache hostPath."""
        from nodewarm.api.podlayout import compile_cache_dir

        return self.host(compile_cache_dir(p))

    def cache_roots(self, p) -> dict[str, Path]:
        """The host side of the pod's compile-cache dirs, named as the agent and the publisher name its roots
        (``CacheDirs.roots()``): what a snapshot or a bundle of this node covers."""
        from nodewarm.bootstrap.compilecache.bundle import CacheDirs
        from nodewarm.api.podlayout import cache_dirs

        d = cache_dirs(self.compile_cache(p))
        return CacheDirs(vllm_root=Path(d["vllm"]), inductor=Path(d["inductor"]), triton=Path(d["triton"]),
                         pch=Path(d["pch"])).roots()

    def warm(self, doc: dict, node_labels: dict[str, str] | None = None):
        """This node's agent, once, as the DaemonSet/host agent runs it for the profile document ``doc``:
        weights from S3 into the node's copy, then the compile-cache restore and its baseline."""
        from nodewarm.bootstrap import agent, followplan, profilesource
        from nodewarm.profile import from_dict

        p = from_dict(doc)
        mount = self.host(p.nodes.cache_mount)
        opts = followplan.FollowOptions(profile=p.name, mount=mount, node_name=self.name, allow_non_nvme=True)
        cfg = followplan.agent_config(profilesource.resolve(doc, mount), opts, node_labels)
        return agent.warm(cfg)


@dataclass
class Serving:
    """One serving pod on a node: vLLM, and the publisher when the profile has one."""
    vllm: podrun.Pod
    publisher: podrun.Pod | None
    base_url: str
    ready_s: float = 0.0

    def stop(self) -> None:
        for pod in (self.publisher, self.vllm):
            if pod is not None:
                pod.stop()

    def publisher_outcome(self, timeout: float) -> tuple[str, str]:
        """Wait for the publisher's verdict line (``nodewarm publish`` prints it once it has proven, reported and
        published, then idles): (outcome, reason)."""
        assert self.publisher is not None
        deadline = time.monotonic() + timeout
        while True:
            text = self.publisher.text()
            m = _PUBLISHER_DONE.search(text)
            if m:
                return m.group(1), m.group(2)
            if ("Traceback (most recent call last)" in text or self.publisher.proc.poll() is not None
                    or time.monotonic() > deadline):
                raise RuntimeError(f"the publisher gave no verdict; its log ends:\n{text[-4000:]}")
            time.sleep(1)


def _self_contained(kubeconfig: Path) -> str:
    """The kubeconfig with its CA file inlined: the pod sees its own /tmp, not the API server's workdir."""
    import base64

    import yaml

    doc = yaml.safe_load(kubeconfig.read_text())
    for c in doc.get("clusters") or ():
        path = c["cluster"].pop("certificate-authority", None)
        if path:
            c["cluster"]["certificate-authority-data"] = base64.b64encode(Path(path).read_bytes()).decode()
    return yaml.safe_dump(doc)


def serve(node: Node, p, work: Path, *, extra_env: dict[str, str] | None = None,
          publisher_kubeconfig: Path | None = None, signing_dir: Path | None = None,
          ready_timeout: float = 900) -> Serving:
    """Start the rendered pod of ``p`` on ``node`` (vLLM first, the publisher beside it when rendered) and wait
    until vLLM serves. ``extra_env``: what the runtime adds to both containers (credentials);
    ``publisher_kubeconfig``: the publisher's API credentials (its ServiceAccount's token, which a kubelet would
    project into the pod), put into the pod's own /tmp. Stops what it started on failure."""
    spec, configmaps, _ = rendered_pod(p)
    publisher_env = {}
    if publisher_kubeconfig is not None:
        (work / "tmp").mkdir(parents=True, exist_ok=True)
        (work / "tmp" / "publisher-kubeconfig").write_text(_self_contained(publisher_kubeconfig))
        publisher_env["KUBECONFIG"] = "/tmp/publisher-kubeconfig"
    port = p.serving.port
    env = {**node.runtime_env, **(extra_env or {})}
    common = dict(node_root=node.root, work=work, configmaps=configmaps, node_name=node.name,
                  pod_name=f"{p.name}-vllm-0", namespace=p.serving.namespace)
    vllm = podrun.start(spec, "vllm", extra_env=env, **common)
    publisher = None
    try:
        if any(c["name"] == "nodewarm-publish" for c in spec["containers"]):
            if signing_dir is None:
                raise ValueError("the profile renders a publisher: give signing_dir (its signing-key Secret)")
            publisher = podrun.start(spec, "nodewarm-publish", volumes={"signing-key": signing_dir},
                                     extra_env={**env, **publisher_env}, **common)
        base = f"http://127.0.0.1:{port}"
        ready = vllmclient.wait_ready(base, timeout=ready_timeout, alive=lambda: vllm.proc.poll() is None,
                                      log_tail=vllm.text)
    except BaseException:
        for pod in (publisher, vllm):
            if pod is not None:
                pod.stop()
        raise
    return Serving(vllm, publisher, base, ready)
