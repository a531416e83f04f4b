"""What a reconciler may use of the manager (manager.py): the options, the client, the caches and their indexes, the
event recorder, the metrics, the work queue and the Lease's clock and flag. A Protocol, so that the manager imports the
reconcilers and never the other way round (tests/packaging/test_imports.py: no import circles)."""

from __future__ import annotations

import threading
from collections import deque
from typing import Protocol

from nodewarm.api.views import ClaimView, NodeView
from nodewarm.logs import Logger

from .events import EventRecorder
from .kube import Kube
from .metrics import Metrics
from .options import ControllerOptions
from .reflector import Reflector
from .profiles import ProfileIndex
from .workqueue import WorkQueue


class Manager(Protocol):
    opt: ControllerOptions
    kube: Kube
    metrics: Metrics
    events: EventRecorder
    log: Logger
    queue: WorkQueue
    claims: Reflector               # ClaimView by name
    nodes: Reflector                # NodeView by name
    daemonsets: Reflector           # warmprofile.deviceplugins.DaemonSetView by namespace/name
    profile_index: ProfileIndex
    decisions: deque[tuple[str, str]]   # (NodeClaim, action) carried out, the latest few thousand
    is_leader: threading.Event      # set while this replica holds the Lease (or runs without leader election)

    def node_for(self, claim: ClaimView) -> NodeView | None:
        """The cached Node paired with ``claim`` (by providerID)."""

    def claim_for(self, node: NodeView) -> str | None:
        """The name of the cached NodeClaim ``node`` belongs to (by providerID)."""

    def write_timeout(self) -> float | None:
        """The timeout a write may take while the Lease still covers it; raises leader.NotLeading when none."""
