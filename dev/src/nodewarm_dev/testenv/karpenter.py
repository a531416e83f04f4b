"""A Karpenter stand-in for the local API server: it plays Karpenter's (and the kubelet's) part of a
scale-up exactly as docs/karpenter.md, "Startup taints and the NodeClaim lifecycle", describes, and nothing more.

(Over 300 lines: one stand-in for what Karpenter does to NodeClaims and Nodes (scale-up, registration,
initialization, drift, repair with its budgets, termination), each step the documented semantics; the steps share
the simulated claims and nodes and the condition helpers, and tests stop between any two of them.)

    sim = KarpenterSim(api_client)
    n = sim.scale_up("gpu-pool")             # NodeClaim -> Launched -> Node registers -> Ready -> Registered
    ...                                      # (the node agent reports Warm; the controller lifts the taint)
    sim.sync_initialized(n.claim)            # Initialized once Ready and every startup taint is gone

Steps, each callable on its own so tests can stop between them:
1. ``create_nodeclaim``: spec copied from the NodePool template (nodeClassRef, requirements, taints,
   startupTaints), labels karpenter.sh/nodepool + the template's labels, finalizer
   karpenter.sh/termination, and the drift hashes of its NodePool and EC2NodeClass as annotations
   (``sync_hashes`` writes them onto those first, as Karpenter's hash controllers do).
2. ``launch``: status.providerID, Launched=True, and Registered/Initialized Unknown (Karpenter's
   status conditions start Unknown; nothing sets them False on the way up).
3. ``register_node``: the kubelet creates the Node carrying providerID, labels, NodeClaim taints +
   startupTaints + karpenter.sh/unregistered:NoExecute (AL2023 registerWithTaints); the API server's
   admission adds node.kubernetes.io/not-ready:NoSchedule itself.
4. ``kubelet_ready``: Ready=True and the not-ready taint removed (the node lifecycle controller's job).
5. ``mark_registered``: Karpenter's registration, once: it links the Node *by providerID only*, merges the
   NodeClaim's taints and startupTaints back into it (key+effect, appended; not with
   karpenter.sh/do-not-sync-taints=true), copies the NodeClaim's labels and annotations, adds the
   karpenter.sh/termination finalizer and an owner reference, removes karpenter.sh/unregistered and labels
   karpenter.sh/registered=true in one optimistic-locked patch, then sets status.nodeName and Registered=True.
   ``hold_registration`` plays a registration hook that is not ready: the merge happens, nothing else.
6. ``sync_initialized``: once Registered=True, Initialized=True + label karpenter.sh/initialized=true only when the Node is
   Ready and none of the NodeClaim's startupTaints nor the known-ephemeral taints remain; until then
   Initialized stays Unknown with the blocking reason (NodeNotReady, StartupTaintsExist, ...).
Deleting is Karpenter's too: a NodeClaim or Node with the finalizer only gets a deletionTimestamp;
``finish_termination`` plays the termination controller (Node gone, then the finalizers released).
Drift is Karpenter's own: ``sync_hashes`` plays the NodePool and EC2NodeClass hash controllers (the exact
hashes of nodewarm.karpenter.drifthash, hash versions v3 and v5/v6, the API server's CA bundle; on a
hash-version change they re-stamp the NodeClaims that are not Drifted instead of drifting them), ``drifted`` /
``mark_drifted`` the drift controller (nodewarm.karpenter.drift.nodeclaim_drift: NodePoolDrifted,
RequirementsDrifted, NodeClassDrift, AMIDrift). ``repair`` plays node repair as Karpenter v1.15 makes it: a
voluntary disruption for reason ``Unhealthy`` within the NodePool's budgets, terminate-first (REPAIR below).
It acts on a node that never initialized (a warming node, under the startup taint), as repair up to v1.14 does
(``pkg/controllers/node/health``: node conditions only). Whether v1.15 still does was not readable (its code was
not in the snapshot; the other disruption methods refuse such a node, ``ValidateNodeDisruptable``): acting on it
is the case where repair and nodewarm's deadline can both replace one node, so it is the one to test.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from kubernetes.client.exceptions import ApiException

from nodewarm import instancetypes
from nodewarm.karpenter import drift, drifthash
from nodewarm.karpenter.apis import DEFAULT_EC2NODECLASS_VERSION
from nodewarm.karpenter.gojson import parse_go_duration
from nodewarm.api.views import UNREGISTERED_TAINT
from nodewarm.controller.kube import EC2NODECLASSES, NODECLAIMS, NODEPOOLS, NODES, Kube

UNREGISTERED = {"key": UNREGISTERED_TAINT, "effect": "NoExecute"}
REGISTERED_LABEL = "karpenter.sh/registered"
DO_NOT_SYNC_TAINTS = "karpenter.sh/do-not-sync-taints"     # Bottlerocket's: the provider, not registration, owns taints
EPHEMERAL_TAINT_KEYS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable",
                        "node.cloudprovider.kubernetes.io/uninitialized", "karpenter.sh/unregistered")
EPHEMERAL_TAINT_PREFIX = "readiness.k8s.io/"
TERMINATION_FINALIZER = "karpenter.sh/termination"
NODEPOOL_HASH, NODEPOOL_HASH_VERSION = drifthash.NODEPOOL_HASH, drifthash.NODEPOOL_HASH_VERSION
NODECLASS_HASH, NODECLASS_HASH_VERSION = drifthash.EC2NODECLASS_HASH, drifthash.EC2NODECLASS_HASH_VERSION
DEFAULT_IMAGE_ID = "ami-0123456789abcdef0"


def _ca_bundle(api_client) -> str:
    """The string Karpenter hashes as its cluster CA bundle: base64 of the CA it trusts for this API server."""
    path = getattr(api_client.configuration, "ssl_ca_cert", None)
    if not path:
        return ""
    with open(path, "rb") as f:
        return drifthash.encode_ca_bundle(f.read())


def _now(ago_s: float = 0.0) -> str:
    return datetime.fromtimestamp(time.time() - ago_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(ts: str) -> float:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def _cond(ctype: str, status: str, reason: str, message: str = "", generation: int = 1, ago_s: float = 0.0) -> dict:
    # Never an empty message: this v1.20 API server turns "" into null and then rejects it (type string).
    return {"type": ctype, "status": status, "reason": reason, "message": message or reason,
            "lastTransitionTime": _now(ago_s), "observedGeneration": generation}


def _set_condition(conds: list[dict], new: dict) -> list[dict]:
    old = next((c for c in conds if c["type"] == new["type"]), None)
    if old and old["status"] == new["status"]:
        new = {**new, "lastTransitionTime": old["lastTransitionTime"]}
    return [c for c in conds if c["type"] != new["type"]] + [new]


@dataclass(frozen=True)
class RepairPolicy:
    condition: str
    status: str
    toleration_s: float


# aws/karpenter-provider-aws pkg/cloudprovider/cloudprovider.go RepairPolicies() (main): kubelet Ready, then the
# EKS node monitoring agent's conditions; a GPU fault is the quickest, 10 minutes.
REPAIR_POLICIES = (
    RepairPolicy("Ready", "False", 1800), RepairPolicy("Ready", "Unknown", 1800),
    RepairPolicy("AcceleratedHardwareReady", "False", 600), RepairPolicy("StorageReady", "False", 1800),
    RepairPolicy("NetworkingReady", "False", 1800), RepairPolicy("KernelReady", "False", 1800),
    RepairPolicy("ContainerRuntimeReady", "False", 1800),
)
# The disruption reason of repair's budgets in v1.15: "Unhealthy" in PR #3311's review ("Repair" in the RFC, #3192).
# Only the stand-in's budgets use the name: the controller holds a deadline replace for any DisruptionReason=True.
UNHEALTHY = "Unhealthy"
_CRON_FIELDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))


def _cron_matches(expr: str, t: datetime) -> bool:
    """A five-field UTC cron (numbers, *, lists, ranges, steps), as NodePool budget schedules are written."""
    macros = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
              "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
    fields = macros.get(expr.strip(), expr).split()
    values = (t.minute, t.hour, t.day, t.month, (t.weekday() + 1) % 7)
    for f, v, (lo, hi) in zip(fields, values, _CRON_FIELDS):
        ok = False
        for part in f.split(","):
            rng, _, step = part.partition("/")
            a, b = (lo, hi) if rng == "*" else (int(rng.split("-")[0]), int(rng.split("-")[-1]))
            ok |= a <= v <= b and (v - a) % int(step or 1) == 0
        if not ok:
            return False
    return True


def budget_allows(pool: dict, reason: str, num_nodes: int, now: float) -> int:
    """NodePool.GetAllowedDisruptionsByReason (kubernetes-sigs pkg/apis/v1/nodepool.go): the least of the active
    budgets that name ``reason`` or no reason; a percentage of ``num_nodes`` rounds up."""
    allowed = 2**31 - 1
    budgets = ((pool.get("spec") or {}).get("disruption") or {}).get("budgets") or [{"nodes": "10%"}]
    t = datetime.fromtimestamp(now, timezone.utc).replace(second=0, microsecond=0)
    for b in budgets:
        if b.get("reasons") is not None and reason not in b["reasons"]:
            continue
        if b.get("schedule"):
            minutes = parse_go_duration(b.get("duration") or "0s", "budget.duration") // 60_000_000_000
            if not any(_cron_matches(b["schedule"], t - timedelta(minutes=m)) for m in range(int(minutes) + 1)):
                continue
        nodes = str(b.get("nodes", "10%"))
        value = math.ceil(int(nodes[:-1]) * num_nodes / 100) if nodes.endswith("%") else int(nodes)
        allowed = min(allowed, value)
    return allowed


@dataclass(frozen=True)
class SimNode:
    claim: str
    node: str
    provider_id: str
    instance_type: str


class KarpenterSim:
    def __init__(self, api_client, zone: str = "us-west-2a", default_instance_type: str = "p5.48xlarge",
                 ec2nodeclass_hash_version: str = DEFAULT_EC2NODECLASS_VERSION,
                 ca_bundle: str | None = None):
        """``ec2nodeclass_hash_version``: v5 plays Karpenter v1.14, v6 its main branch."""
        self.api, self.kube = api_client, Kube(api_client)
        self.zone, self.default_instance_type = zone, default_instance_type
        self.nodeclass_version = ec2nodeclass_hash_version
        self.ca_bundle = _ca_bundle(api_client) if ca_bundle is None else ca_bundle
        self._held: dict[str, str] = {}      # NodeClaim -> the registration hook holding it back

    def nodepool_hash(self, np: dict) -> drifthash.StampedHash:
        return drifthash.nodepool_hash(np)

    def nodeclass_hash(self, nc: dict) -> drifthash.StampedHash:
        return drifthash.ec2nodeclass_hash(nc, self.ca_bundle, self.nodeclass_version)

    # 0 -------------------------------------------------------------------------------------------------
    def sync_hashes(self, nodepool: str) -> dict[str, str]:
        """Karpenter's hash controllers for a NodePool and its EC2NodeClass (kubernetes-sigs
        ``pkg/controllers/nodepool/hash/controller.go``, provider ``pkg/controllers/nodeclass/hash/controller.go``):
        when the object's hash-version annotation is not the controller's, first re-stamp its NodeClaims of another
        version (the version always, the hash only on NodeClaims not already Drifted), then annotate the object
        with its hash and version. Returns the annotations a NodeClaim launched now would get."""
        np = self.kube.get(NODEPOOLS, nodepool)
        stamp = self.nodepool_hash(np)
        claims = [c for c in self.kube.list(NODECLAIMS)["items"]
                  if (c["metadata"].get("labels") or {}).get("karpenter.sh/nodepool") == nodepool]
        out = self._stamp(NODEPOOLS, np, stamp, claims)
        ref = np["spec"]["template"]["spec"]["nodeClassRef"]
        if ref.get("kind") == "EC2NodeClass":
            nc = self.kube.get(EC2NODECLASSES, ref["name"])
            mine = [c for c in self.kube.list(NODECLAIMS)["items"]
                    if (c["spec"].get("nodeClassRef") or {}).get("name") == ref["name"]
                    and (c["spec"].get("nodeClassRef") or {}).get("kind") == "EC2NodeClass"]
            out.update(self._stamp(EC2NODECLASSES, nc, self.nodeclass_hash(nc), mine))
        return out

    def _stamp(self, res, obj: dict, stamp: drifthash.StampedHash, claims: list[dict]) -> dict[str, str]:
        values = {stamp.hash_annotation: stamp.value, stamp.version_annotation: stamp.version}
        have = obj["metadata"].get("annotations") or {}
        if have.get(stamp.version_annotation) != stamp.version:
            for c in claims:
                ann = c["metadata"].get("annotations") or {}
                if ann.get(stamp.version_annotation) == stamp.version:
                    continue
                patch = {stamp.version_annotation: stamp.version}
                if not any(x.get("type") == "Drifted" for x in (c.get("status") or {}).get("conditions") or ()):
                    patch[stamp.hash_annotation] = stamp.value
                self.kube.merge_patch(NODECLAIMS, c["metadata"]["name"], {"metadata": {"annotations": patch}})
        if any(have.get(k) != v for k, v in values.items()):
            self.kube.merge_patch(res, obj["metadata"]["name"], {"metadata": {"annotations": values}})
        return values

    def drifted(self, claim: str) -> str | None:
        """The drift controller's verdict for a NodeClaim after the hash controllers have run: NodePoolDrifted,
        RequirementsDrifted, NodeClassDrift, AMIDrift, or None."""
        c = self.kube.get(NODECLAIMS, claim)
        pool = c["metadata"]["labels"]["karpenter.sh/nodepool"]
        self.sync_hashes(pool)
        c, np = self.kube.get(NODECLAIMS, claim), self.kube.get(NODEPOOLS, pool)
        ref = c["spec"]["nodeClassRef"]
        nc = self.kube.get(EC2NODECLASSES, ref["name"]) if ref.get("kind") == "EC2NodeClass" else None
        return drift.nodeclaim_drift(c, np, nc)

    def mark_drifted(self, claim: str) -> str | None:
        """Set (or clear) the NodeClaim's Drifted condition as the drift controller does; returns the reason."""
        reason = self.drifted(claim)
        c = self.kube.get(NODECLAIMS, claim)
        status = c.get("status") or {}
        conds = [x for x in status.get("conditions") or () if x["type"] != "Drifted"]
        if reason:
            conds = _set_condition(status.get("conditions") or [], _cond("Drifted", "True", reason, reason))
        status["conditions"] = conds
        self.kube.merge_patch(NODECLAIMS, claim, {"status": status}, sub="status")
        return reason

    def resolve_amis(self, nodeclass: str, image_ids: list[str]) -> None:
        """The EC2NodeClass status controller resolving amiSelectorTerms (e.g. a new @latest release)."""
        nc = self.kube.get(EC2NODECLASSES, nodeclass)
        status = nc.get("status") or {}
        status["amis"] = [{"id": i, "name": i, "requirements": []} for i in image_ids]
        self.kube.merge_patch(EC2NODECLASSES, nodeclass, {"status": status}, sub="status")

    # 1 -------------------------------------------------------------------------------------------------
    def create_nodeclaim(self, nodepool: str, name: str | None = None, instance_type: str | None = None,
                         pod_labels: dict[str, str] | None = None) -> dict:
        hashes = self.sync_hashes(nodepool)
        np = self.kube.get(NODEPOOLS, nodepool)
        tmpl = np["spec"]["template"]
        ts = tmpl.get("spec") or {}
        it = instance_type or self.default_instance_type
        facts = instancetypes.offline_table().get(it)
        labels = {**((tmpl.get("metadata") or {}).get("labels") or {}), "karpenter.sh/nodepool": nodepool,
                  "node.kubernetes.io/instance-type": it, "karpenter.sh/capacity-type": "on-demand",
                  "topology.kubernetes.io/zone": self.zone}
        if facts:
            labels.update({"karpenter.k8s.aws/instance-gpu-count": str(facts.gpus)})
            if facts.nvme_gb:
                labels["karpenter.k8s.aws/instance-local-nvme"] = str(facts.nvme_gb)
        # Requirements.Labels(): a requirement with one value labels the NodeClaim; an Exists on a key no instance
        # type defines takes the value of the pending pod's nodeSelector (``pod_labels``, else a stand-in value).
        for r in ts.get("requirements") or ():
            if r.get("operator") == "In" and len(r.get("values") or ()) == 1:
                labels.setdefault(r["key"], r["values"][0])
            elif r.get("operator") == "In" and r["key"] == "karpenter.sh/capacity-type":
                labels[r["key"]] = r["values"][0] if "on-demand" not in r["values"] else "on-demand"
            elif r.get("operator") == "Exists" and r["key"] not in labels:
                labels[r["key"]] = (pod_labels or {}).get(r["key"], "pod-selected")
        labels.update(pod_labels or {})
        reqs = [r for r in ts.get("requirements") or () if r.get("key") != "node.kubernetes.io/instance-type"]
        reqs.append({"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [it]})
        spec = {"nodeClassRef": ts["nodeClassRef"], "requirements": reqs,
                "resources": {"requests": {"cpu": "1"}}}
        for k in ("taints", "startupTaints", "expireAfter", "terminationGracePeriod"):
            if ts.get(k) is not None:
                spec[k] = ts[k]
        body = {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                "metadata": {"name": name or f"{nodepool}-{secrets.token_hex(3)}", "labels": labels,
                             "annotations": {**((tmpl.get("metadata") or {}).get("annotations") or {}), **hashes},
                             "finalizers": [TERMINATION_FINALIZER],
                             "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                                                  "name": nodepool, "uid": np["metadata"]["uid"],
                                                  "blockOwnerDeletion": True}]},
                "spec": spec}
        return self.kube.create(NODECLAIMS, body)

    # 2 -------------------------------------------------------------------------------------------------
    def launch(self, claim: str, instance_id: str | None = None, image_id: str = DEFAULT_IMAGE_ID) -> dict:
        c = self.kube.get(NODECLAIMS, claim)
        iid = instance_id or f"i-{secrets.token_hex(8)}"
        status = c.get("status") or {}
        status.update({"providerID": f"aws:///{self.zone}/{iid}", "imageID": image_id,
                       "capacity": {"cpu": "192", "memory": "2048Gi", "nvidia.com/gpu": "8"},
                       "allocatable": {"cpu": "191", "memory": "2000Gi", "nvidia.com/gpu": "8"}})
        conds = status.get("conditions") or []
        for t in ("Registered", "Initialized"):
            if not any(c["type"] == t for c in conds):
                conds = _set_condition(conds, _cond(t, "Unknown", "AwaitingReconciliation", "object is awaiting reconciliation"))
        status["conditions"] = _set_condition(conds, _cond("Launched", "True", "Launched"))
        return self.kube.merge_patch(NODECLAIMS, claim, {"status": status}, sub="status")

    # 3 -------------------------------------------------------------------------------------------------
    def register_node(self, claim: str, node_name: str | None = None) -> dict:
        c = self.kube.get(NODECLAIMS, claim)
        pid = c["status"]["providerID"]
        spec = c["spec"]
        name = node_name or f"ip-10-0-{secrets.randbelow(255)}-{secrets.randbelow(255)}.{claim}.internal"
        labels = {**c["metadata"].get("labels", {}), "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64"}
        taints = [dict(t) for t in (spec.get("taints") or []) + (spec.get("startupTaints") or [])] + [dict(UNREGISTERED)]
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                "spec": {"providerID": pid, "taints": taints}}
        return self.kube.create(NODES, body)

    # 4 -------------------------------------------------------------------------------------------------
    def kubelet_ready(self, node: str) -> dict:
        now = _now()
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}
        # A kubelet reports its capacity with its first status; the scheduler needs it to place GPU pods.
        it = self.kube.get(NODES, node)["metadata"]["labels"].get("node.kubernetes.io/instance-type", "")
        facts = instancetypes.offline_table().get(it)
        gpus = str(facts.gpus if facts else 0)
        resources = {"cpu": "192", "memory": "2048Gi", "pods": "110", "nvidia.com/gpu": gpus,
                     "ephemeral-storage": f"{facts.nvme_gb if facts else 100}G"}
        self.kube.request("PATCH", NODES.path(node, sub="status"),
                          body={"status": {"conditions": [ready], "capacity": resources, "allocatable": resources}},
                          content_type="application/strategic-merge-patch+json")
        return self._remove_taints(node, lambda t: t.get("key") == "node.kubernetes.io/not-ready")

    # 5 -------------------------------------------------------------------------------------------------
    def run_daemonset_pod(self, node: str, namespace: str, daemonset: str) -> dict:
        """The DaemonSet controller and the node's kubelet for one DaemonSet pod (nothing runs containers
        here): the pod from the stored template, bound to ``node``, then the status a kubelet reports once
        every init container ran and the main ones started, with the image IDs a runtime would give."""
        import copy
        import hashlib

        from kubernetes import client

        apps, core = client.AppsV1Api(self.api), client.CoreV1Api(self.api)
        ds = self.api.sanitize_for_serialization(apps.read_namespaced_daemon_set(daemonset, namespace))
        template = copy.deepcopy(ds["spec"]["template"])
        md = {"generateName": f"{daemonset}-", "namespace": namespace, "labels": template["metadata"]["labels"],
              "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": daemonset,
                                   "uid": ds["metadata"]["uid"], "controller": True}]}
        pod = self.api.sanitize_for_serialization(core.create_namespaced_pod(
            namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": {**template["spec"], "nodeName": node}}))

        def status(c: dict, state: dict) -> dict:
            # As containerd names them: the registry and library/ spelled out, the tag in "image", the
            # repository digest (never the tag) in "imageID".
            ref = c["image"].partition("@")[0]
            repo, tag = (ref.rsplit(":", 1) if ref.rfind(":") > ref.rfind("/") else (ref, "latest"))
            first = repo.split("/", 1)[0]
            if "/" not in repo or not ("." in first or ":" in first or first == "localhost"):
                repo = f"docker.io/{repo if '/' in repo else 'library/' + repo}"
            digest = hashlib.sha256(c["image"].encode()).hexdigest()
            return {"name": c["name"], "image": f"{repo}:{tag}", "imageID": f"{repo}@sha256:{digest}",
                    "ready": "running" in state, "restartCount": 0, "state": state}

        now = _now()
        body = {"status": {"phase": "Running", "startTime": now,
                           "initContainerStatuses": [status(c, {"terminated": {"exitCode": 0, "reason": "Completed",
                                                                               "startedAt": now, "finishedAt": now}})
                                                     for c in pod["spec"].get("initContainers") or []],
                           "containerStatuses": [status(c, {"running": {"startedAt": now}})
                                                 for c in pod["spec"]["containers"]]}}
        return self.api.sanitize_for_serialization(
            core.patch_namespaced_pod_status(pod["metadata"]["name"], namespace, body))

    def hold_registration(self, claim: str, hook: str = "test-registration-hook") -> None:
        """A registration hook not ready for ``claim`` (cloudprovider.NodeLifecycleHook.Registered asking for a
        requeue): until ``release_registration``, each ``mark_registered`` merges the NodeClaim's taints into the Node
        but leaves karpenter.sh/unregistered on it and Registered Unknown (RegistrationHookPending, the hook's name)."""
        self._held[claim] = hook

    def release_registration(self, claim: str) -> None:
        self._held.pop(claim, None)

    def mark_registered(self, claim: str, ago_s: float = 0.0, tries: int = 5) -> dict:
        """One pass of Karpenter's registration reconcile (kubernetes-sigs/karpenter
        ``pkg/controllers/nodeclaim/lifecycle/registration.go`` at 2266468): only while Registered is Unknown (it
        registers once); the Node linked by providerID; ``syncNode``: the termination finalizer, an owner reference
        to the NodeClaim, the NodeClaim's ``spec.taints`` then ``spec.startupTaints`` appended where the Node lacks
        their key and effect (unless the Node is labelled karpenter.sh/do-not-sync-taints=true), its annotations and
        labels over the Node's; then, unless a hook holds it (``hold_registration``), karpenter.sh/unregistered
        removed and karpenter.sh/registered=true, all in one optimistic-locked merge patch (a conflict re-reads);
        then Registered=True and status.nodeName. ``ago_s`` dates Registered back: deadline tests (deadlines are
        >= 1m) need not wait a minute."""
        c = self.kube.get(NODECLAIMS, claim)
        registered = next((x for x in (c.get("status") or {}).get("conditions") or () if x["type"] == "Registered"),
                          None)
        if registered is not None and registered["status"] != "Unknown":
            return c
        node = self.find_node(c["status"]["providerID"])
        if node is None:
            raise LookupError(f"NodeNotFound: no Node has providerID {c['status']['providerID']}")
        hook = self._held.get(claim)
        for _ in range(tries):
            patch = self._sync_node(c, node, hold=hook is not None)
            if patch is None:
                break
            try:
                self.kube.merge_patch(NODES, node["metadata"]["name"], patch)
                break
            except ApiException as e:
                if e.status != 409:
                    raise
                node = self.kube.get(NODES, node["metadata"]["name"])
        else:
            raise RuntimeError(f"node {node['metadata']['name']} kept changing during registration")
        status = c["status"]
        if hook is not None:
            status["conditions"] = _set_condition(status.get("conditions") or [],
                                                  _cond("Registered", "Unknown", "RegistrationHookPending", hook))
            return self.kube.merge_patch(NODECLAIMS, claim, {"status": status}, sub="status")
        status["nodeName"] = node["metadata"]["name"]
        status["conditions"] = _set_condition(status.get("conditions") or [],
                                              _cond("Registered", "True", "Registered", ago_s=ago_s))
        return self.kube.merge_patch(NODECLAIMS, claim, {"status": status}, sub="status")

    @staticmethod
    def _sync_node(c: dict, node: dict, hold: bool) -> dict | None:
        """The merge patch registration sends for ``node`` (None: nothing to change), with its resourceVersion as
        the optimistic lock (controller-runtime's MergeFromWithOptimisticLock)."""
        md, spec = node["metadata"], node.get("spec") or {}
        labels = {**(md.get("labels") or {}), **(c["metadata"].get("labels") or {})}
        annotations = {**(md.get("annotations") or {}), **(c["metadata"].get("annotations") or {})}
        finalizers = list(md.get("finalizers") or ())
        if TERMINATION_FINALIZER not in finalizers:
            finalizers.append(TERMINATION_FINALIZER)
        owners = list(md.get("ownerReferences") or ())
        if not any(o.get("kind") == "NodeClaim" and o.get("uid") == c["metadata"]["uid"] for o in owners):
            owners.append({"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": c["metadata"]["name"],
                           "uid": c["metadata"]["uid"], "blockOwnerDeletion": True})
        taints = [dict(t) for t in spec.get("taints") or ()]
        if (md.get("labels") or {}).get(DO_NOT_SYNC_TAINTS) != "true":
            for t in (c["spec"].get("taints") or []) + (c["spec"].get("startupTaints") or []):
                if not any(x["key"] == t["key"] and x["effect"] == t["effect"] for x in taints):    # Taints.Merge
                    taints.append(dict(t))
        if not hold:
            taints = [t for t in taints if not (t["key"] == UNREGISTERED["key"]
                                                and t["effect"] == UNREGISTERED["effect"])]
            labels[REGISTERED_LABEL] = "true"
        after = {"labels": labels, "annotations": annotations, "finalizers": finalizers, "ownerReferences": owners}
        if all((md.get(k) or type(v)()) == v for k, v in after.items()) and (spec.get("taints") or []) == taints:
            return None
        return {"metadata": {**after, "resourceVersion": md["resourceVersion"]}, "spec": {"taints": taints or None}}

    # 6 -------------------------------------------------------------------------------------------------
    def sync_initialized(self, claim: str) -> bool:
        """Karpenter's initialization reconcile (``lifecycle/initialization.go``): only once Registered=True and
        while Initialized is Unknown (decided once: a startup taint put back later does not undo it)."""
        c = self.kube.get(NODECLAIMS, claim)
        conds = {x["type"]: x for x in (c.get("status") or {}).get("conditions") or ()}
        if "Initialized" in conds and conds["Initialized"]["status"] != "Unknown":
            return conds["Initialized"]["status"] == "True"
        if (conds.get("Registered") or {}).get("status") != "True":
            return False
        node = self.find_node((c.get("status") or {}).get("providerID", ""))
        if node is None:
            return False
        startup = {t["key"] for t in c["spec"].get("startupTaints") or ()}
        taints = node["spec"].get("taints") or ()
        blocked = [t["key"] for t in taints if t["key"] in startup or t["key"] in EPHEMERAL_TAINT_KEYS
                   or t["key"].startswith(EPHEMERAL_TAINT_PREFIX)]
        ready = any(x["type"] == "Ready" and x["status"] == "True" for x in (node.get("status") or {}).get("conditions") or ())
        status = c["status"]
        if not ready or blocked:
            if not ready:
                reason, msg = "NodeNotReady", "Node status is NotReady"
            elif blocked[0] in startup:
                reason, msg = "StartupTaintsExist", f"StartupTaint {blocked[0]!r} still exists"
            else:
                reason, msg = "KnownEphemeralTaintsExist", f"KnownEphemeralTaint {blocked[0]!r} still exists"
            # Unknown, not False: Karpenter never sets Initialized=False on the way up.
            status["conditions"] = _set_condition(status.get("conditions") or [], _cond("Initialized", "Unknown", reason, msg))
            self.kube.merge_patch(NODECLAIMS, claim, {"status": status}, sub="status")
            return False
        self.kube.merge_patch(NODES, node["metadata"]["name"], {"metadata": {"labels": {"karpenter.sh/initialized": "true"}}})
        status["conditions"] = _set_condition(status.get("conditions") or [], _cond("Initialized", "True", "Initialized"))
        self.kube.merge_patch(NODECLAIMS, claim, {"status": status}, sub="status")
        return True

    # repair --------------------------------------------------------------------------------------------
    def repair_candidates(self, nodepool: str, now: float | None = None) -> list[str]:
        """NodeClaims of ``nodepool`` whose Node has held a REPAIR_POLICIES condition past its toleration and that
        are not already being deleted, longest-eligible first."""
        now = time.time() if now is None else now
        out = []
        for c in self._claims_of(nodepool):
            node = self.find_node((c.get("status") or {}).get("providerID", ""))
            if node is None or c["metadata"].get("deletionTimestamp"):
                continue
            conds = {x["type"]: x for x in (node.get("status") or {}).get("conditions") or ()}
            due = [_parse_time(conds[p.condition]["lastTransitionTime"]) + p.toleration_s for p in REPAIR_POLICIES
                   if p.condition in conds and conds[p.condition]["status"] == p.status]
            if due and min(due) <= now:
                out.append((min(due), c["metadata"]["name"]))
        return [name for _, name in sorted(out)]

    def set_node_condition(self, node: str, ctype: str, status: str, reason: str = "", ago_s: float = 0.0) -> None:
        """A kubelet or the node monitoring agent reporting a condition, dated ``ago_s`` back."""
        c = {"type": ctype, "status": status, "reason": reason or f"{ctype}{status}", "message": reason or ctype,
             "lastHeartbeatTime": _now(), "lastTransitionTime": _now(ago_s)}
        self.kube.request("PATCH", NODES.path(node, sub="status"), body={"status": {"conditions": [c]}},
                          content_type="application/strategic-merge-patch+json")

    def repair(self, nodepool: str, now: float | None = None) -> list[str]:
        """One pass of node repair as Karpenter v1.15 runs it: a voluntary disruption with reason Unhealthy, so
        at most the NodePool's budget for that reason (counted over its initialized nodes, less the ones already
        being deleted; NotReady nodes do not use up the repair budget), and terminate-first: the NodeClaim is
        deleted with no replacement launched ahead, the provisioner replaces it for the pods that go pending.
        Returns the NodeClaims it deleted."""
        now = time.time() if now is None else now
        chosen = self.repair_candidates(nodepool, now)[:self.repair_room(nodepool, now)]
        for name in chosen:
            self.delete_nodeclaim(name)
        return chosen

    def repair_room(self, nodepool: str, now: float | None = None) -> int:
        """How many more NodeClaims repair may delete now (BuildDisruptionBudgetMapping for reason Unhealthy): the
        budget is counted over the pool's initialized nodes, and only those already being deleted use it up (an
        uninitialized node being deleted, a deadline replace of a warming node, does not)."""
        now = time.time() if now is None else now
        claims = self._claims_of(nodepool)
        initialized = [c for c in claims if any(x["type"] == "Initialized" and x["status"] == "True"
                                                for x in (c.get("status") or {}).get("conditions") or ())]
        deleting = sum(1 for c in initialized if c["metadata"].get("deletionTimestamp"))
        allowed = budget_allows(self.kube.get(NODEPOOLS, nodepool), UNHEALTHY, len(initialized), now)
        return max(0, allowed - deleting)

    def _claims_of(self, nodepool: str) -> list[dict]:
        return [c for c in self.kube.list(NODECLAIMS)["items"]
                if (c["metadata"].get("labels") or {}).get("karpenter.sh/nodepool") == nodepool]

    # -- conveniences ----------------------------------------------------------------------------------
    def join(self, nodepool: str, node_name: str | None = None, instance_type: str | None = None,
             claim_name: str | None = None) -> SimNode:
        """Steps 1-4: a node whose kubelet joined (Ready) under the NodeClaim's taints and karpenter.sh/unregistered,
        not yet registered by Karpenter (``mark_registered``)."""
        c = self.create_nodeclaim(nodepool, claim_name, instance_type)
        name = c["metadata"]["name"]
        launched = self.launch(name)
        node = self.register_node(name, node_name)
        self.kubelet_ready(node["metadata"]["name"])
        return SimNode(name, node["metadata"]["name"], launched["status"]["providerID"],
                       c["metadata"]["labels"]["node.kubernetes.io/instance-type"])

    def scale_up(self, nodepool: str, node_name: str | None = None, instance_type: str | None = None,
                 claim_name: str | None = None, registered_ago_s: float = 0.0) -> SimNode:
        """Steps 1-5: a node that is registered and Ready, still carrying its startup taints."""
        n = self.join(nodepool, node_name, instance_type, claim_name)
        self.mark_registered(n.claim, registered_ago_s)
        return n

    def find_node(self, provider_id: str) -> dict | None:
        """Link by providerID only (0 -> NodeNotFound, >1 -> MultipleNodesFound), as Karpenter does."""
        if not provider_id:
            return None
        nodes = [n for n in self.kube.list(NODES)["items"] if (n.get("spec") or {}).get("providerID") == provider_id]
        if len(nodes) > 1:
            raise LookupError(f"MultipleNodesFound: {[n['metadata']['name'] for n in nodes]} share {provider_id}")
        return nodes[0] if nodes else None

    def delete_nodeclaim(self, claim: str) -> None:
        """Ask for deletion: with the finalizer the NodeClaim stays, deletionTimestamp set, until
        ``finish_termination``."""
        try:
            self.kube.delete(NODECLAIMS, claim)
        except ApiException as e:
            if e.status != 404:
                raise

    def delete_node(self, node: str) -> None:
        """Someone deletes a Node: Karpenter terminates its NodeClaim and the instance, then both go."""
        try:
            n = self.kube.get(NODES, node)
        except ApiException as e:
            if e.status != 404:
                raise
            return
        claim = self._claim_for((n.get("spec") or {}).get("providerID", ""))
        if claim:
            self.delete_nodeclaim(claim)
            self.finish_termination(claim)
        else:
            self._delete_and_release(NODES, node)

    def finish_termination(self, claim: str) -> None:
        """The termination controller for a NodeClaim being deleted: its Node goes, then the NodeClaim."""
        try:
            c = self.kube.get(NODECLAIMS, claim)
        except ApiException as e:
            if e.status != 404:
                raise
            return
        node = self.find_node((c.get("status") or {}).get("providerID", ""))
        if node is not None:
            self._delete_and_release(NODES, node["metadata"]["name"])
        self._delete_and_release(NODECLAIMS, claim)

    def _delete_and_release(self, res, name: str) -> None:
        for step in (lambda: self.kube.delete(res, name),
                     lambda: self.kube.merge_patch(res, name, {"metadata": {"finalizers": None}})):
            try:
                step()
            except ApiException as e:
                if e.status != 404:
                    raise
                return

    def _claim_for(self, provider_id: str) -> str | None:
        if not provider_id:
            return None
        for c in self.kube.list(NODECLAIMS)["items"]:
            if (c.get("status") or {}).get("providerID") == provider_id:
                return c["metadata"]["name"]
        return None

    def _remove_taints(self, node: str, match, tries: int = 5) -> dict:
        """Guarded JSON patch (test-then-remove), like any careful controller: others' taints survive."""
        for _ in range(tries):
            n = self.kube.get(NODES, node)
            taints = n["spec"].get("taints") or []
            ops = []
            for i in reversed(range(len(taints))):
                if match(taints[i]):
                    ops += [{"op": "test", "path": f"/spec/taints/{i}", "value": taints[i]},
                            {"op": "remove", "path": f"/spec/taints/{i}"}]
            if not ops:
                return n
            try:
                return self.kube.json_patch(NODES, node, ops)
            except ApiException as e:
                if e.status not in (409, 422):
                    raise
                time.sleep(0.01)
        raise RuntimeError(f"node {node} kept changing while removing taints")
