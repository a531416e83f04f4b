"""The engine-check runner's paths, driven by a scripted engine (tests/support/scriptedengine.py) so each end is
reached in a second: served, exited with vLLM's "does not fit" words, crashed, hung past the timeout, compiling
after a restore (stopped early, the bundle marked stale in a real S3 bucket), loaded from S3 instead of the node.
What vLLM itself does on each path is proven in tests/engine/test_engine_check.py. Observe mode (snapshot) runs the
scripted engine as the pod's other container would: started beside the runner, never by it, and still running after
it answered."""

from __future__ import annotations

import json
import logging
import dataclasses
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from nodewarm.api.enginecheck import MESSAGE_LIMIT, Reason, Result, RunnerArgs, add_runner_flags, runner_args
from nodewarm.bootstrap.compilecache import hitcheck
from nodewarm.bootstrap.compilecache.cachestore import envelope_key, stale_key
from nodewarm.bootstrap.enginecheck import judge, runner
from nodewarm_dev.testenv.ports import free_port
from support.bootstrap_fixtures import cache_store

ENGINE = str(Path(__file__).resolve().parents[2] / "support" / "scriptedengine.py")


def _roots(tmp: Path) -> dict[str, Path]:
    roots = {"vllm": tmp / "cc/vllm/torch_compile_cache", "inductor": tmp / "cc/inductor", "triton": tmp / "cc/triton",
             "pch": tmp / "cc/tmp/pch"}
    for d in roots.values():
        d.mkdir(parents=True, exist_ok=True)
    return roots


def _args(tmp: Path, mode: str, *, restored: bool, timeout: int = 60, extra=(), cache_uri=None, envelope="",
          record=None) -> tuple[RunnerArgs, dict[str, Path]]:
    roots = _roots(tmp)
    graph = roots["inductor"] / "fxgraph" / "ab" / "abkey" / "entry"
    graph.parent.mkdir(parents=True, exist_ok=True)
    graph.write_text("restored graph")
    hitcheck.save_baseline(tmp / "baseline.json", hitcheck.Baseline(hitcheck.snapshot(roots), restored,
                                                                     "Restored" if restored else "CacheNotFound",
                                                                     envelope, 3 if envelope else 0))
    port = free_port()
    engine = (sys.executable, ENGINE, "--port", str(port), "--mode", mode, *extra)
    return RunnerArgs(port, "tiny", timeout, str(tmp / "baseline.json"), str(tmp / "cc/vllm"), str(roots["inductor"]),
                      str(roots["triton"]), str(roots["pch"]), engine, cache_uri, record,
                      str(tmp / "termination-log")), roots


def test_a_served_check_passes_with_its_times_and_a_restored_bundle_is_a_hit(tmp_path):
    a, _ = _args(tmp_path, "serve", restored=True)
    r = runner.check(a)
    assert (r.passed, r.reason, r.compile_cache) == (True, Reason.ENGINE_SERVED, "hit")
    assert r.started_at <= r.ready_at <= r.first_token_at
    assert r.boot_s is not None and r.first_token_s is not None
    assert "INFO serving" in "\n".join(r.log_tail)


def test_what_vllm_writes_beside_its_compile_cache_is_not_a_compile(tmp_path):
    # Every vLLM boot writes $VLLM_CACHE_ROOT/modelinfos/; the bundle and the baseline cover torch_compile_cache only.
    write = tmp_path / "cc/vllm/modelinfos/vllm-model_executor-models-llama-LlamaForCausalLM.json"
    a, _ = _args(tmp_path, "serve", restored=True, extra=("--write", str(write)))
    r = runner.check(a)
    assert (r.passed, r.compile_cache) == (True, "hit"), r.message


def test_on_a_cold_node_the_checks_own_compile_is_expected(tmp_path):
    write = tmp_path / "cc/inductor/fxgraph/cd/cdkey/entry"
    a, _ = _args(tmp_path, "serve", restored=False, extra=("--write", str(write)))
    r = runner.check(a)
    assert (r.passed, r.compile_cache) == (True, "cold")


def test_vllms_does_not_fit_words_are_model_does_not_fit(tmp_path):
    a, _ = _args(tmp_path, "nofit", restored=True)
    r = runner.check(a)
    assert (r.passed, r.reason) == (False, Reason.MODEL_DOES_NOT_FIT)
    assert "larger than the available KV cache memory" in r.message
    assert any("KV cache" in line for line in r.log_tail)


def test_any_other_exit_before_serving_is_a_boot_failure(tmp_path):
    a, _ = _args(tmp_path, "crash", restored=True)
    r = runner.check(a)
    assert (r.passed, r.reason, r.ready_at) == (False, Reason.ENGINE_BOOT_FAILED, None)
    assert "Engine core initialization failed" in "\n".join(r.log_tail)


def test_an_engine_that_never_answers_is_stopped_at_the_timeout(tmp_path):
    a, _ = _args(tmp_path, "hang", restored=False, timeout=3)
    r = runner.check(a)
    assert (r.passed, r.reason) == (False, Reason.ENGINE_CHECK_TIMED_OUT)


class _Events(logging.Handler):
    """The runner's log events, caught on its own logger (nodewarm's root logger may not propagate: logs.setup)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.names.append(record.getMessage())


def test_compiling_after_a_restore_stops_the_boot_and_marks_the_bundle_stale(tmp_path, s3_exact, monkeypatch):
    bucket = "ec-" + uuid.uuid4().hex[:10]
    s3_exact.create_bucket(bucket)
    uri = f"s3://{bucket}/cc/"
    store = cache_store(s3_exact, monkeypatch, uri)
    env_key = envelope_key(store.root + "k", "key1")
    write = tmp_path / "cc/inductor/fxgraph/ef/efkey/entry"
    # "compile" never serves: only the early stop ends it before the (long) timeout with this reason.
    a, _ = _args(tmp_path, "compile", restored=True, timeout=600, cache_uri=uri, envelope=env_key,
                 extra=("--write", str(write)))
    logger, events = logging.getLogger("nodewarm.bootstrap.enginecheck"), _Events()
    level = logger.level
    logger.addHandler(events)
    logger.setLevel(logging.INFO)
    try:
        r = runner.check(a)
    finally:
        logger.removeHandler(events)
        logger.setLevel(level)
    assert (r.passed, r.reason, r.compile_cache, r.marked_stale) == (False, Reason.COMPILE_CACHE_NOT_LOADED, "miss",
                                                                     True)
    assert "enginecheck.compiling_after_restore" in events.names
    assert r.ready_at is None                       # stopped while booting, not after serving
    assert store.exists(stale_key(env_key, 3))
    assert "marked stale" in r.message


def test_without_a_writer_identity_a_miss_fails_the_check_and_says_nothing_was_marked(tmp_path):
    write = tmp_path / "cc/inductor/fxgraph/ef/efkey/entry"
    a, _ = _args(tmp_path, "serve", restored=True, envelope="cc/k/key1.json", extra=("--write", str(write)))
    r = runner.check(a)
    assert (r.passed, r.reason, r.marked_stale) == (False, Reason.COMPILE_CACHE_NOT_LOADED, False)
    assert "no compile-cache writer identity" in r.message


def test_a_start_that_streamed_from_s3_is_not_a_proof_of_this_node(tmp_path):
    record = tmp_path / "start.json"
    record.write_text(json.dumps({"path": "s3", "reason": "IncompleteCopy", "model": "s3://b/m/"}))
    a, _ = _args(tmp_path, "serve", restored=False, record=str(record))
    r = runner.check(a)
    assert (r.passed, r.reason) == (False, Reason.ENGINE_BOOT_FAILED)
    assert "not from this node's copy" in r.message


def test_without_the_agents_baseline_the_check_does_not_run(tmp_path):
    a, _ = _args(tmp_path, "serve", restored=True)
    os.remove(a.baseline)
    r = runner.check(a)
    assert (r.passed, r.reason) == (False, Reason.ENGINE_CHECK_NOT_RUN)


def test_the_cli_writes_the_result_as_the_termination_message_and_exits_by_it(tmp_path):
    from nodewarm.cli import main

    a, _ = _args(tmp_path, "nofit", restored=True)
    assert main(["engine-check", *a.to_argv()]) == 1
    r = Result.from_json(Path(a.result).read_text())
    assert r.reason == Reason.MODEL_DOES_NOT_FIT


def test_the_rendered_flags_parse_back_to_what_was_rendered(tmp_path):
    import argparse

    a, _ = _args(tmp_path, "serve", restored=True, cache_uri="s3://b/cc/", record="/run/nodewarm/serve-start.json")
    p = argparse.ArgumentParser()
    add_runner_flags(p)
    assert runner_args(p.parse_args(a.to_argv())) == a


# --- observe mode (spec.serving.snapshot): vLLM is the pod's serving container, beside the runner ---------------


@pytest.fixture
def beside(tmp_path):
    """Start the scripted engine as the pod's vLLM container (not the runner's child), on the args' port; the
    processes are ended here, after the test looked at them."""
    procs: list[subprocess.Popen] = []

    def start(a: RunnerArgs) -> subprocess.Popen:
        proc = subprocess.Popen(list(a.engine), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _observing(a: RunnerArgs) -> RunnerArgs:
    return dataclasses.replace(a, engine=(), observe=True)


POD_ENV = {"HOSTNAME": "llama-engine-check-0a1b2c3d4e", "POD_NAMESPACE": "llm"}
LOGS = "kubectl logs -n llm llama-engine-check-0a1b2c3d4e -c vllm"


def test_observing_waits_for_the_engine_answers_once_and_leaves_it_running(tmp_path, beside):
    # The engine takes 2 s to listen: the runner must wait for /health, not give up at the first refusal.
    a, _ = _args(tmp_path, "serve", restored=True, extra=("--boot-s", "2"))
    vllm = beside(a)
    r = runner.check(_observing(a), env=POD_ENV)
    assert (r.passed, r.reason, r.compile_cache) == (True, Reason.ENGINE_SERVED, "hit"), r.message
    assert r.started_at <= r.ready_at <= r.first_token_at and r.boot_s >= 1.5
    assert r.log_tail == ()                          # vLLM's log is its own container's
    assert vllm.poll() is None                       # never stopped: the agent checkpoints it


def test_observing_an_engine_that_never_answers_times_out_and_says_where_its_log_is(tmp_path, beside):
    a, _ = _args(tmp_path, "hang", restored=False, timeout=3)
    vllm = beside(a)
    r = runner.check(_observing(a), env=POD_ENV)
    assert (r.passed, r.reason) == (False, Reason.ENGINE_CHECK_TIMED_OUT)
    assert f"did not answer /health on 127.0.0.1:{a.port} within 3 s" in r.message
    assert r.message.endswith(LOGS)
    assert vllm.poll() is None


def test_observing_with_no_engine_at_all_times_out_too(tmp_path):
    # Nothing listens (the vLLM container crashed, or never started): the runner cannot tell, the clock ends it.
    a, _ = _args(tmp_path, "serve", restored=False, timeout=2)
    r = runner.check(_observing(a), env={"HOSTNAME": "pod-x"})
    assert (r.passed, r.reason) == (False, Reason.ENGINE_CHECK_TIMED_OUT)
    assert r.message.endswith("kubectl logs pod-x -c vllm")


def test_observing_a_compile_after_a_restore_fails_early_from_the_disk_alone(tmp_path, beside):
    # "compile" never serves: only the scan of the cache dirs ends the wait before the (long) timeout.
    write = tmp_path / "cc/inductor/fxgraph/ef/efkey/entry"
    a, _ = _args(tmp_path, "compile", restored=True, timeout=600, envelope="cc/k/key1.json",
                 extra=("--write", str(write)))
    vllm = beside(a)
    r = runner.check(_observing(a), env=POD_ENV)
    assert (r.passed, r.reason, r.compile_cache, r.ready_at) == (False, Reason.COMPILE_CACHE_NOT_LOADED, "miss",
                                                                 None)
    assert "no compile-cache writer identity" in r.message and r.message.endswith(LOGS)
    assert vllm.poll() is None                       # not the runner's to stop


def test_observing_a_start_that_streamed_from_s3_is_not_a_proof_of_this_node(tmp_path, beside):
    record = tmp_path / "start.json"
    record.write_text(json.dumps({"path": "s3", "reason": "IncompleteCopy", "model": "s3://b/m/"}))
    a, _ = _args(tmp_path, "serve", restored=False, record=str(record))
    beside(a)
    r = runner.check(_observing(a), env=POD_ENV)
    assert (r.passed, r.reason) == (False, Reason.ENGINE_BOOT_FAILED)
    assert "not from this node's copy" in r.message and r.message.endswith(LOGS)


def test_where_the_log_is_survives_the_messages_cut():
    long = runner.with_log_hint("x" * 5000, LOGS)
    back = Result.from_json(Result(False, Reason.ENGINE_BOOT_FAILED, long).to_json())
    assert len(long) <= MESSAGE_LIMIT and back.message.endswith(LOGS)
    assert runner.logs_command({}) == "kubectl logs POD -c vllm"


def test_the_cli_observes_writes_the_result_and_exits_by_it(tmp_path, beside):
    from nodewarm.cli import main

    a, _ = _args(tmp_path, "serve", restored=False)
    vllm = beside(a)
    assert main(["engine-check", *_observing(a).to_argv()]) == 0
    r = Result.from_json(Path(a.result).read_text())
    assert (r.passed, r.compile_cache) == (True, "cold")
    assert vllm.poll() is None


def test_observe_round_trips_and_refuses_an_engine(tmp_path):
    import argparse

    a, _ = _args(tmp_path, "serve", restored=True, cache_uri="s3://b/cc/", record="/run/nodewarm/serve-start.json")
    p = argparse.ArgumentParser()
    add_runner_flags(p)
    o = _observing(a)
    assert o.to_argv()[-2:] == ["--observe", "--"]
    assert runner_args(p.parse_args(o.to_argv())) == o
    assert "--observe" not in a.to_argv()
    with pytest.raises(ValueError, match="--observe starts no engine"):
        runner_args(p.parse_args([*o.to_argv(), "python3", "serve.py"]))
    with pytest.raises(ValueError, match="no engine command"):
        runner_args(p.parse_args(dataclasses.replace(a, engine=()).to_argv()))


@pytest.mark.parametrize("line, reason", [
    # vLLM 0.32's words (vllm/v1/core/kv_cache_utils.py, vllm/v1/worker/cpu_worker.py) and torch's OOM.
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
     Reason.MODEL_DOES_NOT_FIT),
    ("ValueError: To serve at least one request with the model's max seq len (32768), (4.00 GiB KV cache is needed, "
     "which is larger than the available KV cache memory (1.00 GiB).", Reason.MODEL_DOES_NOT_FIT),
    ("ValueError: Available memory on node 0 (1.0/23.0 GiB) on kv cache allocation is less than requested memory "
     "for kv (2.0 GiB). Decrease --kv-cache-memory-bytes", Reason.MODEL_DOES_NOT_FIT),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", Reason.MODEL_DOES_NOT_FIT),
    ("RuntimeError: Engine core initialization failed. See root cause above.", Reason.ENGINE_BOOT_FAILED),
])
def test_why_vllm_did_not_serve_is_read_from_its_own_words(line, reason):
    assert judge.failure_reason(f"INFO starting\n{line}\n") == reason
