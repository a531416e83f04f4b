"""What the node agent's service (follow.py, the Follower) decides without the cluster: the options it runs with, the
agent configuration it warms a resolved profile with, and which older weights and pods a new generation's warm
waits for or removes. Pure but for one folder's listing (stale_model_dirs), which removes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from nodewarm.api import snapshot
from nodewarm.api.agentpod import PodRef
from nodewarm.api.names import GENERATION_LABEL
from nodewarm.api.servingspec import serving_spec
from nodewarm.api.warmprofile import WarmProfile

from . import agent, profilesource
from .modelcache import plan
from .weights.capacity import Headroom
from .weights.loadcheck import StreamerTuning

_MODEL_KEY = re.compile(r"^[0-9a-f]{12}$")


@dataclass(frozen=True)
class FollowOptions:
    profile: str
    mount: Path
    node_name: str
    load_check: bool = True
    stream_check: bool = False      # also stream one file through runai-model-streamer (needs torch)
    allow_non_nvme: bool = False
    host_root: Path = Path("/")
    runtime: tuple | None = None
    once: bool = False              # warm once and exit (the demo's processes, `bootstrap run --once`)
    watch_timeout_s: int = 300
    poll_s: float = 10.0            # waiting for a missing profile, or for old pods to leave
    retry_s: float = 300.0          # a failed warm is tried again after this, or at once on a profile change
    state_dir: Path | None = None   # launcher failure records in, agent-result.json out
    gpu_wait_s: float | None = None     # None: gpuwait.GPU_WAIT_S
    headroom: Headroom = field(default_factory=Headroom)   # space every pull leaves free on the NVMe
    label_wait_s: float = 60.0      # an eviction waits this long for the controller to take the model's label off
    agent_pod: PodRef | None = None     # the pod this agent runs in (the DaemonSet's downward API); None on AL2023
    snapshot_runc_root: str = snapshot.RUNC_ROOT    # serving.snapshot: where containerd's runc keeps its state
    snapshot_criu: str = snapshot.CRIU_PATH


def streamer_tuning(p: WarmProfile) -> StreamerTuning:
    """The load check streams like the vLLM pod will (nodeclasses.vllm renders the same two values)."""
    return StreamerTuning(p.concurrency, p.serving.chunk_bytes)


def agent_config(r: profilesource.Resolved, opts: FollowOptions,
                 node_labels: dict[str, str] | None = None, peering=None) -> agent.AgentConfig:
    p = r.profile
    extras = tuple(t.model for t in plan.targets(p, opts.mount)[1:] if t.required)
    return agent.AgentConfig(
        profile=p.name, model_uri=p.model.uri, dest=r.model_dir, mount=opts.mount, node_name=opts.node_name,
        compile_cache_uri=p.compile_cache.uri, verify_key=p.compile_cache.verify_key, spec=serving_spec(p),
        allow_non_nvme=opts.allow_non_nvme or p.bootstrap.allow_non_nvme, load_check=opts.load_check,
        host_root=opts.host_root, runtime=opts.runtime, generation=r.generation, readiness_taint=p.readiness.taint_key,
        streamer=streamer_tuning(p) if opts.stream_check else None,
        state_dir=opts.state_dir, node_labels=dict(node_labels or {}), serving_image=p.serving.image,
        prepull_namespace=p.bootstrap.namespace, prepull_deadline_s=float(p.bootstrap.image_prepull_timeout_s),
        engine_check_s=float(p.readiness.engine_check.timeout_s) if p.readiness.engine_check.enabled else None,
        serving_namespace=p.serving.namespace, peering=peering, extras=extras, report_models=bool(p.models),
        headroom=opts.headroom, snapshot=snapshot_settings(p, opts),
        **({"gpu_wait_s": opts.gpu_wait_s} if opts.gpu_wait_s is not None else {}))


def snapshot_settings(p: WarmProfile, opts: FollowOptions):
    """serving.snapshot's settings for the host agent (None when off). The store is on this node's NVMe mount, as
    the user data's handler finds it (api.snapshot.store_dir)."""
    if not p.serving.snapshot or opts.agent_pod is not None:
        return None     # the profile check refuses it with a DaemonSet agent; a pod could not checkpoint anyway
    from .snapshot.take import Settings

    return Settings(store=Path(snapshot.store_dir(str(opts.mount))), runc_root=opts.snapshot_runc_root,
                    criu=opts.snapshot_criu)


def stale_model_dirs(models_dir: Path, keep: str) -> list[Path]:
    """Weights folders of this profile other than ``keep``: only names this agent makes (12 hex digits),
    never a link, so nothing outside the profile's folder is ever removed."""
    if not models_dir.is_dir():
        return []
    return sorted(d for d in models_dir.iterdir()
                  if _MODEL_KEY.match(d.name) and d.name != keep and d.is_dir() and not d.is_symlink())


def older_pods(pods: list[dict], generation: str) -> list[str]:
    """Names of pods (not finished) that still serve a generation other than ``generation``."""
    out = []
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        phase = (pod.get("status") or {}).get("phase")
        if labels.get(GENERATION_LABEL) != generation and phase not in ("Succeeded", "Failed"):
            out.append(pod["metadata"]["name"])
    return out
