"""A cluster whose nodes are real (nodewarm_dev.testenv.realnode: a kubelet v1.20.2 with its own containerd), shared by
the tests of the pods nodewarm ships: a profile rendered and applied as a user applies it, a node of its pool
launched, joined and registered the way Karpenter does it, and what to print when such a test fails."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from nodewarm import instancetypes, profile
from nodewarm.api.names import WARM_CONDITION
from nodewarm.controller.kube import PODS, Kube
from nodewarm.kubeapply import apply
from nodewarm.nodeclasses import prepull
from nodewarm.nodeclasses.render import render
from nodewarm_dev.testenv import kube as kubeenv
from nodewarm_dev.testenv import agentpod, realnode
from nodewarm_dev.testenv.karpenter import KarpenterSim

S3_SERVICE, NOT_SERVED = kubeenv.S3_SERVICE, kubeenv.NOT_SERVED


def warm_condition(node: dict | None) -> dict | None:
    return next((c for c in ((node or {}).get("status") or {}).get("conditions") or ()
                 if c["type"] == WARM_CONDITION), None)


def print_logs(node: realnode.RealNode) -> None:
    """For a failing test: the node's containerd and kubelet logs and every container's log on it."""
    print(f"===== node {node.name} =====\n{node.logs(8000)}", file=sys.stderr)
    for f in sorted(node.log_dir.rglob("*.log")):
        print(f"===== {f} =====\n{f.read_text(errors='replace')[-6000:]}", file=sys.stderr)


@contextlib.contextmanager
def joined(cluster, registry_host: str, s3, tmp_path: Path, doc: dict, node_name: str, nvme: Path, *,
           with_deployment: bool = False, runtime_handlers: dict[str, Path] | None = None):
    """The profile ``doc`` rendered and applied as a user would (the vLLM Deployment only ``with_deployment``), and a
    real node of its pool launched, joined and registered, its NVMe folder ``nvme``; yields the running node. The
    agent gets the S3 server's credentials as the Pod Identity agent would give them, and the endpoint through a
    ClusterIP Service; ``runtime_handlers`` go to its containerd (realnode.start). Stopped (and its logs printed on
    a failure) afterwards."""
    k = Kube(cluster.api_client())
    p = profile.from_dict(doc)
    docs = render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
    if p.uses_daemonset:    # an AL2023 profile's agent is the host's (the caller runs it), not a pod
        agentpod.give_s3(docs, s3.env())
    skip = NOT_SERVED | (set() if with_deployment else {"Deployment"})
    apply(k.api, [d for d in docs if d["kind"] not in skip])

    sim = KarpenterSim(cluster.api_client())
    claim = sim.launch(sim.create_nodeclaim(p.nodes.node_pool)["metadata"]["name"])
    node = realnode.start(cluster, node_name, tmp_path / "n", **realnode.from_nodeclaim(claim),
                          registries={registry_host: f"http://{registry_host}"}, host_dirs={p.nodes.cache_mount: nvme},
                          services={kubeenv.KUBERNETES_SERVICE: cluster.server.removeprefix("https://"),
                                    S3_SERVICE: s3.endpoint.removeprefix("http://")},
                          runtime_handlers=runtime_handlers)
    try:
        # The prepull DaemonSet's main container: no registry is reachable here, so the node holds a pause image
        # under that name, as an EKS AMI holds its own pause image before any pod runs.
        node.ctr("images", "tag", realnode.PAUSE_IMAGE, prepull.PAUSE_IMAGE)
        node.advertise({"nvidia.com/gpu": claim["metadata"]["labels"]["karpenter.k8s.aws/instance-gpu-count"]})
        sim.mark_registered(claim["metadata"]["name"])
        yield node
    except BaseException:
        for ns in {p.bootstrap.namespace, p.serving.namespace}:
            for pod_ in k.list(PODS, ns)["items"]:
                print(f"===== pod {ns}/{pod_['metadata']['name']} =====\n{pod_['spec'].get('nodeName')} "
                      f"{pod_.get('status')}", file=sys.stderr)
        print_logs(node)
        raise
    finally:
        with contextlib.suppress(Exception):
            node.stop()
