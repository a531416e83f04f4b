"""One model onto this node: its weights (from S3, from the profile's peers, linked from models held), its compile-cache
bundle and its entry in the node's report.

Every model goes through here, whoever warms it: the agent for the first model and the required ones before Warm
(agent.py), the model set for the rest once the node serves (modelset.py). So a fix to how a model is pulled, served
to peers or restored reaches every model, and peers serve every model the node pulls, not only the first. The order
of the steps stays the caller's: the agent restores the compile caches while the weights pull, the model set one
after the other.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from nodewarm.api.errors import NodewarmError
from nodewarm.api.models import WARM, HeldModel
from nodewarm.api.podlayout import CACHE_DIR, cache_dirs
from nodewarm.api.servingspec import ServingSpec

from ..weights import WeightsConfig, WeightsSummary, warm_weights
from ..weights.capacity import Headroom
from ..weights.loadcheck import StreamerTuning

# The compile cache is imported where it runs: the agent's start-up, up to the weights' first GET, never needs it
# (tests/bootstrap/test_agent_startup.py).
if TYPE_CHECKING:
    from ..compilecache import bundle, cachekey, restore
    from ..peers.peering import Peering


def node_cache_dirs(mount: Path) -> bundle.CacheDirs:
    """The host side of the vLLM pods' /compile-cache hostPath (api.podlayout), shared by every model's pods."""
    from ..compilecache.bundle import CacheDirs

    d = {k: Path(v) for k, v in cache_dirs(mount / CACHE_DIR).items()}
    return CacheDirs(vllm_root=d["vllm"], inductor=d["inductor"], triton=d["triton"], pch=d["pch"],
                     base=mount / CACHE_DIR)


@dataclass(frozen=True)
class Model:
    """One model of the profile as this node holds it: a view of the profile (api.models)."""

    name: str                   # the view's name
    uri: str
    dest: Path                  # its folder on the NVMe, named by its model key (api.generation.model_key)
    generation: str             # api.generation of the view
    spec: ServingSpec           # what vLLM serves it with: part of its compile-cache key
    required: bool = True       # the startup taint waits for it, and it is never evicted
    priority: int = 0           # as the node reports it (names.MODELS_ANNOTATION)

    @property
    def key(self) -> str:
        return self.dest.name

    def held(self, summary: WeightsSummary, at: str) -> HeldModel:
        """This model verified here, as the node reports it (names.MODELS_ANNOTATION); ``at`` is its last use."""
        return HeldModel(self.name, WARM, self.generation, key=self.key, bytes=summary.bytes, required=self.required,
                         priority=self.priority, last_used=at)


@dataclass(frozen=True)
class Warmer:
    """What warming any model on this node shares: the node's NVMe and hardware, the profile's compile cache and its
    peers."""

    mount: Path
    host_root: Path = Path("/")
    allow_non_nvme: bool = False
    load_check: bool = True
    headroom: Headroom | None = None                # None: the pull's default
    compile_cache_uri: str | None = None
    verify_key: str | None = None
    runtime: tuple[cachekey.RuntimeProbe, dict] | None = None   # the serving image's, when known
    node_labels: Mapping[str, str] = field(default_factory=dict)
    peering: Peering | None = field(default=None, compare=False)  # the profile's peers are on

    @property
    def cache_dirs(self) -> bundle.CacheDirs:
        return node_cache_dirs(self.mount)

    def weights(self, m: Model, stop: threading.Event | None = None, link_from: tuple[Path, ...] = (),
                streamer: StreamerTuning | None = None, pull_overrides: dict | None = None) -> WeightsSummary:
        """Pull and verify ``m``'s weights into its folder; a failure raises, as warm_weights does.

        With peers on, parts come from the profile's other nodes first, and this node serves the model to them from
        its first verified part on; it offers the model as warm once every file is verified here, and stops offering
        it when the pull fails (the others would wait for parts this node owns). ``link_from``: folders of models
        held verified, whose files with the same bytes are linked, not pulled; ``pull_overrides``: as WeightsConfig's.
        """
        peers = holdings = None
        if self.peering is not None:
            peers, holdings = self.peering.begin(m.dest, m.key)
        extra = {"headroom": self.headroom} if self.headroom is not None else {}
        try:
            summary = warm_weights(WeightsConfig(
                uri=m.uri, dest=m.dest, allow_non_nvme=self.allow_non_nvme, host_root=self.host_root,
                load_check=self.load_check, streamer=streamer, stop=stop, peers=peers, holdings=holdings,
                link_from=link_from, pull_overrides=dict(pull_overrides or {}), **extra))
        except NodewarmError as e:
            if self.peering is not None:
                self.peering.failed(m.key, e.reason)
            raise
        if self.peering is not None:
            self.peering.warm(m.key)
        return summary

    def compile_cache(self, m: Model) -> restore.RestoreResult:
        """Restore ``m``'s compile-cache bundle for this node's key, beside the other models' (each bundle's files are
        under its own hash folders). Never raises: any problem is a cold result, which only makes the model's first
        compile slower."""
        from ..compilecache import restore

        if not self.verify_key:
            return restore.RestoreResult("cold", "NoVerifyKey", "compileCache.verifyKey is not set: unsigned "
                                         "bundles are never restored")
        return restore.restore_for_node(self.compile_cache_uri, self.verify_key, m.spec, self.cache_dirs, self.runtime,
                                        host_root=self.host_root, node_labels=self.node_labels)
