"""A snapshot taken of a running container by runc and CRIU, and the runtime handler turning a create into its
restore, or into a boot that says why: real runc, real CRIU, real processes."""

from __future__ import annotations

import json
import subprocess
import pytest

from nodewarm.bootstrap.snapshot import checkpoint as snapcheckpoint
from nodewarm.bootstrap.snapshot.store import Store
from nodewarm.bootstrap.snapshot.tools import Tools
from nodewarm.api import snapshot
from support.runcbox import Runc, counter_rootfs, cpu_has_amx, create_and_start, handler

@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "snapshots").open()


def take(runc, store, criu, container):
    """Run ``container`` (through the handler, as the snapshot RuntimeClass runs it) until it has counted a
    little, then checkpoint it into the store."""
    assert "no snapshot of this container" in create_and_start(runc, store, criu, container)
    before = container.wait_count(5)
    taken = snapcheckpoint.checkpoint(store, Tools("runc", criu, store.criu_config), str(runc.root), container.id)
    assert runc.status(container.id) != "running", "the dumped container must not run on beside its snapshot"
    return before, taken


def outcome(store, cid) -> dict:
    return json.loads((store.root / "outcomes" / f"{cid}.json").read_text())



def test_a_restores_laps_add_up_to_no_more_than_its_recorded_total(store, monkeypatch, capsys):
    """Three laps of 0.6 ms each: rounded one by one they are 3 ms against a 2 ms total; cut on the milliseconds
    since the start they are 1 + 0 + 1 ms."""
    from nodewarm.bootstrap.snapshot import restore
    clock = iter([0.0, 0.0006, 0.0012, 0.0018, 0.0018, 0.0018])
    monkeypatch.setattr(restore.time, "monotonic", lambda: next(clock))
    out = restore._Outcome(store, "cid-laps", "pod", "vllm", restore.time.monotonic())
    for phase in ("key", "verify", "criu"):
        out.lap(phase)
    out.restored("slot")
    done = outcome(store, "cid-laps")
    assert done["phases"] == {"key": 0.001, "verify": 0.0, "criu": 0.001} and done["seconds"] == 0.002, done


def test_a_create_with_a_snapshot_is_the_checkpointed_process_going_on(runc, store, criu):
    (token, n, shared), taken = take(runc, store, criu, runc.bundle())
    assert taken.image_bytes > 0

    b = runc.bundle()              # another pod: its own bundle and /out, and a /dev/shm bind mount of its own
    log = create_and_start(runc, store, criu, b)

    assert runc.status(b.id) == "running"
    token2, n2, shared2 = b.wait_count(n + 3)
    assert token2 == token, "a restored process keeps the token it drew at its start"
    assert n2 > n and shared2 > shared >= n, "it counts on from where it was, in memory and in /dev/shm"
    assert "restored from the snapshot" in log
    done = outcome(store, b.id)
    assert done["result"] == "Restored"
    # Where the restore's time went, said in the pod's log and recorded: the key, the manifest, CRIU.
    assert set(done["phases"]) == {"key", "verify", "criu"}
    # Compared in whole milliseconds: the recorded figures are, and a float sum of them is not exact.
    assert sum(round(v * 1000) for v in done["phases"].values()) <= round(done["seconds"] * 1000), done
    assert all(f"{k} {v:.1f}s" in log for k, v in done["phases"].items()), log
    # The line the demo and the bench read back is the one the outcome records.
    assert snapshot.handler_message(log) == done["message"]
    assert not list(store.root.glob(".restore-*")), "a restore that worked leaves no work directory"


def test_a_snapshot_under_another_key_is_refused_and_the_container_boots(runc, store, criu):
    (token, _, _), _ = take(runc, store, criu, runc.bundle(env={"MODEL_GENERATION": "1"}))

    b = runc.bundle(env={"MODEL_GENERATION": "2"})
    log = create_and_start(runc, store, criu, b)

    token2, n2, _ = b.state()
    assert token2 != token and n2 < 50, "a fresh process"
    assert "another key (differs in env.MODEL_GENERATION)" in log
    assert outcome(store, b.id)["reason"] == "KeyMismatch"
    assert snapshot.handler_message(log) == outcome(store, b.id)["message"]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_corrupt_or_truncated_image_is_never_restored(runc, store, criu, damage):
    (token, _, _), taken = take(runc, store, criu, runc.bundle())
    pages = max(taken.snapshot.images.glob("pages-*.img"), key=lambda p: p.stat().st_size)
    data = bytearray(pages.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    else:
        del data[len(data) // 2:]
    pages.write_bytes(bytes(data))

    b = runc.bundle()
    log = create_and_start(runc, store, criu, b)

    assert b.state()[0] != token
    assert f"{pages.relative_to(taken.snapshot.path)} is" in log and "corrupt or truncated" in log
    assert outcome(store, b.id)["reason"] == "SnapshotCorrupt"


def test_a_node_without_criu_or_with_an_older_one_boots_and_says_why(runc, store, criu, tmp_path):
    (token, _, _), _ = take(runc, store, criu, runc.bundle())
    # An older CRIU as a node may have it: bookworm's package answers "Version: 3.17.1".
    old = tmp_path / "old" / "criu"
    old.parent.mkdir()
    old.write_text("#!/bin/sh\necho 'Version: 3.17.1'\n")
    old.chmod(0o755)

    for criu_path, said in ((str(tmp_path / "absent" / "criu"), "criu does not run"),
                            (str(old), "CRIU 3.17.1 at")):
        b = runc.bundle()
        log = create_and_start(runc, store, criu_path, b)
        assert b.state()[0] != token
        assert said in log, log
        assert outcome(store, b.id)["reason"] == "NoCRIU"


def test_a_failed_restore_is_removed_and_the_container_boots(runc, store, criu, tmp_path, rootfs):
    (token, _, _), _ = take(runc, store, criu, runc.bundle())
    # Same key (a plain directory has no layers to tell it apart), but the mapped binary is another file: CRIU
    # refuses to map it back, and the handler must leave nothing of the attempt.
    other = tmp_path / "other-rootfs"
    subprocess.run(["cp", "-a", str(rootfs), str(other)], check=True)
    with open(other / "counter", "ab") as f:
        f.write(b"\0" * 4096)

    b = runc.bundle(rootfs=other)
    log = create_and_start(runc, store, criu, b)

    assert runc.status(b.id) == "running"
    assert b.state()[0] != token
    assert "runc restore exited" in log
    assert outcome(store, b.id)["reason"] == "RestoreFailed"
    assert not list(store.root.glob(".restore-*")) and not store.was_restored(b.id)


def test_a_process_that_used_amx_tiles_goes_on_after_its_restore(store, criu, tmp_path):
    """The permission to use AMX tile data is kernel state CRIU does not save: without setup's CRIU patch the
    restored counter dies of SIGILL at its next tile instruction (vLLM's worker did, at its first request)."""
    if not cpu_has_amx():
        pytest.skip("this CPU has no AMX (amx_tile): the permission a restore must ask again does not exist here")
    amx = Runc(tmp_path / "amx", counter_rootfs(tmp_path / "amx-image", amx=True))
    try:
        (token, n, _), _ = take(amx, store, criu, amx.bundle())
        b = amx.bundle()
        assert "restored from the snapshot" in create_and_start(amx, store, criu, b)
        token_b, n_b, _ = b.wait_count(n + 10)
        assert token_b == token and n_b >= n + 10, "the restored counter ran ten more rounds of tile instructions"
        assert amx.status(b.id) == "running"
    finally:
        amx.cleanup()


def test_a_boot_and_every_passed_call_go_to_the_boot_runtime_and_restores_to_runc(tmp_path, runc, store, criu):
    """On the NVIDIA AMI the boot runtime is nvidia-container-runtime (runc plus the GPU hook): every call but a
    restore goes there, so a booted container gets its GPUs as on the stock runtime."""
    out = tmp_path / "boot.out"
    boot = tmp_path / "nvidia-container-runtime"
    boot.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {out}\nexec runc \"$@\"\n")
    boot.chmod(0o755)
    env = {snapshot.ENV_BOOT: str(boot)}
    c = runc.bundle()
    assert handler(store, criu, runc.create_argv(c), env=env).returncode == 0
    assert out.read_text().split()[-1] == c.id and "create" in out.read_text().split()
    assert outcome(store, c.id)["reason"] == "NoSnapshot"
    assert handler(store, criu, ["--root", str(runc.root), "start", c.id], env=env).returncode == 0
    assert out.read_text().split() == ["--root", str(runc.root), "start", c.id]
