"""The serving image's pre-pull pod, by the names the renderer gives it and the node agent finds it by.

The renderer's DaemonSet (nodewarm/nodeclasses/prepull.py) puts one such pod on every node of the pool; the node agent
(nodewarm/bootstrap/imageprepull.py) finds its own node's pod by ``label_selector`` and reads the status of its
``CONTAINER``, whose image is the serving image.
"""

from __future__ import annotations

NAME = "nodewarm-image-prepull"
CONTAINER = "serving-image"


def daemonset_name(profile: str) -> str:
    return f"{profile}-image-prepull"


def selector(profile: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": NAME, "app.kubernetes.io/instance": profile}


def label_selector(profile: str) -> str:
    """The selector as a list/watch query parameter: the agent finds its node's pre-pull pod by it."""
    return ",".join(f"{k}={v}" for k, v in selector(profile).items())
