"""nodewarm/bootstrap/weights/mounts.py against /proc and /sys trees replayed from the documented RAID0 layouts."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from nodewarm.bootstrap.weights import mounts
from support import paths

FIXTURES = paths.FIXTURES / "proc_sys"


def tree(tmp_path: Path, name: str) -> Path:
    """A private copy, so a test can mutate it."""
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root)
    return root


def test_parse_mountinfo_unescapes_and_reads_source():
    text = ("120 22 9:127 / /mnt/k8s-disks/0 rw,noatime shared:60 - xfs /dev/md127 rw\n"
            "130 22 0:50 / /mnt/with\\040space rw - tmpfs tmp\\134fs rw\n")
    a, b = mounts.parse_mountinfo(text)
    assert (a.mount_point, a.dev, a.fs_type, a.source) == ("/mnt/k8s-disks/0", "9:127", "xfs", "/dev/md127")
    assert (b.mount_point, b.source) == ("/mnt/with space", "tmp\\fs")


def test_mount_for_picks_the_deepest_mount():
    entries = mounts.parse_mountinfo((FIXTURES / "al2023-p5-raid0/proc/self/mountinfo").read_text())
    assert mounts.mount_for("/mnt/k8s-disks/0/models/llama", entries).mount_point == "/mnt/k8s-disks/0"
    assert mounts.mount_for("/mnt/k8s-disks/01", entries).mount_point == "/"
    assert mounts.mount_for("/var/lib/kubelet/pods", entries).source == "/dev/md127"


def test_al2023_raid0_of_instance_store_disks_is_accepted():
    s = mounts.inspect_storage("/mnt/k8s-disks/0/nodewarm/models/llama", FIXTURES / "al2023-p5-raid0")
    assert s.instance_store and s.kind == "raid0-nvme-instance-store"
    assert s.mount_point == "/mnt/k8s-disks/0"
    assert s.devices == tuple(f"nvme{i}n1" for i in range(1, 9))
    assert "8 NVMe instance-store disk" in s.detail
    mounts.require_instance_store(s, allow_non_nvme=False)


def test_bottlerocket_md_ephemeral_is_accepted():
    s = mounts.inspect_storage("/mnt/.ephemeral/models/x", FIXTURES / "bottlerocket-g5-raid0")
    assert s.instance_store and s.kind == "raid0-nvme-instance-store"
    assert s.devices == ("nvme2n1", "nvme3n1")


def test_bottlerocket_single_disk_used_directly_is_accepted():
    s = mounts.inspect_storage("/mnt/.ephemeral/models/x", FIXTURES / "bottlerocket-g6e-single")
    assert s.instance_store and s.kind == "nvme-instance-store"
    assert s.devices == ("nvme2n1",)


def test_silent_fallback_to_the_root_ebs_volume_is_refused_with_a_reason():
    s = mounts.inspect_storage("/mnt/k8s-disks/0/models/x", FIXTURES / "al2023-no-instance-store")
    assert not s.instance_store
    assert s.mount_point == "/" and s.devices == ("nvme0n1p1",)
    assert "Amazon Elastic Block Store" in s.detail
    with pytest.raises(mounts.NotInstanceStore) as e:
        mounts.require_instance_store(s, allow_non_nvme=False)
    assert e.value.reason == "NotInstanceStore" and "--allow-non-nvme" in str(e.value)
    mounts.require_instance_store(s, allow_non_nvme=True)  # allowed: the caller reports it instead


def test_bottlerocket_ebs_data_volume_is_refused():
    s = mounts.inspect_storage("/local/models", FIXTURES / "bottlerocket-g5-raid0")
    assert not s.instance_store and "nvme1n1" in s.detail


def test_tmpfs_is_not_a_block_device():
    s = mounts.inspect_storage("/tmp/models", FIXTURES / "al2023-p5-raid0")
    assert not s.instance_store and "not a block device" in s.detail


def test_raid0_with_an_ebs_member_is_refused(tmp_path):
    root = tree(tmp_path, "al2023-p5-raid0")
    (root / "sys/block/nvme3n1/device/model").write_text("Amazon Elastic Block Store\n")
    s = mounts.inspect_storage("/mnt/k8s-disks/0/m", root)
    assert not s.instance_store and "nvme3n1 (Amazon Elastic Block Store)" in s.detail


def test_md_device_that_is_not_raid0_is_refused(tmp_path):
    root = tree(tmp_path, "al2023-p5-raid0")
    (root / "sys/block/md127/md/level").write_text("raid1\n")
    s = mounts.inspect_storage("/mnt/k8s-disks/0/m", root)
    assert not s.instance_store and "raid1" in s.detail


def test_cache_mount_for_known_layouts():
    assert mounts.cache_mount_for("/mnt/k8s-disks/0/models/a") == "/mnt/k8s-disks/0"
    assert mounts.cache_mount_for("/mnt/.ephemeral") == "/mnt/.ephemeral"
    assert mounts.cache_mount_for("/mnt/.ephemeral2/x") is None
    assert mounts.cache_mount_for("/data/models") is None


def test_wait_for_mount_returns_once_the_raid_is_mounted(tmp_path):
    root = tree(tmp_path, "al2023-p5-raid0")
    info = root / "proc/self/mountinfo"
    full = info.read_text()
    info.write_text("".join(l + "\n" for l in full.splitlines() if "/mnt/k8s-disks/0" not in l))

    def nodeadm_run():  # setup-local-disks mounts the array a little later
        time.sleep(0.3)
        info.write_text(full)

    t = threading.Thread(target=nodeadm_run)
    t.start()
    entry = mounts.wait_for_mount("/mnt/k8s-disks/0", root, timeout_s=30, poll_s=0.05)
    t.join()
    assert entry is not None and entry.source == "/dev/md127"


def test_wait_for_mount_gives_up_after_the_timeout():
    now = [0.0]
    waits = []

    def sleep(s):
        waits.append(s)
        now[0] += s

    entry = mounts.wait_for_mount("/mnt/k8s-disks/0", FIXTURES / "al2023-no-instance-store", timeout_s=5,
                                  poll_s=1, sleep=sleep, clock=lambda: now[0])
    assert entry is None and len(waits) == 5


def test_this_machine_root_disk_is_not_instance_store(tmp_path):
    s = mounts.inspect_storage(str(tmp_path))
    assert not s.instance_store


def test_warm_weights_refuses_the_fallback_before_touching_s3_or_disk(monkeypatch):
    from nodewarm.bootstrap.weights import WeightsConfig, warm_weights

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # would fail loudly if it were reached
    dest = "/mnt/k8s-disks/0/nodewarm-test-never-created"
    cfg = WeightsConfig(uri="s3://models/llama/", dest=Path(dest), mount_wait_s=0,
                        host_root=FIXTURES / "al2023-no-instance-store")
    with pytest.raises(mounts.NotInstanceStore) as e:
        warm_weights(cfg)
    assert "Amazon Elastic Block Store" in str(e.value)
    assert e.value.summary.reason == "NotInstanceStore"
    assert e.value.summary.storage["instance_store"] is False and e.value.summary.storage["mount_point"] == "/"
    assert not Path(dest).exists()
