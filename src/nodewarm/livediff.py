"""`nodewarm render --diff`: before anything is applied, which live NodeClaims the rendered NodePool and NodeClass
would drift, and why. The thin I/O is ``read`` (through the controller's Kube, so it sits above the controller, beside
render_cli.py); the judgement is ``driftpreview.preview``, the same function the controller's WouldDrift guard calls,
so the preview and the controller cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

from nodewarm.karpenter import driftpreview

# What --diff reads, and nothing else: a read-only identity needs exactly these rules.
RBAC_RULES = (
    {"apiGroups": ["karpenter.sh"], "resources": ["nodepools"], "verbs": ["get"]},
    {"apiGroups": ["karpenter.sh"], "resources": ["nodeclaims"], "verbs": ["list"]},
    {"apiGroups": ["karpenter.k8s.aws"], "resources": ["ec2nodeclasses"], "verbs": ["get"]},
    {"apiGroups": ["eks.amazonaws.com"], "resources": ["nodeclasses"], "verbs": ["get"]},
)
NODE_KINDS = ("NodePool", "EC2NodeClass", "NodeClass")

# Exit code of --diff when some NodeClaim would drift (0: none would; 1/2 as for render).
WOULD_DRIFT_EXIT = 3


@dataclass(frozen=True)
class LiveDiff:
    objects: tuple[tuple[str, bool], ...]       # ("Kind/name", exists in the cluster), in render order
    preview: driftpreview.Preview


def _resource(kind: str):
    from nodewarm.controller.kube import AUTOMODE_NODECLASSES, EC2NODECLASSES, NODEPOOLS

    return {"NodePool": NODEPOOLS, "EC2NodeClass": EC2NODECLASSES, "NodeClass": AUTOMODE_NODECLASSES}[kind]


def read(api_client, documents: list[dict]) -> LiveDiff:
    """GET the live counterpart of each rendered node object, list the NodeClaims, and preview the apply."""
    from nodewarm.controller.kube import NODECLAIMS, Kube

    k = Kube(api_client, request_timeout_s=60.0)
    rendered = [d for d in documents if d.get("kind") in NODE_KINDS]
    live, after, objects = [], [], []
    for doc in rendered:
        try:
            cur = k.get(_resource(doc["kind"]), doc["metadata"]["name"])
        except ApiException as e:
            if e.status != 404:
                raise
            cur = None
        objects.append((f"{doc['kind']}/{doc['metadata']['name']}", cur is not None))
        if cur is not None:
            live.append({**cur, "kind": doc["kind"]})
            # `kubectl apply --server-side` of the rendered object: its fields laid over the live ones.
            after.append({**driftpreview.objects_after(cur, doc), "kind": doc["kind"]})
    claims = k.list(NODECLAIMS).get("items", []) if live else []
    return LiveDiff(tuple(objects), driftpreview.preview(after, live, claims))


def report(diff: LiveDiff, size_gb: float | None = None) -> list[str]:
    """The lines --diff prints: per object its live NodeClaims, then each NodeClaim that would drift and why."""
    pv = diff.preview
    lines = []
    for obj, exists in diff.objects:
        if not exists:
            lines.append(f"{obj}: not in the cluster (created by the apply; no NodeClaim to drift)")
            continue
        mine = [d for d in pv.drifts if d.source == obj]
        would = sorted({d.nodeclaim for d in mine if d.when == driftpreview.WOULD})
        lines.append(f"{obj}: {pv.claims.get(obj, 0)} live NodeClaim(s), {len(would)} would drift")
        for d in sorted(mine, key=lambda d: (d.when != driftpreview.WOULD, d.nodeclaim, d.reason)):
            tag = "would drift" if d.when == driftpreview.WOULD else "already drifted"
            lines.append(f"  {d.nodeclaim}  {d.reason}  {tag}: {d.why}")
    n = pv.count()
    if n:
        pull = f"; each re-pulls {size_gb:g} GB of weights ({n * size_gb:g} GB in all)" if size_gb else ""
        lines.append(f"applying would drift {n} NodeClaim(s) of NodePool(s) {', '.join(pv.pools())}: Karpenter "
                     f"replaces them within the pools' disruption budgets{pull}")
    else:
        lines.append("applying would drift no NodeClaim")
    return lines
