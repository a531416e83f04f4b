"""How a controller replica runs: the flags of `nodewarm controller` (cli.py) as one typed value."""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass, field

from nodewarm.api.warmprofile import WarmProfile


@dataclass(frozen=True)
class ControllerOptions:
    dry_run: bool = False
    workers: int = 4
    leader_elect: bool = False
    lease_namespace: str = "nodewarm"
    lease_name: str = "nodewarm-controller"
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}")
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    metrics_port: int | None = None       # None: no endpoint; 0: any free port (tests)
    health_port: int | None = None
    bind_address: str = "0.0.0.0"
    profiles: tuple[WarmProfile, ...] = ()   # from --profile files, in addition to WarmProfile objects
    watch_profiles: bool = True
    watch_timeout_s: int = 300
    resync_s: float = 300.0
    instance_source: str = "offline"
    event_namespace: str = "default"
    list_page_size: int = 250              # objects per list page: bounds the memory of a (re)list
    replace_budget: int = 3                # onDeadline=replace: replacements per NodePool per window
    replace_window_s: float = 3600.0
    replace_backoff_s: float = 60.0        # wait after the k-th replacement: this x 2**(k-1), capped
    replace_backoff_max_s: float = 1800.0
