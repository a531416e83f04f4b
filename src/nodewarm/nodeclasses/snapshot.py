"""The serving side of engine snapshots (``spec.serving.snapshot``, nodewarm.api.snapshot): the RuntimeClass, and the
settings a serving pod needs so the node's runtime handler can restore its vLLM container instead of booting it.
Pure.

Why each setting is there:

* **The RuntimeClass** is how a pod reaches the runtime handler the AL2023 user data installs in containerd: the
  kubelet passes its ``handler`` to the CRI. One RuntimeClass serves every profile that enables snapshots (it names
  a node-level handler, nothing of a profile), so it carries no profile label, and no ``scheduling`` section: the
  Deployment's own nodeSelector already keeps its pods on the profile's pool, whose nodes have the handler.
  It is applied before the Deployment: the API server refuses a pod whose RuntimeClass does not exist.
* **runtimeClassName** puts the pod on that handler; without it containerd runs stock runc and nothing restores.
* **enableServiceLinks: false**: the kubelet otherwise injects a set of ``<SERVICE>_*`` variables for every Service
  in the namespace. The snapshot's key includes the container's environment, so a Service created between the
  engine-check pod (whose vLLM is checkpointed) and the serving pod would refuse every restore.
* **The seccomp profile** (Localhost, written by the user data under the kubelet's seccomp folder) refuses
  ``io_uring_setup``: uvloop's libuv would otherwise hold an io_uring, which CRIU cannot checkpoint. It is merged
  into the vLLM container's securityContext, so whatever else that sets stays.
* **ENGINE_ENV** keeps vLLM's processes talking over loopback: a restored process lives in a new pod with a new IP
  and cannot bind or reach the old one. It does not move the compile-cache key (nodewarm.bootstrap.compilecache
  .cachekey leaves ``*_IP`` variables and non-engine names out), so a node's restored caches still serve.

The seccomp profile and ENGINE_ENV go on the vLLM container (``CONTAINER``) only: it is the one the agent
checkpoints. The RuntimeClass is the pod's, so its other containers (the start script's init container, the
publisher) pass through the handler too and boot, as any create without a snapshot does. The engine-check pod copies
the serving pod's runtimeClassName, enableServiceLinks and vLLM container, so the process checkpointed there has the
key the serving pod's create computes.
"""

from __future__ import annotations

import copy

from nodewarm.api.names import MANAGED_BY
from nodewarm.api.snapshot import CONTAINER, ENGINE_ENV, RUNTIME_CLASS, RUNTIME_HANDLER, SECCOMP_PROFILE


def runtime_class() -> dict:
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": RUNTIME_CLASS, "labels": {MANAGED_BY: "nodewarm"}},
        "handler": RUNTIME_HANDLER,
    }


def restorable(pod_spec: dict) -> dict:
    """A copy of the serving ``pod_spec`` set up to be restored from a snapshot (the module's docstring says why
    each setting). Raises LookupError when it has no ``CONTAINER``: a renamed container would otherwise leave every
    pod booting, with nothing to say why."""
    spec = copy.deepcopy(pod_spec)
    c = next((c for c in spec["containers"] if c["name"] == CONTAINER), None)
    if c is None:
        raise LookupError(f"the serving pod has no container named {CONTAINER!r} to snapshot")
    spec["runtimeClassName"] = RUNTIME_CLASS
    spec["enableServiceLinks"] = False
    c["securityContext"] = {**c.get("securityContext", {}),
                            "seccompProfile": {"type": "Localhost", "localhostProfile": SECCOMP_PROFILE}}
    c["env"] = [*c.get("env", []), *({"name": k, "value": v} for k, v in ENGINE_ENV.items())]
    return spec
