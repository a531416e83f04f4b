"""The typed views of NodeClaims and Nodes and the controller's record on a Node (nodewarm.api.views): the record
reads back what was written and garbage as no record; a Node's cached view holds only the fields it projects."""

from __future__ import annotations

import copy
import json

from nodewarm.api.timeutil import fmt_time
from nodewarm.api.views import NodeView, WarmState
from support.claimscene import T0, node_obj


def test_state_roundtrip_and_garbage():
    s = WarmState("p", "c", "Untainted", decided=fmt_time(T0))
    assert WarmState.from_json(s.to_json()) == s
    assert WarmState.from_json("{not json") is None and WarmState.from_json(json.dumps({"x": 1})) is None


# -- the cached view is a projection --------------------------------------------------------------------

def realistic_node(i: int = 0) -> dict:
    """~30 KB like a GPU node in a real cluster: 50 images (the kubelet's cap) with 3 names each, 60
    labels, the usual conditions."""
    node = node_obj()
    node["metadata"]["labels"].update({f"label-{j}.example.com/key": f"value-{j}-{i}" for j in range(60)})
    node["metadata"]["annotations"] = {"node.alpha.kubernetes.io/ttl": "0", "csi.volume.kubernetes.io/nodeid": "{}" * 50,
                                       "nodewarm.io/compile-cache": "hit"}
    repo = "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml-platform/inference-serving-team"
    node["status"]["images"] = [{"names": [f"{repo}/image-{j}@sha256:{'a' * 64}", f"{repo}/image-{j}:v{j}.{i}",
                                           f"{repo}/image-{j}:latest-build-{i}",
                                           f"public.ecr.aws/mirror/team/image-{j}:v{j}.{i}"],
                                 "sizeBytes": 1_000_000_000 + j} for j in range(50)]
    node["status"]["conditions"] += [{"type": t, "status": "False", "reason": f"Kubelet{t}", "message": "x" * 200,
                                      "lastHeartbeatTime": fmt_time(T0), "lastTransitionTime": fmt_time(T0)}
                                     for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")]
    node["status"]["nodeInfo"] = {k: f"{k}-value-{'x' * 40}" for k in (
        "machineID", "systemUUID", "bootID", "kernelVersion", "osImage", "containerRuntimeVersion",
        "kubeletVersion", "kubeProxyVersion", "operatingSystem", "architecture")}
    return node


def _deep_size(o, seen=None) -> int:
    import sys
    seen = seen if seen is not None else set()
    if id(o) in seen:
        return 0
    seen.add(id(o))
    n = sys.getsizeof(o)
    if isinstance(o, dict):
        n += sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in o.items())
    elif isinstance(o, (list, tuple, set)):
        n += sum(_deep_size(x, seen) for x in o)
    elif hasattr(o, "__dataclass_fields__"):
        n += sum(_deep_size(getattr(o, f), seen) for f in o.__dataclass_fields__)
    return n


def test_the_cached_node_view_holds_only_the_projected_fields():
    import dataclasses

    obj = realistic_node()
    assert len(json.dumps(obj)) > 25_000
    view = NodeView.from_obj(obj)
    assert {f.name for f in dataclasses.fields(NodeView)} == {
        "name", "uid", "provider_id", "created", "deleting", "any_labels", "nodepool", "annotations",
        "any_annotations", "taints", "warm", "resource_version", "profile", "model_labels"}
    assert set(view.annotations) == {"nodewarm.io/compile-cache"}       # only ours
    assert view.any_labels and view.any_annotations
    assert _deep_size(view) * 10 < len(json.dumps(obj))                  # a small fraction of the object
    # resourceVersion rides along for guards but a change only in it is no change.
    bumped = copy.deepcopy(obj)
    bumped["metadata"]["resourceVersion"] = "999"
    bumped["metadata"]["labels"]["another"] = "label"
    assert NodeView.from_obj(bumped) == view
