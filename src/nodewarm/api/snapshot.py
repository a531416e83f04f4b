"""Engine snapshots (``spec.serving.snapshot``): the names and paths the parts share. Standard library only.

The parts, and what passes between them (docs/snapshots.md says why this way):

1. The AL2023 user data (nodewarm/userdata/) installs the runtime handler ``HANDLER_PATH`` as containerd's runtime
   ``RUNTIME_HANDLER`` (the runc shim with that binary in runc's place, runc's own state root), and the seccomp
   profile ``SECCOMP_PROFILE`` under the kubelet's seccomp folder.
2. The renderer (nodewarm/nodeclasses/snapshot.py) adds the RuntimeClass ``RUNTIME_CLASS``, and puts the first
   model's serving container on it, with that seccomp profile and ``ENGINE_ENV``; the engine-check pod then runs
   that same container beside the runner, which only watches it (``RunnerArgs.observe``).
3. The node agent (nodewarm/bootstrap/snapshot/take.py), once the check passed, checkpoints that container into
   ``store_dir(cache mount)``, under a key that includes ``context.json`` (the model's identity and the compile
   cache's key, written by the agent before the check).
4. The handler, on the serving pod's create, restores it when the key matches, else boots and says why.
"""

from __future__ import annotations

# The RuntimeClass and containerd's runtime handler: one name for both, as a RuntimeClass names its handler.
RUNTIME_CLASS = "nodewarm-snapshot"
RUNTIME_HANDLER = RUNTIME_CLASS
# The container that is snapshotted: the serving Deployment's vLLM container, by name (the key's slot).
CONTAINER = "vllm"
# On the node, written by the user data: the handler containerd runs in runc's place.
HANDLER_PATH = "/opt/nodewarm/bin/nodewarm-runc"
# Where nodewarm looks for CRIU (>= 4.2) on the node. No EKS AMI ships it: docs/snapshots.md says how to add it;
# without it every create boots (reason NoCRIU) and the agent takes no snapshot.
CRIU_PATH = "/usr/local/sbin/criu"
# containerd's runc state root for the CRI's namespace on AL2023: the handler's runc and the agent's checkpoint use
# it, as the stock runc runtime does.
RUNC_ROOT = "/run/containerd/runc/k8s.io"
# The handler's settings, from the environment its script sets (nodewarm/bootstrap/snapshot/handler.py).
ENV_RUNC = "NODEWARM_RUNC"       # the real runc: restores, deletes, and the key's runtime version
ENV_BOOT = "NODEWARM_BOOT"       # what every other call goes to: runc, or the NVIDIA AMI's nvidia-container-runtime
ENV_CRIU = "NODEWARM_CRIU"
ENV_STORE = "NODEWARM_SNAPSHOT_ROOT"

# The kubelet reads Localhost seccomp profiles relative to <root-dir>/seccomp (/var/lib/kubelet/seccomp).
SECCOMP_DIR = "/var/lib/kubelet/seccomp"
SECCOMP_PROFILE = "nodewarm/no-io-uring.json"
# uvloop's libuv opens an io_uring, which CRIU cannot dump; refused, libuv falls back to epoll (ENOSYS = 38).
SECCOMP = {"defaultAction": "SCMP_ACT_ALLOW",
           "syscalls": [{"names": ["io_uring_setup"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]}
# A restored pod has a new IP: vLLM's processes must reach each other on loopback, not on the IP they were born on.
ENGINE_ENV = {"VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}

# Under the NVMe mount: the store (root-only), and the agent's context file in it.
STORE_DIR = "nodewarm/snapshots"
CONTEXT_FILE = "context.json"

# The agent's checkpoint of the check's engine: runc is given this long (2.5 GB of a tiny model's engine took 4.8 s
# on 2 cores; a GPU node's host memory share is far larger), and it counts towards the readiness deadline.
CHECKPOINT_TIMEOUT_S = 300

# The Event reasons the agent reports (besides the handler's own outcomes: NoSnapshot, KeyMismatch, ...).
TAKEN = "SnapshotTaken"
NOT_TAKEN = "SnapshotNotTaken"


def store_dir(cache_mount: str) -> str:
    return f"{cache_mount.rstrip('/')}/{STORE_DIR}"


# The handler's one line in the container's own log (restore.py writes it: restored and in how long, or booting
# instead and why); the demo and the bench read it back with ``handler_message``.
LOG_PREFIX = "nodewarm snapshot: "
# How that message starts when the container runs from its snapshot (any other message: it booted, and why).
RESTORED_PREFIX = "restored from the snapshot "


def handler_message(log_text: str) -> str | None:
    """The handler's message in a container's log, or None when the log has none (yet)."""
    return next((ln.split(LOG_PREFIX, 1)[1].strip() for ln in log_text.splitlines() if LOG_PREFIX in ln), None)


def restored(message: str | None) -> bool:
    """Whether the handler's message says the container runs from its snapshot."""
    return bool(message) and message.startswith(RESTORED_PREFIX)
