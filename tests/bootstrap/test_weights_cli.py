"""The `nodewarm bootstrap weights` contract, run as a real process against the local S3 server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.bootstrap_fixtures import loop_volume, model_files, put_model, safetensors_bytes, visible_files

def nodewarm(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nodewarm.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def weights(uri: str, dest, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return nodewarm("bootstrap", "weights", "--uri", uri, "--dest", str(dest), "--headroom-gib", "0",
                    "--part-size-mib", "1", "--attempts", "3", *extra, env=env)


def reason_line(p: subprocess.CompletedProcess) -> str:
    return p.stderr.strip().splitlines()[-1]


def test_help_teaches_the_contract():
    p = nodewarm("bootstrap", "weights", "--help")
    assert p.returncode == 0
    for fact in ("AWS_ENDPOINT_URL", "Exit status", "NotInstanceStore", "InsufficientNVMe", "/mnt/k8s-disks/0",
                 "/mnt/.ephemeral", "--allow-non-nvme", "summary.json", "transfers no object bytes"):
        assert fact in p.stdout, fact
    assert "weights" in nodewarm("bootstrap", "--help").stdout


@pytest.mark.s3
@pytest.mark.torch
def test_pull_verify_load_check_then_rerun_transfers_nothing(s3, proxy, tmp_path):
    files = model_files(shards=2, mib_per_shard=1.5, seed=21)
    uri = put_model(s3, files)
    dest = tmp_path / "model"
    p = weights(uri, dest, "--allow-non-nvme", "--json", "--stream-check")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert {"files", "bytes", "seconds", "throughput_mb_s", "skipped", "changed"} <= set(summary)
    assert summary["files"] == len(files) and summary["bytes"] == sum(map(len, files.values()))
    check = summary["load_check"]
    assert check["files"] == 2 and check["streamed_file"].endswith(".safetensors") and check["gb_per_s"] > 0
    assert summary["storage"]["instance_store"] is False
    assert visible_files(dest) == files
    assert json.loads((dest / ".nodewarm/summary.json").read_text())["ok"] is True

    proxy.reset_counters()
    p = weights(uri, dest, "--allow-non-nvme", "--json")
    assert p.returncode == 0, p.stderr
    again = json.loads(p.stdout)
    assert again["downloaded_bytes"] == 0 and again["skipped"] == len(files)
    assert proxy.gets() == [] and proxy.body_bytes == 0


def test_not_on_instance_store_fails_with_one_line_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never reached
    dest = tmp_path / "model"
    p = weights("s3://bucket/model/", dest, "--mount-wait", "0")
    assert p.returncode == 1
    assert reason_line(p).startswith("nodewarm: NotInstanceStore: ") and "--allow-non-nvme" in reason_line(p)
    assert not dest.exists()


@pytest.mark.s3
def test_wrong_credentials_exit_nonzero_after_one_request(s3, proxy, tmp_path):
    uri = put_model(s3, model_files(shards=1, mib_per_shard=0.5, seed=22))
    p = weights(uri, tmp_path / "m", "--allow-non-nvme", "--skip-load-check",
                env={"AWS_SECRET_ACCESS_KEY": "wrong"})
    assert p.returncode == 1 and reason_line(p).startswith("nodewarm: S3AccessDenied: ")
    assert len(proxy.requests) == 1


@pytest.mark.s3
def test_model_larger_than_the_volume_fails_before_any_byte(s3, proxy, tmp_path):
    uri = put_model(s3, model_files(shards=3, mib_per_shard=4, seed=23))
    with loop_volume(tmp_path, 8) as vol:
        p = weights(uri, vol / "model", "--allow-non-nvme", "--skip-load-check", "--json")
        assert p.returncode == 1 and reason_line(p).startswith("nodewarm: InsufficientNVMe: ")
        assert json.loads(p.stdout)["reason"] == "InsufficientNVMe"
        assert proxy.gets() == [] and visible_files(vol / "model") == {}


@pytest.mark.s3
@pytest.mark.torch
def test_a_safetensors_file_that_does_not_parse_fails_with_its_name(s3, proxy, tmp_path):
    files = model_files(shards=1, mib_per_shard=0.5, seed=24)
    good = safetensors_bytes({"w": ("F32", [64, 64])})
    files["model-broken.safetensors"] = good[:8] + b"{not json" + good[17:]
    uri = put_model(s3, files)
    p = weights(uri, tmp_path / "m", "--allow-non-nvme")
    assert p.returncode == 1
    assert reason_line(p).startswith("nodewarm: LoadCheckFailed: model-broken.safetensors")


def test_bad_uri_and_bad_usage():
    p = weights("http://not-s3/model", "/tmp/nodewarm-never", "--allow-non-nvme")
    assert p.returncode == 1 and "InvalidModelSource" in reason_line(p)
    assert nodewarm("bootstrap", "weights", "--dest", "/tmp/x").returncode == 2


def test_agent_commands_start_without_the_other_parts_imports():
    """The agent's start-up is on the warm-up's critical path: `bootstrap ...` registers its own commands only,
    and they are the same commands the full parser has."""
    import argparse

    from nodewarm import cli

    def commands(parser):
        return {name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices}

    full = commands(cli.build_parser())
    for command, module in cli.AGENT_COMMANDS.items():
        assert module in cli.TOP_LEVEL and command in full
        assert commands(cli.build_parser([command])) <= full
    assert "bootstrap" in commands(cli.build_parser(["--log-level", "DEBUG", "bootstrap"]))
    registered_by_agent = set().union(*(commands(cli.build_parser([command])) for command in cli.AGENT_COMMANDS))
    assert registered_by_agent == set(cli.AGENT_COMMANDS)
    probe = ("import sys; from nodewarm import cli; cli.build_parser(['bootstrap', 'run', '--help']); "
             "print(sorted(m for m in sys.modules if m in cli.TOP_LEVEL or m.startswith(('jsonschema', 'kubernetes'))))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['nodewarm.bootstrap.cli']"
    # On the agent's path to its first GET: no botocore to register the commands, and nothing of the compile
    # cache's signature checks (cryptography, ~0.1 s) until that phase starts, after the first GET.
    probe = ("import sys; from nodewarm import cli; cli.build_parser(['bootstrap', 'run', '--help']); "
             "print(sorted(m for m in sys.modules if m.startswith('botocore')))")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    probe = ("import sys; import nodewarm.bootstrap.follow, nodewarm.bootstrap.agent_cli; print(sorted(m for m in "
             "sys.modules if m.startswith(('cryptography', 'nodewarm.bootstrap.compilecache.restore'))))")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    assert nodewarm("bootstrap", "run", "--help").returncode == 0 and "render" in nodewarm("--help").stdout
