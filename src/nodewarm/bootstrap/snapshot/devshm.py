"""Each container of the snapshot RuntimeClass gets a /dev/shm of its own. Pure.

Kubernetes gives a container's /dev/shm as a bind mount (the sandbox's shm, or an emptyDir a pod mounts there),
and runc tells CRIU to leave bind mounts out of the images: they belong to the pod, not the process. vLLM keeps
its message rings between the API server, the engine and its workers in /dev/shm files it has mapped, so a
restore into a new pod would map files that are not there, or another pod's. A tmpfs mounted in the container's
own mount namespace is saved with the process and restored with it, whole and consistent with its memory.

The tmpfs has the kernel's default size (half the node's memory); its pages are charged to the container's memory
cgroup, as an emptyDir's (medium Memory) are, so the pod's memory limit bounds it as before.
"""

from __future__ import annotations

from typing import Any

OWN_SHM = {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
           "options": ["nosuid", "noexec", "nodev", "mode=1777"]}


def with_own_shm(config: dict[str, Any]) -> dict[str, Any] | None:
    """``config`` with its /dev/shm bind mount replaced by a tmpfs of its own; None when there is nothing to
    change (no /dev/shm mount, or already a tmpfs)."""
    mounts = list(config.get("mounts") or ())
    for i, m in enumerate(mounts):
        if m.get("destination") == "/dev/shm":
            if m.get("type") == "tmpfs" and "bind" not in (m.get("options") or ()):
                return None
            mounts[i] = dict(OWN_SHM)
            return {**config, "mounts": mounts}
    return None
