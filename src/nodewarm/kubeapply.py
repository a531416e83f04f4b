"""Server-side apply of rendered documents (what `kubectl apply --server-side` does), with the result
per object, so the CLI and the demo can say exactly what was created or changed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Applied:
    kind: str
    name: str
    namespace: str | None
    action: str            # created | configured | unchanged


def apply(api_client, docs: list[dict], field_manager: str = "nodewarm", force: bool = True) -> list[Applied]:
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import NotFoundError

    dyn = DynamicClient(api_client)
    results = []
    for doc in docs:
        res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        name = doc["metadata"]["name"]
        ns = doc["metadata"].get("namespace") if res.namespaced else None
        try:
            before = res.get(name=name, namespace=ns).metadata.resourceVersion
        except NotFoundError:
            before = None
        after = res.server_side_apply(body=doc, name=name, namespace=ns, field_manager=field_manager,
                                      force_conflicts=force).metadata.resourceVersion
        action = "created" if before is None else ("unchanged" if before == after else "configured")
        results.append(Applied(doc["kind"], name, ns, action))
    return results
