"""Waiting for the kubelet to pull the serving image, before the node reports Warm.

(Just over 300 lines, one concern: the pure verdicts and the watch around them read the same fields of the same pod
(its init container's image and imageID, its waiting reasons) by the same image-reference rules; apart, how one pod
is read would be split across two modules.)

The rendered ``<profile>-image-prepull`` DaemonSet (nodewarm/nodeclasses/prepull.py) gives every node of the pool a pod
whose init container ``serving-image`` runs the serving image's ``/bin/true``: the kubelet pulls the image while
the agent pulls weights. The agent only reads that pod, with its own identity (the kubelet's on AL2023, whose
Node authorizer lets it list and watch pods; the DaemonSet's ServiceAccount elsewhere, with a Role in the
bootstrap namespace), and waits until the container's status names the wanted image with an ``imageID``: the
kubelet sets that only once the image is on the node.

Like the compile cache this is an optimisation: a failed or slow pull only means vLLM pulls when it lands. So
every outcome, API errors included, is a ``PrepullResult``, never an exception: the agent records it and
reports Warm whatever it says.

``same_image``, ``judge``, ``pick``, ``state`` and ``deadline_result`` are pure (pod objects as the API server
returns them in, a verdict out); ``wait_for_image`` is the thin I/O around them.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from dataclasses import dataclass

from nodewarm import logs
from nodewarm.api import prepullpod

from . import podwatch

log = logs.get("bootstrap.imageprepull")

# Kubelet waiting reasons of a pull that fails and is retried with back-off: worth waiting on (a registry
# blip, credentials being fixed), and what the deadline result names.
PULL_ERRORS = ("ErrImagePull", "ImagePullBackOff")
# A name the kubelet cannot parse never becomes pullable by waiting.
INVALID = "InvalidImageName"
_CONTENT_ID = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class PrepullResult:
    """How the wait ended (``status``) and why (``reason``); ``image_id`` only when ``pulled``."""

    status: str             # pulled | timeout | failed | skipped
    reason: str             # CamelCase: ImagePulled, ImagePullTimeout, ImagePullFailed, NoPrepullPod, ...
    message: str            # one line: the image, what happened, what to do
    image: str
    image_id: str | None
    seconds: float


# -- image references ---------------------------------------------------------------------------------------
def _parse(ref: str) -> tuple[str, str | None, str | None]:
    """``ref`` as (repository with its registry, tag, digest), the way the container runtime names it:
    ``vllm/vllm-openai:v1`` is ``docker.io/vllm/vllm-openai:v1``, ``busybox`` is
    ``docker.io/library/busybox:latest``."""
    name, _, digest = ref.partition("@")
    tag = None
    if name.rfind(":") > name.rfind("/"):
        name, _, tag = name.rpartition(":")
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest
    else:
        registry, path = "docker.io", name
    if registry == "index.docker.io":
        registry = "docker.io"
    if registry == "docker.io" and "/" not in path:
        path = f"library/{path}"
    if tag is None and not digest:
        tag = "latest"
    return f"{registry}/{path}", tag, digest or None


def same_image(reported: str, wanted: str) -> bool:
    """Whether the kubelet's name for an image is ``wanted``. It reports the runtime's normalised name
    (``docker.io/library/x:tag``), sometimes the digest form, and sometimes only a content ID
    (``sha256:...``) that names no image: that one cannot contradict, and the pod's spec decides."""
    if _CONTENT_ID.match(reported):
        return True
    r_repo, r_tag, r_digest = _parse(reported)
    w_repo, w_tag, w_digest = _parse(wanted)
    if r_repo != w_repo:
        return False
    if r_digest and w_digest:
        return r_digest == w_digest
    if r_tag and w_tag:
        return r_tag == w_tag
    return True


# -- pure: what a pod object says ---------------------------------------------------------------------------
def _spec_image(pod: dict) -> str | None:
    return next((c.get("image") for c in (pod.get("spec") or {}).get("initContainers") or ()
                 if c.get("name") == prepullpod.CONTAINER), None)


def _status(pod: dict) -> dict | None:
    return next((s for s in (pod.get("status") or {}).get("initContainerStatuses") or ()
                 if s.get("name") == prepullpod.CONTAINER), None)


def _name(pod: dict) -> str:
    return (pod.get("metadata") or {}).get("name", "?")


def _for_image(pod: dict, image: str) -> bool:
    """The pod was made for ``image``: a pod of an older template (the DaemonSet has not replaced it yet) was not."""
    spec = _spec_image(pod)
    return spec is not None and same_image(spec, image)


def _result(status: str, reason: str, message: str, image: str, image_id: str | None = None) -> PrepullResult:
    return PrepullResult(status, reason, " ".join(message.split()), image, image_id, 0.0)


def judge(pod: dict | None, image: str) -> PrepullResult | None:
    """``pulled`` when the pod's ``serving-image`` init container is ``image`` and the kubelet reports an
    ``imageID`` for it; ``failed`` when the kubelet refuses the name; None: keep waiting. ``seconds`` is 0
    (``wait_for_image`` fills it in)."""
    if pod is None or not _for_image(pod, image):
        return None
    st = _status(pod)
    if st is None:
        return None
    if st.get("imageID") and same_image(st.get("image") or "", image):
        return _result("pulled", "ImagePulled", f"{image} is on the node ({st['imageID']}), pulled by the kubelet "
                       f"for pod {_name(pod)}", image, st["imageID"])
    waiting = (st.get("state") or {}).get("waiting") or {}
    if waiting.get("reason") == INVALID:
        return _result("failed", "ImagePullFailed", f"the kubelet cannot pull {image}: {INVALID}: "
                       f"{waiting.get('message', '')}; fix spec.serving.image (vLLM's pod cannot start with it either)",
                       image)
    return None


def pick(pods: list[dict], image: str) -> dict | None:
    """The pod that says the most about ``image`` on this node: one made for it (pulled first, then the newest),
    else the newest (an older template's, which the DaemonSet is about to replace)."""
    def rank(pod: dict) -> tuple:
        pulled = judge(pod, image)
        return (_for_image(pod, image), pulled is not None and pulled.status == "pulled",
                (pod.get("metadata") or {}).get("creationTimestamp", ""))

    return max(pods, key=rank, default=None)


def state(pod: dict | None, image: str) -> tuple[str, str]:
    """(code, detail) of how far ``pod`` is, for logs and the deadline result: NoPrepullPod, PrepullPodOutdated,
    NotStarted (no status from the kubelet yet), or the kubelet's own waiting reason (PodInitializing,
    ErrImagePull, ...), Running or Terminated."""
    if pod is None:
        return "NoPrepullPod", ""
    if not _for_image(pod, image):
        return "PrepullPodOutdated", f"pod {_name(pod)} has {_spec_image(pod)}"
    st = _status(pod)
    if st is None:
        return "NotStarted", f"pod {_name(pod)}, phase {(pod.get('status') or {}).get('phase', 'unknown')}"
    current = st.get("state") or {}
    waiting = current.get("waiting")
    if waiting:
        return waiting.get("reason") or "Waiting", " ".join(str(waiting.get("message", "")).split())[:500]
    return ("Running" if "running" in current else "Terminated" if "terminated" in current else "Unknown"), \
        f"pod {_name(pod)}"


def deadline_result(pod: dict | None, image: str, deadline_s: float, *, namespace: str, profile: str) -> PrepullResult:
    """What to record when the deadline passed without the image: why, as far as the pod says."""
    code, detail = state(pod, image)
    after = f"after {deadline_s:.0f}s"
    if code == "NoPrepullPod":
        return _result("timeout", "NoPrepullPod", f"no image pre-pull pod on this node {after} (DaemonSet "
                       f"{prepullpod.daemonset_name(profile)} in namespace {namespace}): apply what `nodewarm render` "
                       f"prints; vLLM pulls {image} when it lands", image)
    if code == "PrepullPodOutdated":
        return _result("timeout", "PrepullPodOutdated", f"{detail}, not {image}, {after}: apply what `nodewarm "
                       "render` prints so the DaemonSet replaces it; vLLM pulls the image when it lands", image)
    if code in PULL_ERRORS:
        return _result("timeout", "ImagePullFailed", f"the kubelet still could not pull {image} {after}: {code}: "
                       f"{detail}; check the image name and the node's access to its registry", image)
    return _result("timeout", "ImagePullTimeout", f"{image} was not on the node {after} (kubelet: {code}"
                   f"{': ' + detail if detail else ''}); a larger spec.bootstrap.imagePrepullTimeout lets a big "
                   "image finish; vLLM pulls what is missing when it lands", image)


# -- I/O with the agent's identity ----------------------------------------------------------------------------
def wait_for_image(api_client, node_name: str, image: str, *, namespace: str, profile: str,
                   deadline_s: float, stop: threading.Event | None = None) -> PrepullResult:
    """Wait until the kubelet on ``node_name`` has pulled ``image`` for the profile's pre-pull pod, it cannot,
    ``deadline_s`` passes or ``stop`` is set. Never raises for the API: a refusal (401/403/404) ends the wait as
    ``failed``; other errors are retried until the deadline (podwatch.follow)."""
    from kubernetes.client.exceptions import ApiException

    stop = stop or threading.Event()
    start = time.monotonic()
    query = [("fieldSelector", f"spec.nodeName={node_name}"), ("labelSelector", prepullpod.label_selector(profile))]
    seen = ("", "")

    def done(r: PrepullResult) -> PrepullResult:
        r = dataclasses.replace(r, seconds=round(time.monotonic() - start, 3))
        log.info("imageprepull.done", node=node_name, image=image, status=r.status, reason=r.reason,
                 seconds=r.seconds, image_id=r.image_id)
        return r

    def look(pods: dict[str, dict]) -> PrepullResult | None:
        nonlocal seen
        pod = pick(list(pods.values()), image)
        now = state(pod, image)
        if now != seen:
            seen = now
            log.info("imageprepull.state", node=node_name, image=image, state=now[0], detail=now[1])
        return judge(pod, image)

    log.info("imageprepull.waiting", node=node_name, image=image, namespace=namespace, profile=profile,
             deadline_s=deadline_s)
    try:
        end = podwatch.follow(api_client, namespace, query, look, stop=stop, what="imageprepull", logger=log, node=node_name,
                              left=lambda: deadline_s - (time.monotonic() - start))
    except ApiException as e:
        why = f"{e.status} {' '.join(str(e.reason).split())}"[:300]
        if e.status in (401, 403):
            return done(_result("failed", "PrepullForbidden", f"this identity may not list and watch pods in "
                                f"namespace {namespace} ({why}): apply the agent's RBAC that `nodewarm render` "
                                f"prints; vLLM pulls {image} when it lands", image))
        return done(_result("failed", "PrepullApiError", f"listing pods in namespace {namespace} answered "
                            f"{why}; vLLM pulls {image} when it lands", image))
    if end.answer is not None:
        return done(end.answer)
    if end.stopped:
        return done(_result("skipped", "PrepullStopped", f"stopped before {image} was seen on the node", image))
    if end.last_error:
        return done(_result("failed", "PrepullApiError", f"could not read the image pre-pull pod until the "
                            f"deadline: {end.last_error}; vLLM pulls {image} when it lands", image))
    return done(deadline_result(pick(list(end.pods.values()), image), image, deadline_s,
                                namespace=namespace, profile=profile))
