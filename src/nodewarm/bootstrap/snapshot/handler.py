"""The runtime handler: what containerd runs in place of runc for pods of the snapshot RuntimeClass.

containerd's runc shim calls it exactly as it calls runc. Every call goes to the real runc unchanged except two:

* ``create`` of a container that has a snapshot in the store under the same key becomes ``runc restore
  --detach``: the shim then sees a running container, with the pid it asked for and its own stdio pipes (runc
  hands them to the restored processes, so the pod's log goes on);
* ``start`` of a container restored that way is already done.

A create with no snapshot, another key, a snapshot that fails its manifest, no CRIU or an old one, or a restore
that fails is a plain ``runc create``: the container boots, and its log says why first. A failed restore is
deleted before that, so a half-restored process never serves. Each decision is also written to
``<store>/outcomes/<container id>.json`` for the agent to report as an Event.

Settings come from the environment the node's script sets (api.snapshot's ENV_*): the real runc (restores, deletes,
the key's runtime version), what a boot and every passed call go to (the same runc, or the NVIDIA AMI's
nvidia-container-runtime, which adds the hook that gives a booted container its GPUs), CRIU, and the store. Passing a call through imports nothing beyond the argument parser, as it runs for every
runc call of those pods.
"""

from __future__ import annotations

import os
import shutil
import sys

from nodewarm.api.snapshot import ENV_BOOT, ENV_CRIU, ENV_RUNC, ENV_STORE
from nodewarm.bootstrap.snapshot import runcargs

RESTORE_TIMEOUT_S = 120.0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    runc = os.environ.get(ENV_RUNC, "runc")
    runc = runc if os.path.isabs(runc) else shutil.which(runc) or "/usr/sbin/runc"
    boot = os.environ.get(ENV_BOOT) or runc
    call = runcargs.parse(argv)
    root = os.environ.get(ENV_STORE, "")
    if root and call.container_id and call.command in ("start", "delete", "create"):
        from nodewarm.bootstrap.snapshot.store import Store
        store = Store(root)
        if call.command == "start" and store.was_restored(call.container_id):
            return 0
        if call.command == "delete":
            store.forget(call.container_id)
        if call.command == "create":
            from nodewarm.bootstrap.snapshot.restore import try_restore
            if try_restore(call, store, runc=runc, criu=os.environ.get(ENV_CRIU, "criu"),
                           timeout=RESTORE_TIMEOUT_S):
                return 0
    os.execv(boot, [boot, *argv])
    return 127      # not reached


if __name__ == "__main__":
    sys.exit(main())
