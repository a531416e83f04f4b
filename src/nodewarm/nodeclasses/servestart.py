"""How the vLLM container starts: the start script (shipped in a ConfigMap, vllm.start_script_configmap), the
container command, and the volumes it needs.

A node whose warm-up missed its deadline can lose its startup taint (readiness.onDeadline: untaint) with its
local copy of the model absent, partial or still being written. vLLM must then neither crash-loop on a missing
hostPath nor read a partial directory. So the container starts ``serve_start_script.py`` (shipped in a
ConfigMap: the serving image has python3 but not nodewarm), which loads from NVMe when the node agent's record
says the copy is complete, else streams from S3 with the Run:ai streamer when the pod has credentials that may
read the model, else waits for the copy (the script's docstring says exactly what "complete" means).

* The weights hostPath is ``DirectoryOrCreate``: an absent copy no longer fails the pod; the script, not the
  kubelet, decides, and vLLM never reads the directory unless it is complete. Only the model's own folder
  (podlayout.model_dir, on the NVMe mount) is mounted, at the same path as before, so vLLM's model string, and with
  it the compile-cache key, is unchanged for a warm start. The kubelet may create that empty folder first;
  the agent fills it in place (it only ever adds and renames files inside it, so the pod's bind mount sees
  them), and a directory created on a node without the NVMe mount is as harmless as the compile-cache
  hostPath's, which is DirectoryOrCreate on the same mount already.
* Cold streaming needs S3 read credentials in the pod. Only the compile-cache publisher gives the pod an AWS
  identity (its ServiceAccount, shared by the vLLM container; iam.publisher_policy grants it model read for
  this). Without a publisher the pod has no credentials (identity ``node`` cannot reach pods: metadata hop
  limit 1), so the script is told ``--cold wait`` (nodewarm.api.warmprofile ``cold_mode``): it logs why and starts vLLM
  from NVMe once the agent's copy is complete, instead of crash-looping on a stream that cannot authenticate.
* The ConfigMap has a fixed name: a new nodewarm release's script reaches running pods at their next start
  without rolling the Deployment (the command-line contract is the script's interface; keep it compatible).
"""

from __future__ import annotations

from importlib import resources

from nodewarm.api.podlayout import model_dir, model_path
from nodewarm.api.warmprofile import WarmProfile, cold_mode

SCRIPT_FILE = "serve_start_script.py"   # in this package, so it ships with nodewarm (a .py: no package-data)
SCRIPT_KEY = "serve_start.py"           # its name in the ConfigMap and in the container
MOUNT = "/nodewarm/serve-start"
VOLUME = "serve-start"
# The pod's own emptyDir where the script records where vLLM loaded the model from; the compile-cache publisher
# sidecar reads it (a cold start must not be judged a cache hit or miss).
RECORD_VOLUME = "serve-start-record"
RECORD_MOUNT = "/run/nodewarm"
RECORD_FILE = f"{RECORD_MOUNT}/serve-start.json"


def script_text() -> str:
    return resources.files(__package__).joinpath(SCRIPT_FILE).read_text(encoding="utf-8")


def configmap_name(p: WarmProfile) -> str:
    # A model's view (nodewarm.api.models) runs the same script: the profile's one ConfigMap serves all its models.
    return f"{p.parent or p.name}-vllm-serve-start"


def command(p: WarmProfile) -> list[str]:
    """The container's command; Kubernetes appends the container's args (vLLM's) after the ``--``."""
    out = ["python3", f"{MOUNT}/{SCRIPT_KEY}", "--local", model_path(p.name), "--uri", p.model.uri,
           "--cold", cold_mode(p)]
    if p.nodes.region:
        out += ["--region", p.nodes.region]
    if p.compile_cache.publisher:
        out += ["--record", RECORD_FILE]
    return out + ["--"]


def init_container(p: WarmProfile, env: list[dict]) -> dict:
    """The same script with ``--wait-only``: the pod's wait for the agent's copy happens here, where no startup
    probe counts it (the vLLM container's probe budget covers loading and compiling, not an unbounded wait).
    The serving image, so it runs where the vLLM container will; vLLM's environment, so it sees the same
    credentials."""
    cmd = command(p)
    return {"name": "nodewarm-wait-for-model", "image": p.serving.image, "command": cmd[:-1] + ["--wait-only"],
            "env": env, "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
            "volumeMounts": volume_mounts(p)}


def volume_mounts(p: WarmProfile) -> list[dict]:
    return [{"name": "weights", "mountPath": model_path(p.name), "readOnly": True},
            {"name": VOLUME, "mountPath": MOUNT, "readOnly": True}, *record_mounts(p)]


def record_mounts(p: WarmProfile) -> list[dict]:
    """The start record's mount (only with a publisher: nobody else reads it)."""
    return [{"name": RECORD_VOLUME, "mountPath": RECORD_MOUNT}] if p.compile_cache.publisher else []


def volumes(p: WarmProfile) -> list[dict]:
    return [
        # DirectoryOrCreate, not Directory: a node whose copy is absent must still start the pod, which then
        # streams or waits (the start script); it never lets vLLM read an incomplete directory.
        {"name": "weights", "hostPath": {"path": model_dir(p), "type": "DirectoryOrCreate"}},
        {"name": VOLUME, "configMap": {"name": configmap_name(p), "defaultMode": 0o444}},
        *([{"name": RECORD_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}}] if p.compile_cache.publisher else []),
    ]
