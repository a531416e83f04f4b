"""The demo's local servers, started together and always stopped together (also on Ctrl-C)."""

from __future__ import annotations

import contextlib
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

from nodewarm import logs
from nodewarm_dev.testenv import kube as kubeenv
from nodewarm_dev.testenv import s3server
from nodewarm_dev.testenv.crds import all_crds

log = logs.get("demo.servers")
REAL_NODE_CONTROLLERS = ("daemonset", "deployment", "replicaset", "serviceaccount", "root-ca-cert-publisher")


@dataclass
class Servers:
    kube: kubeenv.KubeCluster
    s3: s3server.S3Server
    workdir: Path
    scheduler: bool


@contextlib.contextmanager
def running(workdir: Path | None, node_names: tuple[str, ...], scheduler_max_backoff_s: int, s3_engine: str,
            with_scheduler: bool = True, real_nodes: bool = False):
    """Start S3 + etcd + kube-apiserver (+ kube-scheduler); yield; stop everything, whatever happens. For
    ``real_nodes`` the API server runs in-cluster (ServiceAccount admission: the kubelets project the pods' tokens)
    and the controller manager also runs the DaemonSet, ServiceAccount and root-CA controllers."""
    work = Path(workdir or tempfile.mkdtemp(prefix="nodewarm-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    # SIGTERM must unwind like Ctrl-C so the finally blocks below stop every child process.
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    s3 = kube = None
    try:
        # rclone: the model is laid into work/s3 before this starts, so it may cache its listings for the whole
        # run (a short cache makes it re-read whole files under parallel ranged GETs); other engines ignore it.
        s3 = s3server.start(s3_engine, work / "s3", dir_cache_time="24h")
        log.info("demo.s3.started", engine=s3_engine, endpoint=s3.endpoint, data_dir=str(s3.data_dir))
        kube = kubeenv.start(work / "kube", node_names=node_names, in_cluster=real_nodes)
        kube.apply_crds(all_crds())
        log.info("demo.kube.started", server=kube.server, kubeconfig=str(kube.write_kubeconfig()))
        sched = False
        if with_scheduler:
            # Deployments -> ReplicaSets -> Pods (and, for real nodes, DaemonSet pods and ServiceAccount tokens)
            kubeenv.start_controller_manager(kube, *(() if not real_nodes else (REAL_NODE_CONTROLLERS,)))
            kubeenv.start_scheduler(kube, scheduler_max_backoff_s)   # Pods -> Nodes
            sched = True
            log.info("demo.scheduler.started", pod_max_backoff_s=scheduler_max_backoff_s)
        yield Servers(kube=kube, s3=s3, workdir=work, scheduler=sched)
    finally:
        if kube:
            kube.stop()
        if s3:
            s3.stop()
        signal.signal(signal.SIGTERM, previous)
        log.info("demo.servers.stopped")
