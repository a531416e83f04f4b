"""Prometheus metrics and the /healthz, /readyz and /metrics endpoints.

Each Controller owns its own CollectorRegistry, so two controllers in one process (the leader
election test, the demo) do not collide on metric names.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# From "the taint came off within a second" to "the node sat there for the whole deadline".
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 2400)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.phase = Histogram("nodewarm_phase_duration_seconds",
                               "Time spent in each phase of a node's warm-up, per NodePool",
                               ["nodepool", "phase"], registry=r, buckets=BUCKETS)
        self.taints_removed = Counter("nodewarm_taints_removed_total",
                                      "Readiness taints removed because the node reported Warm", ["nodepool"], registry=r)
        self.taints_readded = Counter(
            "nodewarm_taints_readded_total", "Startup taints found back on a Warm node after nodewarm lifted them "
            "(Karpenter's registration merging the NodeClaim's startupTaints back, an operator, a re-apply), and "
            "lifted again", ["nodepool"], registry=r)
        self.deadlines = Counter("nodewarm_deadlines_total", "Nodes that missed readiness.deadline, by action taken",
                                 ["nodepool", "action"], registry=r)
        self.cache = Counter("nodewarm_compile_cache_total", "Compile-cache outcome of warmed nodes (cold at warm time, hit|miss proven in serving)",
                             ["nodepool", "result"], registry=r)
        self.injections = Counter("nodewarm_injections_total", "Server-side applies of NodeClass/NodePool fields",
                                  ["kind", "result"], registry=r)
        self.writes = Counter("nodewarm_api_writes_total", "Mutating API requests sent", ["resource", "verb"], registry=r)
        self.conflicts = Counter("nodewarm_conflicts_total", "Guarded patches that met a changed object and retried",
                                 ["resource"], registry=r)
        self.reconcile_errors = Counter("nodewarm_reconcile_errors_total", "Reconciles that failed and were retried",
                                        ["kind"], registry=r)
        self.queue_depth = Gauge("nodewarm_workqueue_depth", "Keys waiting in the work queue", registry=r)
        self.device_plugins_missing = Gauge(
            "nodewarm_device_plugins_missing_toleration",
            "Device plugin DaemonSets that may run on the profile's nodes but do not tolerate its startup taint "
            "(those nodes advertise no GPUs until the taint lifts)", ["profile"], registry=r)
        self.engine_checks = Counter(
            "nodewarm_engine_checks_total", "Engine checks (readiness.engineCheck) by what the controller did: "
            "started, passed|failed (with the node's reason), superseded, node_gone, not_started",
            ["nodepool", "outcome", "reason"], registry=r)
        self.engine_seconds = Histogram(
            "nodewarm_engine_check_seconds", "A passed engine check's vLLM boot (process start to /health) and first "
            "token (ready to the first completion)", ["nodepool", "what"], registry=r, buckets=BUCKETS)
        self.peer_keys = Counter(
            "nodewarm_peer_keys_total", "Peer key decisions (spec.weights.peers): mint, rotate, role, bind, unbind, "
            "remove carried out, forbidden (no RBAC in the bootstrap namespace)", ["profile", "action"], registry=r)
        self.model_labels = Counter(
            "nodewarm_model_labels_total", "Model labels (spec.models) set, switched to a new generation or removed on "
            "a profile's nodes, and models reported NoCapacity (told once per message)", ["profile", "action"],
            registry=r)
        self.leader = Gauge("nodewarm_leader", "1 while this replica holds the Lease", registry=r)

    def observe(self, nodepool: str, counters, durations, profile: str = "") -> None:
        for phase, secs in durations:
            self.phase.labels(nodepool, phase).observe(secs)
        for name, label in counters:
            if name == "taints_removed":
                self.taints_removed.labels(nodepool).inc()
            elif name == "taints_readded":
                self.taints_readded.labels(nodepool).inc()
            elif name == "deadline":
                self.deadlines.labels(nodepool, label).inc()
            elif name == "compile_cache":
                self.cache.labels(nodepool, label).inc()
            elif name == "model_labels":
                self.model_labels.labels(profile, label).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class HttpEndpoints:
    """A tiny HTTP server: path -> (status, content type, body) callables."""

    def __init__(self, port: int, routes: dict[str, Callable[[], tuple[int, str, bytes]]], host: str = "0.0.0.0"):
        routes_ = routes

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                fn = routes_.get(self.path.split("?")[0])
                status, ctype, body = fn() if fn else (404, "text/plain", b"not found\n")
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):   # access logs would drown the structured logs
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name=f"http-{self.port}", daemon=True)

    def start(self) -> "HttpEndpoints":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def health_routes(healthy: Callable[[], bool], ready: Callable[[], bool]) -> dict:
    return {"/healthz": lambda: (200, "text/plain", b"ok\n") if healthy() else (500, "text/plain", b"unhealthy\n"),
            "/readyz": lambda: (200, "text/plain", b"ok\n") if ready() else (503, "text/plain", b"caches not synced\n")}


def metrics_routes(m: Metrics) -> dict:
    return {"/metrics": lambda: (200, CONTENT_TYPE_LATEST, m.exposition())}
