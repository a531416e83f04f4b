"""The node agent as a service: warm for the WarmProfile once, then follow it.

A serving or model change must roll without replacing nodes, so the agent keeps running after the first
warm (the systemd unit on AL2023, the DaemonSet elsewhere), sees its profile change, and warms the new
generation on a node that is already serving:

* beside the old one when the NVMe has room (the weights go to their own folder, api.generation.model_key;
  a new serving image or TP re-uses the weights already there);
* otherwise once no pod of an older generation runs on this node any more, after freeing their weights.

When the new generation is warm it relabels the Node (``nodewarm.io/generation``); the rendered Deployment
selects that label, so a rolling update lands new pods only on nodes warm for them. The startup taint is a
new node's business only: a node that serves is never re-tainted, and its Warm condition stays True.

What it decides without the cluster (its options, the agent's configuration, which older weights may go) is
followplan.py's; this module is the loop and the I/O around it.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

from nodewarm import logs
from nodewarm.api.errors import NodewarmError
from nodewarm.api.names import MODELS_ANNOTATION
from nodewarm.api.warmprofile import WarmProfile

from . import agent, profilesource
from .followplan import FollowOptions, agent_config, older_pods, stale_model_dirs
from .modelcache import modelset, store
from .modelcache.report import Book
from .nodestatus import report_progress, report_warm

log = logs.get("bootstrap.follow")

REWARM_ANNOTATION = "nodewarm.io/rewarm"


class Follower:
    def __init__(self, api_client, opts: FollowOptions, stop: threading.Event | None = None):
        self.api, self.opt = api_client, opts
        self.stop = stop or threading.Event()
        self.held: profilesource.Resolved | None = None     # the generation this node is warm for
        self.last: agent.AgentResult | None = None
        self._failed_at: float | None = None
        self.peering = None     # peers.peering.Peering while the profile has peers on
        # The profile's further models (spec.models): reported on the Node, the ones not required warmed here.
        self.book = Book(lambda ann: report_progress(api_client, opts.node_name, ann))
        self.models = modelset.ModelSet(api_client, opts, self.book, self.stop)
        self.snapshot_events = None     # snapshot.events.Reporter while the profile has serving.snapshot on

    def _peering(self, p: WarmProfile):
        """The profile's peers, started, restarted for new settings, or closed when turned off."""
        want = p.weights.peers if p.weights.peers.enabled and self.api is not None else None
        if self.peering is not None and (want is None or self.peering.cfg != want):
            self.peering.withdraw("peers turned off or changed in the profile")
            self.peering.close()
            self.peering = None
        if want is not None and self.peering is None:
            from .peers.peering import Peering

            try:
                self.peering = Peering(self.api, self.opt.node_name, p).start()
            except Exception as e:  # noqa: BLE001 - without peers the pull is S3's, as before
                log.warning("peers.not_started", error=str(e)[:300])
        self.models.peering = self.peering
        return self.peering

    def _remove(self, folder: Path, why: str) -> None:
        """An older generation's weights go: from the disk, and from what this node offers its peers."""
        shutil.rmtree(folder)
        log.info("weights.removed", dir=str(folder), why=why)
        if self.peering is not None:
            self.peering.forget(folder.name)

    def close(self) -> None:
        if self.peering is not None:
            self.peering.close()
        self.models.close()

    def _models(self, p: WarmProfile, result: agent.AgentResult) -> None:
        """After a warm: what it warmed into the report, then the rest of the profile's models (in the background,
        or now with ``once``: the process ends after it)."""
        if not p.models:
            return
        for m in result.models:
            self.book.put(m)
        self.models.node_labels = self._node_labels()
        self.models.follow(p, background=not self.opt.once)
        if self.opt.once:
            self.models.round()

    # -- the parts ---------------------------------------------------------------------------------------
    def _report_not_warm(self, reason: str, message: str) -> None:
        report_warm(self.api, self.opt.node_name, False, reason, message)

    def _wait_for_profile(self) -> dict | None:
        reported = False
        while not self.stop.is_set():
            obj = profilesource.get_profile(self.api, self.opt.profile)
            if obj is not None:
                return obj
            if not reported:
                log.warning("profile.missing", profile=self.opt.profile)
                self._report_not_warm("ProfileNotFound", f"WarmProfile {self.opt.profile} does not exist; the "
                                      "node warms as soon as it is created")
                reported = True
            if self.opt.once:
                return None
            self.stop.wait(self.opt.poll_s)
        return None

    def _resolve(self, obj: dict) -> profilesource.Resolved | None:
        try:
            r = profilesource.resolve(obj, self.opt.mount)
        except NodewarmError as e:
            log.error("profile.invalid", profile=self.opt.profile, error=e.one_line())
            if self.held is None:
                self._report_not_warm("InvalidProfile", e.one_line())
            return None
        if not os.environ.get("AWS_REGION"):
            region = profilesource.region_for(r.profile, profilesource.get_node(self.api, self.opt.node_name))
            if region:
                os.environ["AWS_REGION"] = os.environ["AWS_DEFAULT_REGION"] = region
                log.info("region.resolved", region=region)
        return r

    def _node_labels(self) -> dict[str, str]:
        """This Node's labels (instance type, GPU name/count): the agent's hardware view where /proc has none."""
        try:
            return dict((profilesource.get_node(self.api, self.opt.node_name).get("metadata") or {}).get("labels") or {})
        except Exception as e:      # the labels only add to /proc; a failed read leaves the key to /proc alone
            log.warning("node.labels_unread", error=str(e)[:200])
            return {}

    def _snapshot_events(self, cfg: agent.AgentConfig) -> None:
        """With serving.snapshot, the runtime handler's decisions become Events on their pods for as long as the
        agent follows (snapshot/events.py)."""
        if cfg.snapshot is None or self.api is None or self.snapshot_events is not None or self.opt.once:
            return
        from .snapshot.events import Reporter

        self.snapshot_events = Reporter(self.api, self.opt.node_name, cfg.snapshot.store, self.stop).start()

    def first_warm(self, r: profilesource.Resolved) -> agent.AgentResult:
        cfg = agent_config(r, self.opt, self._node_labels(), self._peering(r.profile))
        self._snapshot_events(cfg)
        result = agent.run(cfg, self.api)
        self.last = result
        if result.warm:
            self.held, self._failed_at = r, None
            self._models(r.profile, result)
        else:
            self._failed_at = time.monotonic()
        return result

    def rewarm(self, r: profilesource.Resolved) -> bool:
        """Warm generation ``r`` on a node that serves ``self.held``. Returns whether the node now holds it."""
        cfg = agent_config(r, self.opt, self._node_labels(), self._peering(r.profile))
        log.info("rewarm.start", profile=r.profile.name, generation=r.generation, serving=self.held.generation)
        image_wait = agent.image_waiter(cfg, self.api)
        result = agent.warm(cfg, image_wait)
        if not result.warm and result.reason == "InsufficientNVMe" and self._free_older(r):
            result = agent.warm(cfg, image_wait)
        self.last = result
        if not result.warm:
            self._failed_at = time.monotonic()
            log.error("rewarm.failed", generation=r.generation, reason=result.reason, message=result.message)
            report_warm(self.api, self.opt.node_name, True, "WarmForOlderGeneration",
                        f"still warm for generation {self.held.generation}; generation {r.generation} failed: "
                        f"{result.reason}: {result.message}",
                        {REWARM_ANNOTATION: f"{r.generation} {result.reason}"})
            return False
        for m in result.models:
            self.book.put(m)
        extra = {REWARM_ANNOTATION: f"{r.generation} done"}
        if result.models:       # the report as a whole: the further models' entries are the book's, not the warm's
            extra[MODELS_ANNOTATION] = self.book.annotation()
        agent.report(self.api, cfg, result, extra)
        log.info("rewarm.done", generation=r.generation, previous=self.held.generation)
        self.held, self._failed_at = r, None
        self.collect_garbage()
        return True

    def _free_older(self, r: profilesource.Resolved) -> bool:
        """No room beside the old weights: wait until no older pod runs here, then remove the old weights."""
        stale = stale_model_dirs(r.model_dir.parent, keep=r.model_dir.name)
        if not stale:
            return False
        log.info("rewarm.waiting_for_old_pods", generation=r.generation, stale=[d.name for d in stale])
        while not self.stop.is_set():
            busy = older_pods(profilesource.pods_on_node(self.api, self.opt.node_name, r.profile.name), r.generation)
            if not busy:
                break
            log.info("rewarm.old_pods", pods=busy)
            self.stop.wait(self.opt.poll_s)
        if self.stop.is_set():
            return False
        for d in stale:
            self._remove(d, "no room for the new generation and no pod serves the old")
        return True

    def collect_garbage(self) -> None:
        """Free older weights once no pod of an older generation runs on this node."""
        if self.held is None:
            return
        stale = stale_model_dirs(self.held.model_dir.parent, keep=self.held.model_dir.name)
        if not stale:
            return
        pods = profilesource.pods_on_node(self.api, self.opt.node_name, self.held.profile.name)
        if older_pods(pods, self.held.generation):
            return
        for d in stale:
            self._remove(d, "no pod serves that generation on this node")

    def on_profile(self, obj: dict) -> None:
        r = self._resolve(obj)
        if r is None:
            return
        if self.held is None:
            self.first_warm(r)
            return
        if r.generation != self.held.generation:
            self.rewarm(r)
        else:
            self.held = replace(self.held, resource_version=r.resource_version)
        if r.profile.models or self.book.all():
            self.models.follow(r.profile)      # a further model added, rolled or taken out

    # -- the loop ----------------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> int:
        store.finish_evictions(self.models.models_root)    # a crash mid-eviction: finish it
        obj = self._wait_for_profile()
        if obj is None:
            return 1
        r = self._resolve(obj)
        if r is None:
            if self.opt.once:
                return 1
        else:
            self.first_warm(r)
        if self.opt.once:
            return 0 if self.held is not None else 1
        rv = (obj.get("metadata") or {}).get("resourceVersion", "")
        while not self.stop.is_set():
            rv = self._watch(rv)
            if self.held is None and self._failed_at is not None and \
                    time.monotonic() - self._failed_at >= self.opt.retry_s:
                obj = profilesource.get_profile(self.api, self.opt.profile)
                if obj is not None:
                    self.on_profile(obj)
            try:
                self.collect_garbage()
            except Exception as e:      # a failed clean-up must not stop the agent; it is retried next round
                log.warning("gc.failed", error=str(e)[:300])
        return 0

    def _watch(self, rv: str) -> str:
        import urllib3
        from kubernetes.client.exceptions import ApiException

        timeout = int(min(self.opt.watch_timeout_s, max(1.0, self.opt.retry_s)))
        try:
            for kind, obj in profilesource.watch_profile(self.api, self.opt.profile, rv, timeout):
                if self.stop.is_set():
                    break
                if kind == "ERROR":
                    raise ApiException(status=(obj or {}).get("code", 500), reason=(obj or {}).get("message"))
                rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                if kind == "DELETED":
                    log.warning("profile.deleted", profile=self.opt.profile,
                                note="the node keeps what it holds; the controller cleans up the pool")
                elif kind in ("ADDED", "MODIFIED"):
                    self.on_profile(obj)
        except ApiException as e:
            if e.status == 410:      # the resume point left the server's window: re-read, carry on from there
                obj = profilesource.get_profile(self.api, self.opt.profile)
                if obj is not None:
                    self.on_profile(obj)
                    return (obj.get("metadata") or {}).get("resourceVersion", "")
                return ""
            log.warning("watch.failed", status=e.status, reason=str(e.reason)[:200])
            self.stop.wait(min(self.opt.poll_s, 5.0))
        except (OSError, ValueError, urllib3.exceptions.HTTPError) as e:
            log.warning("watch.dropped", error=str(e)[:200])
            self.stop.wait(min(self.opt.poll_s, 5.0))
        return rv
