"""The node's half of a snapshot's key, and the container's layers: read from this node, never from a record.

``parse_*`` are pure; ``probe`` and ``rootfs_layers`` read the node.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

from nodewarm.bootstrap.compilecache import hardware
from nodewarm.bootstrap.snapshot.key import NodeFacts

# The oldest CRIU that dumps vLLM on the kernels nodes run: 4.1 fails on any TCP socket on kernels >= 6.16, and
# 3.17 fails `criu check` on their vDSO.
MIN_CRIU = (4, 2, 0)


class ToolMissing(Exception):
    """runc or CRIU is absent, too old, or does not answer: the reason a create boots instead of restoring."""


def parse_criu_version(text: str) -> tuple[int, int, int]:
    """``criu --version`` ("Version: 4.2.1", or "Version: 4.2" for a .0 release) as a tuple."""
    m = re.search(r"^Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", text, re.M)
    if not m:
        raise ValueError(f"no 'Version: X.Y[.Z]' line in criu --version output: {text.strip()[:200]!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def parse_cpu(cpuinfo: str) -> tuple[str, str]:
    """The first processor's model name and a digest of its sorted flags (all processors of a node agree)."""
    model, flags = "", ""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "model name" and not model:
            model = value.strip()
        elif name in ("flags", "Features") and not flags:
            flags = " ".join(sorted(value.split()))
        if model and flags:
            break
    return model, hashlib.sha256(flags.encode()).hexdigest()[:16]


def parse_rootfs_layers(mountinfo: str, rootfs: str) -> tuple[str, ...]:
    """The lower directories of the overlay mounted at ``rootfs`` (the image's layers on this node); for any other
    root filesystem, its type and source. Empty when nothing is mounted there."""
    found: tuple[str, ...] = ()
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or _unescape(fields[4]) != rootfs:
            continue
        fstype, source, *opts = right.split()
        if fstype == "overlay" and opts:
            lower = next((o[len("lowerdir="):] for o in opts[0].split(",") if o.startswith("lowerdir=")), "")
            found = tuple(lower.split(":")) if lower else ()
        else:
            found = (f"{fstype}:{source}:{fields[3]}",)
    return found      # the last mount on that point is the one a process sees


def _unescape(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _version(cmd: list[str], what: str) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolMissing(f"{what} at {cmd[0]} does not run: {e}") from None
    if out.returncode != 0:
        raise ToolMissing(f"`{' '.join(cmd)}` exited {out.returncode}: {(out.stderr or out.stdout).strip()[:200]}")
    return out.stdout


def criu_version(criu: str) -> str:
    """CRIU's version, refused when older than MIN_CRIU (ToolMissing says which and why)."""
    v = parse_criu_version(_version([criu, "--version"], "CRIU"))
    if v < MIN_CRIU:
        raise ToolMissing(f"CRIU {'.'.join(map(str, v))} at {criu} is older than "
                          f"{'.'.join(map(str, MIN_CRIU))}: it cannot dump vLLM on this kernel")
    return ".".join(map(str, v))


def probe(runc: str, criu: str, host_root: Path = Path("/")) -> NodeFacts:
    cpu_model, cpu_flags = parse_cpu(_read(host_root / "proc/cpuinfo"))
    hw = hardware.probe(host_root, use_nvml=False)
    gpus = f"{hw.gpu_model}x{hw.gpu_count} driver {hw.driver}".strip() if hw.gpu_count else ""
    return NodeFacts(kernel=os.uname().release, cpu_model=cpu_model, cpu_flags=cpu_flags, gpus=gpus,
                     runc=_version([runc, "--version"], "runc").splitlines()[0].strip(), criu=criu_version(criu))


def rootfs_layers(rootfs: str) -> tuple[str, ...]:
    return parse_rootfs_layers(_read(Path("/proc/self/mountinfo")), os.path.realpath(rootfs))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
