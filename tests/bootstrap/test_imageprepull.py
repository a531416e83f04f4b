"""The serving image pre-pull: what the agent makes of the pre-pull pod (pure), and the agent waiting for it on the
real API server with the identities it really has (the kubelet's on AL2023, the DaemonSet's ServiceAccount on
Bottlerocket / Auto Mode), while the test plays the DaemonSet controller (a pod from the rendered template,
bound to the node) and the kubelet (pods/status patches with the node's own credentials, as its status manager
sends them)."""

from __future__ import annotations

import copy
import logging
import threading
import uuid
from datetime import datetime, timezone

import pytest

from nodewarm import instancetypes, profile
from nodewarm.api import prepullpod
from nodewarm.api.warmprofile import WarmProfile
from support.controller_fixtures import wait_for
from nodewarm.bootstrap.imageprepull import deadline_result, judge, pick, same_image, wait_for_image
from nodewarm.controller.kube import STRATEGIC_PATCH, Kube, Resource
from nodewarm.kubeapply import apply
from nodewarm.nodeclasses import prepull
from nodewarm.nodeclasses.render import render
from nodewarm.userdata.daemonset import NAME as AGENT_SA
from support.builders import v

IMAGE = "vllm/vllm-openai:v0.21.0"
OLD_IMAGE = "vllm/vllm-openai:v0.20.0"
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
DAEMONSETS = Resource("apps", "v1", "daemonsets", "DaemonSet", namespaced=True)
NODE = "node-0"


def digest(seed: str) -> str:
    return "sha256:" + (uuid.uuid5(uuid.NAMESPACE_URL, seed).hex * 2)


def reported_id(image: str) -> str:
    """The imageID containerd reports: the normalised repository and the digest it pulled."""
    repo = image.rsplit(":", 1)[0]
    return f"docker.io/{repo}@{digest(image)}"


def doc(mode: str, name: str = "qwen3-35b", image: str = IMAGE, **changes) -> dict:
    variant = {"al2023": ("karpenter", {}), "automode": ("automode", {}),
               "bottlerocket": ("karpenter", {"spec__nodes__amiAlias": "bottlerocket@latest"})}
    base, extra = variant[mode]
    return v(base, metadata__name=name, spec__serving__image=image, **extra, **changes)


def rendered(d: dict) -> list[dict]:
    p = profile.from_dict(d)
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    return render(p, types).documents


def prepull_ds(docs: list[dict]) -> dict:
    [ds] = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("-image-prepull")]
    return ds


# -- what the kubelet writes ------------------------------------------------------------------------------------
def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def waiting(reason: str, message: str | None = None) -> dict:
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


def init_status(state: dict, image: str, image_id: str = "") -> dict:
    """One entry of initContainerStatuses, every field the kubelet always sends."""
    done = "terminated" in state
    return {"name": prepullpod.CONTAINER, "state": state, "lastState": {}, "ready": done, "restartCount": 0,
            "image": image, "imageID": image_id,
            **({"containerID": state["terminated"]["containerID"]} if done else {})}


def completed(image: str) -> dict:
    """The init container's status once it ran: the runtime's normalised image name and the digest it pulled."""
    t = _now()
    state = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": t, "finishedAt": t,
                            "containerID": f"containerd://{digest('c' + image)[7:]}"}}
    return init_status(state, f"docker.io/{image}", reported_id(image))


def pod_status(init: dict) -> dict:
    """The whole status as the kubelet computes it from its init container's state."""
    initialized = "terminated" in init["state"]
    pause = ({"name": "pause", "state": {"running": {"startedAt": _now()}}, "lastState": {}, "ready": True,
              "restartCount": 0, "started": True, "image": prepull.PAUSE_IMAGE,
              "imageID": f"registry.k8s.io/pause@{digest('pause')}", "containerID": "containerd://" + "ab" * 32}
             if initialized else
             {"name": "pause", "state": waiting("PodInitializing"), "lastState": {}, "ready": False, "restartCount": 0,
              "started": False, "image": prepull.PAUSE_IMAGE, "imageID": ""})
    cond = lambda kind, ok, reason=None: {"type": kind, "status": "True" if ok else "False",  # noqa: E731
                                          "lastProbeTime": None, "lastTransitionTime": _now(),
                                          **({"reason": reason} if reason and not ok else {})}
    conditions = [cond("Initialized", initialized, "ContainersNotInitialized"),
                  cond("Ready", initialized, "ContainersNotReady"),
                  cond("ContainersReady", initialized, "ContainersNotReady"), cond("PodScheduled", True)]
    if not initialized:
        conditions[0]["message"] = f"containers with incomplete status: [{prepullpod.CONTAINER}]"
    return {"phase": "Running" if initialized else "Pending", "hostIP": "10.0.3.17", "podIP": "10.0.3.201",
            "podIPs": [{"ip": "10.0.3.201"}], "startTime": _now(), "conditions": conditions,
            "$setElementOrder/conditions": [{"type": c["type"]} for c in conditions],
            "initContainerStatuses": [init], "containerStatuses": [pause]}


class Kubelet:
    """The kubelet of one node: its status manager's strategic merge patch of pods/status, with the pod's UID
    as precondition, sent with the node's own credentials (NodeRestriction: only pods bound to this node)."""

    def __init__(self, kube, node: str):
        self.k = Kube(kube.api_client(kube.node_token(node)))

    def report(self, pod: dict, init: dict) -> None:
        md = pod["metadata"]
        self.k.request("PATCH", PODS.path(md["name"], md["namespace"], "status"), content_type=STRATEGIC_PATCH,
                       body={"metadata": {"uid": md["uid"]}, "status": pod_status(init)})


def daemonset_pod(k: Kube, namespace: str, ds_name: str, node: str) -> dict:
    """What the DaemonSet controller makes for ``node`` from the stored DaemonSet, bound to the node as the
    scheduler leaves it."""
    ds = k.get(DAEMONSETS, ds_name, namespace)
    template = copy.deepcopy(ds["spec"]["template"])
    md = {"generateName": f"{ds_name}-", "namespace": namespace,
          "labels": {**template["metadata"]["labels"], "pod-template-generation": str(ds["metadata"]["generation"])},
          "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds_name,
                               "uid": ds["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]}
    return k.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": md,
                           "spec": {**template["spec"], "nodeName": node}}, namespace)


def pure_pod(image: str = IMAGE, init: dict | None = None, name: str = "p-1", created: str = "2025-01-01T00:00:00Z"):
    """A pod object as the API server returns it, from the rendered template (no server)."""
    spec = copy.deepcopy(prepull_ds(rendered(doc("al2023", image=image)))["spec"]["template"]["spec"])
    pod = {"metadata": {"name": name, "namespace": "nodewarm-system", "creationTimestamp": created},
           "spec": {**spec, "nodeName": NODE}, "status": {"phase": "Pending"}}
    if init is not None:
        pod["status"] = {k: val for k, val in pod_status(init).items() if not k.startswith("$")}
    return pod


# -- pure -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reported, wanted, same", [
    ("docker.io/vllm/vllm-openai:v0.21.0", "vllm/vllm-openai:v0.21.0", True),
    ("vllm/vllm-openai:v0.21.0", "docker.io/vllm/vllm-openai:v0.21.0", True),
    ("docker.io/library/busybox:latest", "busybox", True),
    ("index.docker.io/library/busybox:1.36", "busybox:1.36", True),
    ("docker.io/vllm/vllm-openai:v0.20.0", "vllm/vllm-openai:v0.21.0", False),
    ("docker.io/vllm/vllm-openai:latest", "vllm/vllm-openai", True),
    ("docker.io/other/vllm-openai:v0.21.0", "vllm/vllm-openai:v0.21.0", False),
    ("public.ecr.aws/vllm/vllm-openai:v0.21.0", "vllm/vllm-openai:v0.21.0", False),
    ("localhost:5000/vllm:1", "localhost:5000/vllm:1", True),
    ("111122223333.dkr.ecr.us-west-2.amazonaws.com/vllm:1", "111122223333.dkr.ecr.us-west-2.amazonaws.com/vllm:1", True),
    ("111122223333.dkr.ecr.us-west-2.amazonaws.com/vllm:1", "vllm:1", False),
    (f"docker.io/vllm/vllm-openai@{digest('a')}", f"vllm/vllm-openai@{digest('a')}", True),
    (f"docker.io/vllm/vllm-openai@{digest('a')}", f"vllm/vllm-openai@{digest('b')}", False),
    # A content ID names no image: it cannot contradict (the pod's spec decides).
    (digest("a"), IMAGE, True),
])
def test_image_names_compare_as_the_runtime_normalises_them(reported, wanted, same):
    assert same_image(reported, wanted) is same


def test_judge_keeps_waiting_until_the_kubelet_reports_the_image_pulled():
    assert judge(None, IMAGE) is None                                            # no pod on the node yet
    assert judge(pure_pod(), IMAGE) is None                                      # no status from the kubelet yet
    pulling = pure_pod(init=init_status(waiting("PodInitializing"), IMAGE))
    assert judge(pulling, IMAGE) is None                                         # no imageID: not on the node
    backing_off = pure_pod(init=init_status(waiting("ErrImagePull", "rpc error: code = Unknown"), IMAGE))
    assert judge(backing_off, IMAGE) is None                                     # retried by the kubelet
    assert judge(pure_pod(init=init_status(waiting("ImagePullBackOff", "Back-off"), IMAGE)), IMAGE) is None
    # A pod of the older template, its (older) image pulled, says nothing about this image.
    assert judge(pure_pod(OLD_IMAGE, init=completed(OLD_IMAGE)), IMAGE) is None
    # ... also when the kubelet names it only by content ID: the pod's spec says which image that is.
    unnamed = pure_pod(OLD_IMAGE, init={**completed(OLD_IMAGE), "image": digest(OLD_IMAGE)})
    assert judge(unnamed, IMAGE) is None
    assert judge(unnamed, OLD_IMAGE).status == "pulled"
    # The spec names the image but the status still the one pulled before (the image was edited in place).
    edited = pure_pod(init=completed(OLD_IMAGE))
    assert judge(edited, IMAGE) is None

    r = judge(pure_pod(init=completed(IMAGE)), IMAGE)
    assert (r.status, r.reason, r.image, r.image_id) == ("pulled", "ImagePulled", IMAGE, reported_id(IMAGE))
    assert IMAGE in r.message and "\n" not in r.message


def test_a_name_the_kubelet_cannot_parse_fails_at_once():
    bad = pure_pod(init=init_status(waiting("InvalidImageName", 'Failed to apply default image tag "vllm/X": '
                                            "couldn't parse image reference"), IMAGE))
    r = judge(bad, IMAGE)
    assert (r.status, r.reason, r.image_id) == ("failed", "ImagePullFailed", None)
    assert "InvalidImageName" in r.message and "spec.serving.image" in r.message


def test_pick_prefers_the_pod_made_for_the_image_over_an_older_one():
    old = pure_pod(OLD_IMAGE, init=completed(OLD_IMAGE), name="old", created="2025-01-01T00:00:00Z")
    new = pure_pod(init=init_status(waiting("PodInitializing"), IMAGE), name="new", created="2025-01-01T00:00:01Z")
    assert pick([old, new], IMAGE)["metadata"]["name"] == "new"
    assert pick([new, old], IMAGE)["metadata"]["name"] == "new"
    assert pick([old], IMAGE)["metadata"]["name"] == "old"       # only an older one: the deadline names it
    assert pick([], IMAGE) is None


@pytest.mark.parametrize("pod, reason, words", [
    (None, "NoPrepullPod", ["qwen3-35b-image-prepull", "nodewarm-system", "nodewarm render"]),
    (pure_pod(OLD_IMAGE, init=completed(OLD_IMAGE)), "PrepullPodOutdated", [OLD_IMAGE, "nodewarm render"]),
    (pure_pod(init=init_status(waiting("ErrImagePull", "failed to resolve reference: not found"), IMAGE)),
     "ImagePullFailed", ["ErrImagePull", "not found", "registry"]),
    (pure_pod(init=init_status(waiting("PodInitializing"), IMAGE)), "ImagePullTimeout",
     ["PodInitializing", "spec.bootstrap.imagePrepullTimeout"]),
    (pure_pod(), "ImagePullTimeout", ["NotStarted"]),
])
def test_the_deadline_result_says_why_the_image_is_not_there(pod, reason, words):
    r = deadline_result(pod, IMAGE, 600, namespace="nodewarm-system", profile="qwen3-35b")
    assert (r.status, r.reason, r.image, r.image_id) == ("timeout", reason, IMAGE, None)
    for w in [IMAGE, "600s", *words]:
        assert w in r.message, (w, r.message)


# -- the real API server ----------------------------------------------------------------------------------------
class LogEvents(logging.Handler):
    """The waiter's structured log events: the test acts when the agent has reached a point, never after a sleep."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.seen: list[tuple[str, dict]] = []
        self.cond = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self.cond:
            self.seen.append((record.getMessage(), dict(getattr(record, "fields", {}))))
            self.cond.notify_all()

    def wait(self, event: str, timeout_s: float = 60, **fields) -> None:
        def found() -> bool:
            return any(e == event and all(f.get(k) == val for k, val in fields.items()) for e, f in self.seen)

        with self.cond:
            if not self.cond.wait_for(found, timeout_s):
                raise AssertionError(f"no log event {event} {fields} within {timeout_s}s; seen: {self.seen[-5:]}")


@pytest.fixture
def log_events():
    logger = logging.getLogger("nodewarm.bootstrap.imageprepull")
    handler, level = LogEvents(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def may(k: Kube, user: str, namespace: str, verb: str) -> bool:
    """What the API server's authorizer answers now (its RBAC cache follows an apply within a moment)."""
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{user.split(':')[2]}", "system:authenticated"]
    attributes = {"namespace": namespace, "verb": verb, "resource": "pods"}
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user, "groups": groups, "resourceAttributes": attributes}}
    return k.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review)["status"]["allowed"]


class World:
    """One profile's rendered pre-pull objects (and the agent's RBAC) applied to the API server, its node, and the
    identity its agent really has."""

    KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

    def __init__(self, kube, k: Kube, fresh_node, mode: str, image: str = IMAGE, with_prepull_role: bool = True):
        self.kube, self.k, self.mode = kube, k, mode
        self.name = f"pp{mode[:2]}-{uuid.uuid4().hex[:6]}"
        self.namespace = f"{self.name}-sys"
        self.profile = self._profile(image)
        docs = self._render(self.profile)
        kinds = self.KINDS if with_prepull_role else self.KINDS - {"Role", "RoleBinding"}
        apply(k.api, [d for d in docs if d["kind"] in kinds] + [prepull_ds(docs)])
        self.ds_name = prepull_ds(docs)["metadata"]["name"]
        fresh_node(NODE, [{"key": self.profile.readiness.taint_key, "effect": "NoSchedule"}],
                   labels={"karpenter.sh/nodepool": self.profile.nodes.node_pool})
        if self.profile.uses_daemonset:
            self.user = f"system:serviceaccount:{self.namespace}:{AGENT_SA}"
            wait_for(lambda: may(k, self.user, self.namespace, "list"), what=f"RBAC for {self.user}")
            if with_prepull_role:
                wait_for(lambda: may(k, self.user, self.namespace, "watch"), what=f"the Role for {self.user}")
            self.agent = kube.api_client(kube.service_account_token(self.namespace, AGENT_SA))
        else:
            self.agent = kube.api_client(kube.node_token(NODE))     # the host agent runs as the kubelet
        self.kubelet = Kubelet(kube, NODE)
        self.pods: list[dict] = []

    def _profile(self, image: str) -> WarmProfile:
        return profile.from_dict(doc(self.mode, self.name, image, spec__nodes__nodePool=f"{self.name}-pool",
                                     spec__nodes__nodeClass=f"{self.name}-class",
                                     spec__bootstrap__namespace=self.namespace))

    @staticmethod
    def _render(p: WarmProfile) -> list[dict]:
        return render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents

    def schedule(self) -> dict:
        """The DaemonSet controller's pod for the node, from the template stored now."""
        pod = daemonset_pod(self.k, self.namespace, self.ds_name, NODE)
        self.pods.append(pod)
        return pod

    def roll_to(self, image: str) -> None:
        """The user applies `nodewarm render` again after changing the serving image."""
        apply(self.k.api, [prepull_ds(self._render(self._profile(image)))])

    def wait(self, image: str = IMAGE, deadline_s: float = 120, namespace: str | None = None, stop=None):
        return wait_for_image(self.agent, NODE, image, namespace=namespace or self.namespace,
                              profile=self.profile.name, deadline_s=deadline_s, stop=stop)

    def close(self) -> None:
        for pod in self.pods:
            self.k.request("DELETE", PODS.path(pod["metadata"]["name"], self.namespace),
                           query={"gracePeriodSeconds": 0})


@pytest.fixture
def world(kube, k, fresh_node):
    made = []

    def make(mode: str, **kw) -> World:
        made.append(World(kube, k, fresh_node, mode, **kw))
        return made[-1]

    yield make
    for w in made:
        w.close()


def in_thread(fn):
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(result=fn()), daemon=True)
    t.start()
    return t, out


@pytest.mark.kube
@pytest.mark.parametrize("mode", ["al2023", "bottlerocket", "automode"])
def test_the_agent_waits_until_the_kubelet_reports_the_serving_image_pulled(world, log_events, mode):
    w = world(mode)
    t, out = in_thread(w.wait)
    # The agent is waiting before the pod exists: the DaemonSet controller makes it after the node registers.
    log_events.wait("imageprepull.watch", node=NODE)
    log_events.wait("imageprepull.state", node=NODE, state="NoPrepullPod")
    pod = w.schedule()
    log_events.wait("imageprepull.state", node=NODE, state="NotStarted")
    w.kubelet.report(pod, init_status(waiting("PodInitializing"), IMAGE))
    log_events.wait("imageprepull.state", node=NODE, state="PodInitializing")
    w.kubelet.report(pod, init_status(waiting("ErrImagePull", "rpc error: code = Unknown desc = failed to pull "
                                              "and unpack image: 502 Bad Gateway"), IMAGE))
    log_events.wait("imageprepull.state", node=NODE, state="ErrImagePull")
    assert t.is_alive(), out            # a failing pull is retried by the kubelet: the agent keeps waiting
    w.kubelet.report(pod, completed(IMAGE))
    t.join(120)
    r = out["result"]
    assert (r.status, r.reason, r.image, r.image_id) == ("pulled", "ImagePulled", IMAGE, reported_id(IMAGE))
    assert pod["metadata"]["name"] in r.message


@pytest.mark.kube
def test_an_outdated_pod_never_counts_and_its_replacement_does(world, log_events):
    w = world("al2023", image=OLD_IMAGE)
    old = w.schedule()
    w.kubelet.report(old, completed(OLD_IMAGE))
    w.roll_to(IMAGE)            # the serving image changed; the DaemonSet has not replaced the pod yet
    r = w.wait(IMAGE, deadline_s=2)
    assert (r.status, r.reason, r.image_id) == ("timeout", "PrepullPodOutdated", None)
    assert OLD_IMAGE in r.message and IMAGE in r.message

    t, out = in_thread(w.wait)
    log_events.wait("imageprepull.watch", node=NODE)
    new = w.schedule()          # the replacement, beside the old one until that is gone
    w.kubelet.report(new, completed(IMAGE))
    t.join(120)
    assert (out["result"].status, out["result"].image_id) == ("pulled", reported_id(IMAGE))
    assert new["metadata"]["name"] in out["result"].message


@pytest.mark.kube
@pytest.mark.parametrize("kubelet_says, reason, words", [
    (waiting("ErrImagePull", 'failed to resolve reference "docker.io/vllm/vllm-openai:v0.21.0": not found'),
     "ImagePullFailed", ["ErrImagePull", "not found"]),
    (waiting("ImagePullBackOff", 'Back-off pulling image "vllm/vllm-openai:v0.21.0"'), "ImagePullFailed",
     ["ImagePullBackOff", "Back-off pulling"]),
    (waiting("PodInitializing"), "ImagePullTimeout", ["PodInitializing"]),
])
def test_at_the_deadline_the_result_carries_the_kubelets_last_word(world, kubelet_says, reason, words):
    w = world("al2023")
    pod = w.schedule()
    w.kubelet.report(pod, init_status(kubelet_says, IMAGE))
    r = w.wait(deadline_s=2)
    assert (r.status, r.reason, r.image_id) == ("timeout", reason, None)
    for word in words:
        assert word in r.message, r.message


@pytest.mark.kube
def test_no_prepull_pod_at_the_deadline_names_the_daemonset(world):
    w = world("al2023")
    r = w.wait(deadline_s=2)
    assert (r.status, r.reason) == ("timeout", "NoPrepullPod")
    assert w.ds_name in r.message and w.namespace in r.message


@pytest.mark.kube
def test_an_invalid_image_name_ends_the_wait_at_once(world):
    w = world("al2023")
    pod = w.schedule()
    w.kubelet.report(pod, init_status(waiting("InvalidImageName", "couldn't parse image reference"), IMAGE))
    r = w.wait(deadline_s=600)
    assert (r.status, r.reason) == ("failed", "ImagePullFailed")


@pytest.mark.kube
def test_stop_ends_the_wait_as_skipped(world, log_events):
    w = world("al2023")
    stop = threading.Event()
    t, out = in_thread(lambda: w.wait(deadline_s=600, stop=stop))
    log_events.wait("imageprepull.watch", node=NODE)
    stop.set()
    w.kubelet.report(w.schedule(), init_status(waiting("PodInitializing"), IMAGE))     # an event wakes the watch
    t.join(120)
    assert (out["result"].status, out["result"].reason) == ("skipped", "PrepullStopped")


@pytest.mark.kube
def test_the_service_account_may_watch_pods_only_in_its_namespace_and_a_missing_verb_is_reported(world):
    w = world("bottlerocket")
    # Its Role is in the bootstrap namespace: watching pods elsewhere is refused, and reported, not raised.
    r = w.wait(deadline_s=30, namespace="default")
    assert (r.status, r.reason) == ("failed", "PrepullForbidden")
    assert "403" in r.message and "nodewarm render" in r.message
    # The rendered RBAC without the pre-pull Role: the ClusterRole lists pods, but nothing lets it watch.
    bare = world("bottlerocket", with_prepull_role=False)
    r = bare.wait(deadline_s=30)
    assert (r.status, r.reason) == ("failed", "PrepullForbidden")
    assert bare.namespace in r.message


@pytest.mark.kube
def test_an_unreachable_api_server_is_a_result_not_an_exception(kube):
    from nodewarm_dev.testenv.ports import free_port

    dead = kube.api_client()
    dead.configuration.host = f"https://127.0.0.1:{free_port()}"
    r = wait_for_image(dead, NODE, IMAGE, namespace="nodewarm-system", profile="x", deadline_s=2)
    assert (r.status, r.reason) == ("failed", "PrepullApiError")
    assert IMAGE in r.message
