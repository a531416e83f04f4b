"""The agent's part in peers before S3 (docs/peers.md): serve every model this node pulls, find the others, keep the
key.

Started by the Follower when the profile has ``spec.weights.peers.enabled``, and alive as long as the agent, so a
warm node keeps feeding nodes that scale up after it. With the node's own identity it:

* reads the profile's key from the Secret the controller mints (a RoleBinding lets only this profile's nodes
  read it), again every KEY_REFRESH_S so a rotation reaches it well inside the previous key's grace period;
* serves on its Node's InternalIP and the profile's port only (serve.py);
* says where it serves and which models it holds, each pulling or warm, in its own Node's PEER_ANNOTATION (through
  ``nodes/status``, like its other reports), and follows the profile's Nodes with one list and a watch for the
  others';
* stops serving and withdraws the annotation as soon as its Node is cordoned or marked for drain.

Any failure here only means fewer peers: a pull without peers is the pull without this module.
"""

from __future__ import annotations

import base64
import math
import threading
from pathlib import Path

from nodewarm import logs
from nodewarm.api.names import (
    PEER_ANNOTATION, PEER_KEY_CURRENT, PEER_KEY_PREVIOUS, PROFILE_LABEL, peer_secret_name,
)
from nodewarm.api.warmprofile import WarmProfile

from .. import podwatch, profilesource
from ..nodestatus import report_progress
from . import directory
from .auth import PeerKeys
from .fetch import Peer, PeerSource
from .holdings import Holdings, Shelf
from .serve import PeerServer

log = logs.get("bootstrap.peering")

# How often the key is read again; the controller's rotation keeps the previous key valid for a whole period
# (spec.weights.peers.keyRotation, hours), so a minute's lag never breaks a pull.
KEY_REFRESH_S = 60.0
# While no key could be read (the controller has not bound this node yet): ask again this often.
KEY_RETRY_S = 2.0
# How long start() waits for the first list of the profile's Nodes: a pull that began before it would take from S3
# what the warm nodes already hold. One list answers in milliseconds; an API server that does not is not waited for.
DIRECTORY_WAIT_S = 5.0


class Peering:
    """This node's part in its profile's peers, for every model it pulls (modelcache/warmer.py begins each pull here)."""

    def __init__(self, api_client, node_name: str, profile: WarmProfile):
        self.api, self.node_name, self.profile = api_client, node_name, profile
        self.cfg = profile.weights.peers
        self._done = threading.Event()  # close() was called: the agent is stopping
        self.lock = threading.Lock()
        self._listed = threading.Event()   # the first list is in
        self._keys: PeerKeys | None = None
        self._peers: dict[str, list[Peer]] = {}    # model key -> the other nodes that offer it
        self.server: PeerServer | None = None
        self.shelf = Shelf()                        # what the server serves: every model begun and not dropped
        # model key -> what this node says of it (pulling|warm), in the order begun: the first one names the entry.
        self._states: dict[str, str] = {}
        self.holdings: Holdings | None = None       # the last pull begun's
        self.host: str | None = None
        self.withdrawn: str | None = None  # why this node no longer serves (cordoned, draining)
        self._threads: list[threading.Thread] = []

    # -- what the pull uses --------------------------------------------------------------------------------
    def keys(self) -> PeerKeys | None:
        with self.lock:
            return self._keys

    def directory(self, model: str) -> list[Peer]:
        with self.lock:
            return list(self._peers.get(model, ()))

    def source(self, model: str) -> PeerSource:
        return PeerSource(self.node_name, lambda: self.directory(model), self.keys)

    # -- life ----------------------------------------------------------------------------------------------
    def start(self) -> "Peering":
        node = profilesource.get_node(self.api, self.node_name)
        self.host = directory.internal_ip(node)
        if self.host is None:
            log.warning("peers.no_internal_ip", node=self.node_name, then="this node reads from peers but serves none")
        self._read_keys()
        for target, name in ((self._follow_nodes, "peers-directory"), (self._refresh_keys, "peers-keys")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        if not self._listed.wait(DIRECTORY_WAIT_S):
            log.warning("peers.directory_late", waited_s=DIRECTORY_WAIT_S, then="pulling; peers join as the list comes")
        return self

    def begin(self, dest: Path, model: str) -> tuple[PeerSource, Holdings]:
        """A pull of ``model`` (its key) into ``dest`` starts: serve its files from there as they are verified, say
        so, and read from the nodes that offer it. Returns what the pull takes (WeightsConfig.peers, .holdings)."""
        holdings = Holdings(dest)
        with self.lock:
            self._states[model] = "pulling"
            self.holdings = holdings
        self.shelf.put(model, holdings)
        with self.lock:     # one server for every model, even when two pulls begin at once (the first model's roll)
            if self.server is None and self.host is not None and self.withdrawn is None:
                try:
                    self.server = PeerServer(self.host, self.cfg.port, self.shelf, self.keys,
                                             self.cfg.max_connections, self.cfg.max_mbps * 1e6).start()
                except (OSError, ValueError) as e:  # the port taken, the address not this host's: read, never serve
                    log.warning("peers.not_serving", address=f"{self.host}:{self.cfg.port}", error=str(e)[:300],
                                then="this node reads from peers but serves none")
        self._announce()
        return self.source(model), holdings

    def warm(self, model: str) -> None:
        """Every file of ``model`` is verified here: a peer may ask for any part."""
        with self.lock:
            if model not in self._states:
                return
            self._states[model] = "warm"
        self._announce()

    def failed(self, model: str, why: str) -> None:
        """The pull of ``model`` failed: stop offering it, or the others would wait for the parts this node owns (up
        to fetch.WAIT_S each) while it retries only minutes later. The next begin() offers it again."""
        self._drop(model, f"the pull failed: {why}")

    def forget(self, model: str) -> None:
        """``model``'s folder left this node (evicted, or an older generation removed): stop offering it."""
        self._drop(model, "its folder was removed")

    def _drop(self, model: str, why: str) -> None:
        with self.lock:
            if self._states.pop(model, None) is None:
                return
            left = bool(self._states)
        self.shelf.drop(model)
        if left:
            self._announce()
        else:
            self._unannounce(why)   # leave the directory: this node offers nothing now

    def _announce(self) -> None:
        """Write this node's entry: every model it serves, each pulling or warm."""
        with self.lock:
            states = dict(self._states)
        if not states or self.server is None or self.withdrawn is not None or self.keys() is None:
            return  # without the key every peer's request would be refused: it is announced once the key is read
        first, *others = states
        held = self.shelf.get(first)
        value = directory.annotation(self.profile.name, self.host, self.server.address[1], states[first], first,
                                     held.summary() if held else {}, {m: states[m] for m in others})
        try:
            report_progress(self.api, self.node_name, {PEER_ANNOTATION: value})
            log.info("peers.announced", state=states[first], endpoint=f"{self.host}:{self.server.address[1]}",
                     models=states)
        except Exception as e:  # noqa: BLE001 - peers find this node later, or never: the pull goes on regardless
            log.warning("peers.announce_failed", state=states[first], error=str(e)[:300])

    def withdraw(self, why: str) -> None:
        """Stop serving and take this node out of the others' directories."""
        if self.withdrawn is not None:
            return
        self.withdrawn = why
        if self.server is not None:
            self.server.stop()
        self._unannounce(why)

    def _unannounce(self, why: str) -> None:
        try:
            report_progress(self.api, self.node_name, {PEER_ANNOTATION: None})
        except Exception as e:  # noqa: BLE001 - the others drop it on their next ask that fails
            log.warning("peers.unannounce_failed", error=str(e)[:300])
        log.info("peers.unannounced", why=why, node=self.node_name)

    def close(self) -> None:
        self._done.set()
        if self.server is not None:
            self.server.stop()
        for t in self._threads:
            t.join(timeout=5)

    # -- the threads ---------------------------------------------------------------------------------------
    def _read_keys(self) -> bool:
        ns, name = self.profile.bootstrap.namespace, peer_secret_name(self.profile.name)
        try:
            secret = profilesource._request(self.api, "GET", f"/api/v1/namespaces/{ns}/secrets/{name}")
            data = secret.get("data") or {}
            prev = data.get(PEER_KEY_PREVIOUS)
            keys = PeerKeys(base64.b64decode(data[PEER_KEY_CURRENT]), base64.b64decode(prev) if prev else None)
        except Exception as e:  # noqa: BLE001 - no key (or a malformed one): no peers, the pull is S3's
            log.warning("peers.key_unread", secret=f"{ns}/{name}", error=str(e)[:200],
                        then="no peers until it can be read (the controller binds it to this node)")
            return False
        with self.lock:
            first, changed = self._keys is None, self._keys != keys
            self._keys = keys
        if changed:
            log.info("peers.key_read", secret=f"{ns}/{name}")
        if first:
            self._announce()
        return True

    def _refresh_keys(self) -> None:
        ok = self._keys is not None
        while not self._done.wait(KEY_REFRESH_S if ok else KEY_RETRY_S):
            ok = self._read_keys()

    def _look(self, nodes: dict[str, dict]) -> None:
        """The follow's callback on every event: never an answer, so the follow goes on until close()."""
        me = nodes.get(self.node_name)
        if me is not None and (why := directory.leaving(me)) is not None:
            self.withdraw(why)
        peers: dict[str, list[Peer]] = {}
        for name, node in nodes.items():
            if name != self.node_name:
                for model, p in directory.offers(node, self.profile.name).items():
                    peers.setdefault(model, []).append(p)
        with self.lock:
            before, self._peers = self._peers, peers
        for model in sorted(peers.keys() | before.keys()):
            now = sorted(p.node for p in peers.get(model, ()))
            if now != sorted(p.node for p in before.get(model, ())):
                log.info("peers.directory", peers=now, model=model)
        self._listed.set()

    def _follow_nodes(self) -> None:
        query = [("labelSelector", f"{PROFILE_LABEL}={self.profile.name}")]
        while not self._done.is_set():
            try:
                podwatch.follow(self.api, "", query, self._look, left=lambda: math.inf, stop=self._done,
                                what="peers", logger=log, path="/api/v1/nodes")
            except Exception as e:  # noqa: BLE001 - 403 and the like: no directory, no peers
                log.warning("peers.directory_failed", error=str(e)[:300], then="retrying")
                self._done.wait(KEY_RETRY_S)
