"""The WarmProfile, typed: the user's one document as every part reads it.

profile.py builds these from the document, with the schema's defaults (api.defaults; no field has a default of its
own here, so none is spelled twice), and checks them; the renderer, the node agent, the controller and the demo read
them. Only what follows from the document alone is here: the names derived from it are in generation, the paths on
the node and in the pod in podlayout, vLLM's settings in servingspec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

GIB = 2**30
# spec.bootstrap.imagePrepullTimeout when it is left out and the readiness deadline allows (profile.py
# default_prepull_timeout: half a shorter deadline); not a schema default, which could not follow the deadline.
DEFAULT_PREPULL_TIMEOUT_S = 600


def parse_duration_s(text: str) -> int:
    """A WarmProfile duration ('90s', '20m', '2h': the schema's pattern guarantees the shape) in seconds."""
    return int(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]


def streamer_concurrency(size_gb: float, chunk_gb: float) -> int:
    """The reference formula: one Run:ai streamer worker per chunk of the model, at least 1. The vLLM pod's loader
    and the node's load check both stream with it."""
    return max(1, math.ceil(size_gb / chunk_gb))


@dataclass(frozen=True)
class Model:
    uri: str
    size_gb: float | None
    revision: str
    # Where the document writes it: a view's model (api/models.py) stands in for spec.model, yet what is wrong with
    # it is fixed in its own entry, so every error about its fields names this.
    where: str = field(default="spec.model", compare=False)


@dataclass(frozen=True)
class Peers:
    """spec.weights.peers: agents of one profile feed each other verified parts before S3 (docs/peers.md)."""
    enabled: bool
    port: int
    max_connections: int
    max_mbps: float
    key_rotation: str

    @property
    def key_rotation_s(self) -> int:
        return parse_duration_s(self.key_rotation)


@dataclass(frozen=True)
class Background:
    """spec.weights.background: how a model not required is pulled while the node serves (docs/models.md)."""
    max_mbps: float
    concurrency: int


@dataclass(frozen=True)
class Weights:
    peers: Peers
    background: Background


@dataclass(frozen=True)
class ExtraModel:
    """One entry of spec.models: a further model for the profile's nodes (api/models.py makes its view)."""
    name: str
    model: Model
    priority: int
    required: bool
    replicas: int


@dataclass(frozen=True)
class Serving:
    image: str
    tensor_parallel_size: int
    max_model_len: int | None
    chunk_size_gb: float
    dtype: str
    replicas: int
    namespace: str
    port: int
    s3_request_timeout_ms: int
    s3_low_speed_limit: int
    extra_args: tuple[str, ...]
    allow_eager: bool
    cpu_request: str | None             # None: sized from the GPUs (nodewarm/nodeclasses/vllm.py)
    memory_request: str | None
    snapshot: bool = False              # spec.serving.snapshot.enabled (nodewarm.api.snapshot)

    @property
    def chunk_bytes(self) -> int:
        """RUNAI_STREAMER_CHUNK_BYTESIZE of the vLLM pod; the node's load check streams with the same value."""
        return int(self.chunk_size_gb * GIB)


@dataclass(frozen=True)
class NodeLimits:
    gpus: int | None               # None: sized from the replicas (nodewarm/nodeclasses/nodepool.py)
    cpu: str | None
    memory: str | None


@dataclass(frozen=True)
class DriftWindow:
    start: str                     # HH:MM, UTC (Karpenter's budget schedules are UTC cron)
    duration: str                  # Karpenter duration, under 24h


@dataclass(frozen=True)
class DriftPace:
    """How fast drift (an AMI release, a changed alias or template) may replace warm nodes: NodePool budgets with
    reasons [Drifted] (nodewarm/nodeclasses/nodepool.py renders them)."""

    nodes: str
    window: DriftWindow | None


@dataclass(frozen=True)
class Disruption:
    consolidation_policy: str      # WhenEmpty | WhenEmptyOrUnderutilized
    consolidate_after: str         # Karpenter duration or Never
    budgets: tuple[dict, ...]      # as Karpenter spells them; empty: nodewarm's default
    drift: DriftPace | None


@dataclass(frozen=True)
class Nodes:
    mode: str                      # karpenter | automode
    node_pool: str
    node_class: str
    instance_types: tuple[str, ...]
    role: str | None
    ami_alias: str                 # "family@version"; "" when unset (render refuses it in karpenter mode)
    subnet_selector_terms: tuple[dict, ...]
    security_group_selector_terms: tuple[dict, ...]
    user_data: str | None
    ephemeral_storage_size: str | None
    region: str | None
    capacity_types: tuple[str, ...]
    capacity_reservation_ids: tuple[str, ...]
    limits: NodeLimits
    disruption: Disruption

    @property
    def cache_mount(self) -> str:
        """Where the node's NVMe RAID is mounted (nodeadm on AL2023; apiclient on Bottlerocket/Auto Mode)."""
        if self.mode == "automode" or self.ami_alias.startswith("bottlerocket@"):
            return "/mnt/.ephemeral"
        return "/mnt/k8s-disks/0"


@dataclass(frozen=True)
class Publisher:
    image: str
    signing_key_secret: str
    quiet_seconds: int


@dataclass(frozen=True)
class CompileCache:
    uri: str
    verify_key: str | None
    publisher: Publisher | None


@dataclass(frozen=True)
class EngineCheck:
    """spec.readiness.engineCheck: vLLM boots on the node before it reports Warm (nodewarm.api.enginecheck)."""
    enabled: bool
    timeout: str
    image: str | None              # None: the publisher's image (engine_check_image)

    @property
    def timeout_s(self) -> int:
        return parse_duration_s(self.timeout)


@dataclass(frozen=True)
class Readiness:
    taint_key: str
    deadline: str
    on_deadline: str               # untaint | replace | keep
    engine_check: EngineCheck

    @property
    def deadline_s(self) -> int:
        return parse_duration_s(self.deadline)


@dataclass(frozen=True)
class Aws:
    identity: str                  # podIdentity | irsa | node
    cluster_name: str | None
    agent_role_arn: str | None
    publisher_role_arn: str | None
    kms_key_arn: str | None


@dataclass(frozen=True)
class Injection:
    mode: str                      # inject | verify
    on_live: str                   # refuse | drift


@dataclass(frozen=True)
class Bootstrap:
    image: str | None
    artifact_uri: str | None
    artifact_sha256: str | None
    allow_non_nvme: bool
    namespace: str
    image_prepull_timeout: str

    @property
    def image_prepull_timeout_s(self) -> int:
        return parse_duration_s(self.image_prepull_timeout)


@dataclass(frozen=True)
class WarmProfile:
    name: str
    model: Model
    weights: Weights
    serving: Serving
    nodes: Nodes
    compile_cache: CompileCache
    readiness: Readiness
    bootstrap: Bootstrap
    injection: Injection
    aws: Aws
    raw: dict = field(repr=False, compare=False, default_factory=dict)
    models: tuple[ExtraModel, ...] = ()     # spec.models; spec.model is the first model
    # Set on a model's view (api/models.py: the profile as one of its spec.models sees it): the profile's name.
    parent: str | None = None

    @property
    def concurrency(self) -> int | None:
        """The streamer's concurrency for this model; None without a size (a further model not required may leave
        it out): the streamer's own default then (16 threads from a file system), not a guess at the formula's."""
        if self.model.size_gb is None:
            return None
        return streamer_concurrency(self.model.size_gb, self.serving.chunk_size_gb)

    @property
    def uses_daemonset(self) -> bool:
        """Auto Mode has no user data and Bottlerocket has no shell: there the agent is a DaemonSet (a pod)."""
        return self.nodes.mode == "automode" or self.nodes.ami_alias.startswith("bottlerocket@")

    @property
    def pods_need_aws(self) -> bool:
        """Whether a nodewarm pod (the DaemonSet agent, the publisher sidecar) needs AWS credentials."""
        return self.uses_daemonset or self.compile_cache.publisher is not None

    def with_size(self, size_gb: float) -> "WarmProfile":
        return replace(self, model=replace(self.model, size_gb=size_gb))


def cold_mode(p: WarmProfile) -> str:
    """What the vLLM pod does on a node whose copy of the weights is not complete: ``stream`` them from S3 when the
    pod has an AWS identity that may read the model (only the compile-cache publisher gives it one, through
    podIdentity or irsa), else ``wait`` for the node agent's copy. The start script acts on it
    (nodewarm/nodeclasses/servestart.py) and the controller says it when it lifts a taint cold."""
    if p.compile_cache.publisher is not None and p.aws.identity in ("podIdentity", "irsa"):
        return "stream"
    return "wait"


def engine_check_image(p: WarmProfile) -> str | None:
    """The image the engine-check pod runs: it must hold nodewarm (the pod runs `nodewarm engine-check`) and the
    serving runtime (it boots vLLM). engineCheck.image, else the publisher's image, which is already required to be
    the serving image with nodewarm installed; None when neither is set (profile.check_engine_check refuses it)."""
    e = p.readiness.engine_check
    if e.image:
        return e.image
    return p.compile_cache.publisher.image if p.compile_cache.publisher is not None else None
