"""The profile's further models on this node (spec.models, docs/models.md): warmed, rolled and evicted after Warm.

The first model, and every further one marked ``required``, is pulled before the node reports Warm (agent.py,
``AgentConfig.extras``). The rest are this module's: once the node serves, one background thread pulls them in
priority order, throttled (spec.weights.background: few connections, a bandwidth cap, the lowest CPU priority), so
the serving pods' own I/O and CPU come first. Each is warmed as the agent warms its models (warmer.py: its weights,
from peers too when they are on, and its compile cache). The same thread rolls a further model to a new generation
beside the old one (files whose content did not change are linked, not pulled: WeightsConfig.link_from) and removes
folders no pod uses any more. What to hold, which folders pods use and what may make room is plan.py's (pure); this
module is the I/O around it.

Everything the node holds is reported on its Node (report.py); the controller alone turns that report into the
models' labels, which the models' Deployments require. So a model's files go only after its label: the agent
reports it ``evicting``, waits until the label is gone, looks again that no pod on the node mounts it (the API's
pods, not a guess), and only then removes the folder, whole or not at all (store.evict; a crash in between is
finished at the next start).

When a model does not fit and even the folders that may make room (plan.protected, store.plan_eviction) are not
enough, the model is reported failed with reason NoCapacity and the sizes, and nothing on disk changes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

from nodewarm import logs
from nodewarm.api.models import EVICTING, FAILED, NO_CAPACITY, PULLING, WARM, HeldModel
from nodewarm.api.names import MODEL_LABEL_PREFIX
from nodewarm.api.podlayout import MODELS_ROOT
from nodewarm.api.timeutil import fmt_time_s
from nodewarm.api.warmprofile import WarmProfile

from .. import profilesource
from ..weights.manifest import STATE_DIR
from . import store
from .background import pull_overrides
from .plan import Target, agent_pods, in_use, protected, targets, used_folders
from .report import Book
from .warmer import Warmer

log = logs.get("bootstrap.models")


def _now() -> str:
    return fmt_time_s(time.time())


class ModelSet:
    """The background worker for the profile's further models on this node (see the module doc).

    ``follow(p)`` hands it the profile as it is now; ``round()`` is one pass (warm what is missing in order, then
    remove what no model of the profile uses); the thread runs a round at each change and every ``opts.retry_s``."""

    def __init__(self, api, opts, book: Book, stop: threading.Event, node_labels=None):
        self.api, self.opt, self.book, self.stop = api, opts, book, stop
        self.node_labels = dict(node_labels or {})
        self.peering = None     # peers.peering.Peering while the profile has peers on (the Follower's)
        self._profile: WarmProfile | None = None
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # What the worker did, for the demo and the tests: view name -> its last pull; folders evicted, in order.
        self.results: dict[str, dict] = {}
        self.evicted: list[str] = []

    @property
    def models_root(self) -> Path:
        return self.opt.mount / MODELS_ROOT

    def follow(self, p: WarmProfile, background: bool = True) -> None:
        self._profile = p
        self._wake.set()
        if background and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="models", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self.stop.is_set():
            self._wake.wait(self.opt.retry_s)
            self._wake.clear()
            if self.stop.is_set():
                break
            try:
                self.round()
            except Exception as e:  # noqa: BLE001 - one bad round must not end the worker; the next one retries
                log.error("models.round_failed", error=f"{type(e).__name__}: {str(e)[:300]}", exc_info=True)

    # -- one pass ------------------------------------------------------------------------------------------
    def round(self) -> None:
        p = self._profile
        if p is None:
            return
        wanted = targets(p, self.opt.mount)
        for t in wanted[1:]:        # the first model is the Follower's (its rewarm waits for its old pods)
            if self.stop.is_set():
                return
            if not self._holds(t):
                self._warm(p, t, wanted)
        self._collect(p, wanted)
        self.book.publish()

    def _holds(self, t: Target) -> bool:
        m = self.book.get(t.name)
        return m is not None and m.state == WARM and m.generation == t.generation and (t.dest / STATE_DIR).is_dir()

    def _warm(self, p: WarmProfile, t: Target, wanted: tuple[Target, ...]) -> None:
        from nodewarm.api.errors import NodewarmError

        old = self.book.get(t.name)
        serving = old is not None and old.state == WARM and old.generation != t.generation
        pending = (replace(old, pending=t.generation, reason="", message="") if serving else
                   HeldModel(t.name, PULLING, key=t.dest.name, required=t.required, priority=t.priority,
                             pending=t.generation))
        m, warmer = t.model, self._warmer(p)
        try:
            short = self._make_room(p, t, wanted)
            if short is not None:
                self._failed(t, pending, old, serving, NO_CAPACITY, short)
                return
            self.book.put(pending)
            self.book.publish()
            # Files with the same bytes in any folder held verified are linked, not pulled (a roll's unchanged ones).
            others = tuple(h.path for h in store.held(self.models_root) if h.complete and h.path != t.dest)
            summary = warmer.weights(m, stop=self.stop, link_from=others,
                                     pull_overrides=pull_overrides(p.weights.background))
        except NodewarmError as e:
            self._failed(t, pending, old, serving, e.reason, " ".join(str(e).split()))
            return
        # Beside the other models' bundles; the publisher's hit/miss baseline stays the first model's.
        cache = warmer.compile_cache(m)
        self.results[t.name] = {"generation": t.generation, "downloadedBytes": summary.downloaded_bytes,
                                "linkedFiles": summary.linked_files, "linkedBytes": summary.linked_bytes,
                                "files": summary.files, "bytes": summary.bytes,
                                "compileCache": f"{cache.status} {cache.reason}"}
        store.touch_used(t.dest, time.time())
        self.book.put(m.held(summary, _now()))
        self.book.publish()
        log.info("models.warm", model=t.name, generation=t.generation, previous=old.generation if serving else None,
                 **{k: v for k, v in self.results[t.name].items() if k != "generation"})

    def _failed(self, t: Target, pending: HeldModel, before: HeldModel | None, serving: bool, reason: str,
                message: str) -> None:
        """The model stays as it was (the old generation keeps serving during a roll) and says why."""
        if before is None or (before.reason, before.message) != (reason, message):     # said once, not each round
            log.error("models.not_warm", model=t.name, generation=t.generation, reason=reason, message=message)
        if serving:
            self.book.put(replace(pending, reason=reason, message=message))
        else:
            self.book.put(replace(pending, state=FAILED, reason=reason, message=message))
        self.book.publish()

    def _warmer(self, p: WarmProfile) -> Warmer:
        """How this node warms ``p``'s models now (the profile's settings as they are at this round)."""
        return Warmer(mount=self.opt.mount, host_root=self.opt.host_root,
                      allow_non_nvme=self.opt.allow_non_nvme or p.bootstrap.allow_non_nvme,
                      load_check=self.opt.load_check, headroom=self.opt.headroom,
                      compile_cache_uri=p.compile_cache.uri, verify_key=p.compile_cache.verify_key,
                      runtime=self.opt.runtime, node_labels=self.node_labels, peering=self.peering)

    # -- room ----------------------------------------------------------------------------------------------
    def _bytes(self, t: Target) -> int:
        if t.view.model.size_gb is not None:
            return int(t.view.model.size_gb * 1e9)
        from ..s3client import make_client
        from ..weights import listing, manifest, s3pull

        retry = s3pull.PullConfig().retry
        listed, _ = listing.list_keys(make_client(1, 5.0, 30.0), manifest.parse_s3_uri(t.view.model.uri), retry)
        return sum(o.size for o in listed)

    def _used(self, p: WarmProfile) -> set[Path]:
        return used_folders(profilesource.pods_on_node(self.api, self.opt.node_name), p.nodes.cache_mount,
                            self.opt.mount, agent_pods(p, self.opt.agent_pod))

    def _make_room(self, p: WarmProfile, t: Target, wanted: tuple[Target, ...]) -> str | None:
        """None when ``t`` fits, after evicting what may go; else why not, with the sizes (nothing evicted)."""
        from ..weights import capacity

        need = self._bytes(t)
        need += self.opt.headroom.for_bytes(need)
        t.dest.parent.mkdir(parents=True, exist_ok=True)
        free = capacity.free_space(str(t.dest.parent)).free_bytes
        if need <= free:
            return None
        held = [h for h in store.held(self.models_root) if h.path != t.dest]
        keep = protected(t, wanted, self._used(p), held)
        plan = store.plan_eviction(held, need, free, keep)
        if not plan.ok:
            return f"{t.name}: {plan.message}"
        for h in plan.evict:
            if not self._evict(p, h):
                return (f"{t.name}: {need / 1e9:.2f} GB needed with headroom, {free / 1e9:.2f} GB free; evicting "
                        f"{h.view}/{h.key} was given up (see the agent's log)")
        return None

    def _evict(self, p: WarmProfile, h: store.Held) -> bool:
        """Label first (through the controller), then a last look at the pods, then the folder, whole."""
        name = h.view
        m = self.book.get(name)
        labelled = m is not None and m.key == h.key and m.state in (WARM, EVICTING)
        if labelled:
            self.book.put(replace(m, state=EVICTING, reason="", message="making room for another model"))
            self.book.publish()
            if not self._label_gone(name):
                log.warning("models.evict_given_up", model=name, why="the controller did not take its label off "
                            f"within {self.opt.label_wait_s:.0f}s")
                self.book.put(m)
                self.book.publish()
                return False
        if in_use(h.path, self._used(p)):
            log.warning("models.evict_given_up", model=name, why="a pod on this node mounts it now")
            if labelled:
                self.book.put(m)
                self.book.publish()
            return False
        store.evict(self.models_root, h.path)
        if self.peering is not None:
            self.peering.forget(h.key)
        if labelled:
            self.book.drop(name)
            self.book.publish()
        log.info("models.evicted", model=name, folder=str(h.path), bytes=h.bytes)
        self.evicted.append(f"{name}/{h.key}")
        return True

    def _label_gone(self, name: str) -> bool:
        key = f"{MODEL_LABEL_PREFIX}{name}"
        deadline = time.monotonic() + self.opt.label_wait_s
        while not self.stop.is_set():
            labels = (profilesource.get_node(self.api, self.opt.node_name).get("metadata") or {}).get("labels") or {}
            if key not in labels:
                return True
            if time.monotonic() >= deadline:
                return False
            self.stop.wait(0.5)
        return False

    # -- clean-up ------------------------------------------------------------------------------------------
    def _collect(self, p: WarmProfile, wanted: tuple[Target, ...]) -> None:
        """Folders of further models that no model of the profile wants now (an old generation after a roll, a
        model taken out) go once no pod mounts them; the folders in use are marked used now (the LRU's clock)."""
        keep = {t.dest for t in wanted}
        used = self._used(p)
        now = time.time()
        for h in store.held(self.models_root):
            busy = in_use(h.path, used)
            if busy:
                store.touch_used(h.path, now)
                m = self.book.get(h.view)
                if m is not None and m.key == h.key:
                    self.book.put(replace(m, last_used=_now()))
            first = h.view == p.name          # the first model's old folders are Follower.collect_garbage's
            mine = h.view.startswith(f"{p.name}-")
            if h.path in keep or busy or first or not mine:
                continue
            self._evict(p, h)
        names = {t.name for t in wanted}
        for m in self.book.all():
            if m.name not in names and not (self.models_root / m.name).exists():
                self.book.drop(m.name)
