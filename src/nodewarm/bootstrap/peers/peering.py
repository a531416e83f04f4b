"""The agent's part in peers before S3 (docs/peers.md): serve what this node holds, find the others, keep the key.

Started by the Follower when the profile has ``spec.weights.peers.enabled``, and alive as long as the agent, so a
warm node keeps feeding nodes that scale up after it. With the node's own identity it:

* reads the profile's key from the Secret the controller mints (a RoleBinding lets only this profile's nodes
  read it), again every KEY_REFRESH_S so a rotation reaches it well inside the previous key's grace period;
* serves on its Node's InternalIP and the profile's port only (serve.py);
* says where it serves and what it holds in its own Node's PEER_ANNOTATION (through ``nodes/status``, like its other
  reports), and follows the profile's Nodes with one list and a watch for the others';
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
from .serve import Holdings, PeerServer

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
    def __init__(self, api_client, node_name: str, profile: WarmProfile):
        self.api, self.node_name, self.profile = api_client, node_name, profile
        self.cfg = profile.weights.peers
        self._done = threading.Event()  # close() was called: the agent is stopping
        self.lock = threading.Lock()
        self._nodes: dict[str, dict] = {}  # the profile's Nodes as last seen
        self._listed = threading.Event()   # the first list is in
        self._keys: PeerKeys | None = None
        self._peers: dict[str, Peer] = {}
        self.server: PeerServer | None = None
        self.holdings: Holdings | None = None
        self.host: str | None = None
        self.model = ""
        self.state: str | None = None  # what this node last said it is (pulling|warm), once it has a key to say it
        self.withdrawn: str | None = None  # why this node no longer serves (cordoned, draining)
        self._threads: list[threading.Thread] = []

    # -- what the pull uses --------------------------------------------------------------------------------
    def keys(self) -> PeerKeys | None:
        with self.lock:
            return self._keys

    def directory(self) -> list[Peer]:
        with self.lock:
            return list(self._peers.values())

    def source(self) -> PeerSource:
        return PeerSource(self.node_name, self.directory, self.keys)

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

    def begin(self, dest: Path, model: str) -> None:
        """A pull of ``model`` into ``dest`` starts: serve its files from there, say so."""
        with self.lock:
            self.model = model
            nodes = dict(self._nodes)
        self._look(nodes)  # the directory is per model
        self.holdings = Holdings(dest)
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.host is not None and self.withdrawn is None:
            try:
                self.server = PeerServer(self.host, self.cfg.port, self.holdings, self.keys, self.cfg.max_connections,
                                         self.cfg.max_mbps * 1e6).start()
            except (OSError, ValueError) as e:  # the port taken, the address not this host's: read, never serve
                log.warning("peers.not_serving", address=f"{self.host}:{self.cfg.port}", error=str(e)[:300],
                            then="this node reads from peers but serves none")
                return
            self.announce("pulling")

    def warm(self) -> None:
        """Every file of the model is verified here: a peer may ask for any part."""
        self.announce("warm")

    def failed(self, why: str) -> None:
        """The pull failed: leave the directory, or the others would wait for the parts this node owns (up to
        fetch.WAIT_S each) while it retries only minutes later. The next begin() announces it again."""
        self.state = None
        self._unannounce(f"the pull failed: {why}")

    def announce(self, state: str) -> None:
        self.state = state
        if self.server is None or self.withdrawn is not None or self.keys() is None:
            return  # without the key every peer's request would be refused: it is announced once the key is read
        value = directory.annotation(self.profile.name, self.host, self.server.address[1], state, self.model,
                                         self.holdings.summary() if self.holdings else {})
        try:
            report_progress(self.api, self.node_name, {PEER_ANNOTATION: value})
            log.info("peers.announced", state=state, endpoint=f"{self.host}:{self.server.address[1]}")
        except Exception as e:  # noqa: BLE001 - peers find this node later, or never: the pull goes on regardless
            log.warning("peers.announce_failed", state=state, error=str(e)[:300])

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
        if first and self.state is not None:
            self.announce(self.state)
        return True

    def _refresh_keys(self) -> None:
        ok = self._keys is not None
        while not self._done.wait(KEY_REFRESH_S if ok else KEY_RETRY_S):
            ok = self._read_keys()

    def _look(self, nodes: dict[str, dict]) -> None:
        """The follow's callback on every event: never an answer, so the follow goes on until close()."""
        with self.lock:
            self._nodes = nodes
        me = nodes.get(self.node_name)
        if me is not None and (why := directory.leaving(me)) is not None:
            self.withdraw(why)
        with self.lock:
            model = self.model
        peers = {}
        for name, node in nodes.items():
            if name != self.node_name and (p := directory.peer_of(node, self.profile.name, model)) is not None:
                peers[name] = p
        with self.lock:
            if peers.keys() != self._peers.keys():
                log.info("peers.directory", peers=sorted(peers), model=model)
            self._peers = peers
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
