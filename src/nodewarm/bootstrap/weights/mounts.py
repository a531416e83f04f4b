"""Where the weights go: the node's instance-store NVMe mount, and proof that it really is one.

Karpenter's RAID0 setup fails open: with no NVMe instance-store disks, nodeadm's setup-local-disks
exits 0 without a RAID and Bottlerocket skips ephemeral storage, so a cache directory silently lands on
the root EBS volume (slow, small). Everything here reads /proc and /sys under an injectable ``root`` so
tests can replay the documented layouts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from nodewarm.api.errors import NodewarmError

# nodeadm's setup-local-disks (AL2023) mounts the md RAID0 `kubernetes` here; `apiclient ephemeral-storage
# init` (Bottlerocket, EKS Auto Mode) mounts /dev/md/ephemeral, or the only disk, here.
CACHE_MOUNTS = {
    "al2023": "/mnt/k8s-disks/0",
    "bottlerocket": "/mnt/.ephemeral",
}
INSTANCE_STORE_MODEL = "Amazon EC2 NVMe Instance Storage"


class NotInstanceStore(NodewarmError):
    reason = "NotInstanceStore"


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/self/mountinfo (fields per proc(5))."""

    mount_point: str
    dev: str  # "major:minor" of the backing device
    fs_type: str
    source: str


@dataclass(frozen=True)
class Storage:
    """What backs a path. ``instance_store`` is the verdict; ``detail`` says why, for the node condition."""

    path: str
    mount_point: str
    source: str
    fs_type: str
    kind: str  # "raid0-nvme-instance-store" | "nvme-instance-store" | "other"
    devices: tuple[str, ...]
    instance_store: bool
    detail: str


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and len(field[i + 1:i + 4]) == 3 and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[MountEntry]:
    entries = []
    for line in text.splitlines():
        if " - " not in line:
            continue
        left, right = line.split(" - ", 1)
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 2:
            continue
        entries.append(MountEntry(mount_point=_unescape(lf[4]), dev=lf[2], fs_type=rf[0], source=_unescape(rf[1])))
    return entries


def read_mounts(root: Path) -> list[MountEntry]:
    return parse_mountinfo((root / "proc/self/mountinfo").read_text())


def mount_for(path: str, entries: list[MountEntry]) -> MountEntry:
    """The mount that holds ``path``: the longest mount point above it; the last one wins when stacked."""
    path = os.path.normpath(path)
    best: MountEntry | None = None
    for e in entries:
        mp = e.mount_point
        if path == mp or mp == "/" or path.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) >= len(best.mount_point):
                best = e
    if best is None:
        raise NotInstanceStore(f"no mount holds {path} (mountinfo has no '/' entry?)")
    return best


def cache_mount_for(dest: str) -> str | None:
    """The known NVMe cache mount that ``dest`` lies under, if any (so we know what to wait for)."""
    dest = os.path.normpath(dest)
    for mp in CACHE_MOUNTS.values():
        if dest == mp or dest.startswith(mp + "/"):
            return mp
    return None


def _block_index(root: Path) -> dict[str, tuple[str, str | None]]:
    """major:minor -> (disk, partition or None), from /sys/block/<disk>/dev and <disk>/<part>/dev."""
    index: dict[str, tuple[str, str | None]] = {}
    block = root / "sys/block"
    if not block.is_dir():
        return index
    for disk in sorted(os.listdir(block)):
        ddir = block / disk
        if (ddir / "dev").is_file():
            index[(ddir / "dev").read_text().strip()] = (disk, None)
        for part in sorted(os.listdir(ddir)) if ddir.is_dir() else []:
            if part.startswith(disk) and (ddir / part / "dev").is_file():
                index[(ddir / part / "dev").read_text().strip()] = (disk, part)
    return index


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _disk_model(root: Path, disk: str) -> str:
    return _read(root / "sys/block" / disk / "device/model")


def _parent_disk(root: Path, name: str) -> str:
    """A RAID member may be a partition; its NVMe model lives on the parent disk."""
    if (root / "sys/block" / name).is_dir():
        return name
    for disk in os.listdir(root / "sys/block"):
        if (root / "sys/block" / disk / name).is_dir():
            return disk
    return name


def inspect_storage(path: str, root: Path = Path("/")) -> Storage:
    """Classify what backs ``path`` using ``root``/proc/self/mountinfo and ``root``/sys/block."""
    if root == Path("/"):
        path = os.path.realpath(path)  # the kernel's view: symlinks resolved, even below a missing leaf
    mount = mount_for(path, read_mounts(root))
    disk, part = _block_index(root).get(mount.dev, (None, None))

    def verdict(kind: str, devices: tuple[str, ...], ok: bool, detail: str) -> Storage:
        return Storage(path, mount.mount_point, mount.source, mount.fs_type, kind, devices, ok, detail)

    where = f"{path} is on {mount.source} ({mount.fs_type}) mounted at {mount.mount_point}"
    if disk is None:
        return verdict("other", (), False, f"{where}, which is not a block device")
    if part is None and (root / "sys/block" / disk / "md").is_dir():
        level = _read(root / "sys/block" / disk / "md/level")
        members = tuple(sorted(os.listdir(root / "sys/block" / disk / "slaves")))
        models = {m: _disk_model(root, _parent_disk(root, m)) for m in members}
        foreign = [f"{m} ({models[m] or 'unknown model'})" for m in members if models[m] != INSTANCE_STORE_MODEL]
        if level != "raid0":
            return verdict("other", members, False, f"{where}: md device {disk} is {level or 'unknown level'}, not raid0")
        if not members or foreign:
            return verdict("other", members, False,
                           f"{where}: md RAID0 {disk} has non instance-store members: {', '.join(foreign) or 'none'}")
        return verdict("raid0-nvme-instance-store", members, True,
                       f"{where}: md RAID0 {disk} of {len(members)} NVMe instance-store disk(s)")
    model = _disk_model(root, disk)
    device = part or disk
    if model == INSTANCE_STORE_MODEL:
        return verdict("nvme-instance-store", (device,), True, f"{where}: single NVMe instance-store disk {disk}")
    return verdict("other", (device,), False,
                   f"{where}: {disk} is '{model or 'unknown model'}', not NVMe instance storage "
                   "(the root or an EBS volume: Karpenter's RAID0 setup found no instance-store disks?)")


def require_instance_store(storage: Storage, allow_non_nvme: bool) -> None:
    if not storage.instance_store and not allow_non_nvme:
        raise NotInstanceStore(f"{storage.detail}; use an instance type with NVMe instance storage "
                               "(karpenter.k8s.aws/instance-local-nvme) or pass --allow-non-nvme")


def wait_for_mount(
    mount_point: str,
    root: Path = Path("/"),
    timeout_s: float = 300.0,
    poll_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> MountEntry | None:
    """Wait until something is mounted exactly at ``mount_point``; None after ``timeout_s``.

    On AL2023 the RAID is built in nodeadm-run.service, after user-data scripts start, so an early
    agent has to wait for it rather than write into the empty directory on the root volume.
    """
    deadline = clock() + timeout_s
    while True:
        for e in read_mounts(root):
            if e.mount_point == mount_point:
                return e
        if clock() >= deadline:
            return None
        sleep(poll_s)
