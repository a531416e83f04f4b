"""The injector's bodies: only owned fields, the user's parts kept, and convergence after one apply."""

from __future__ import annotations

import pytest

from nodewarm import instancetypes, profile
from nodewarm.kubeapply import apply
from nodewarm.nodeclasses import inject
from profiles import USER_MIME, v


def prof(mode="karpenter", **kw):
    p = profile.from_dict(v(mode, **kw))
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    return p, types


def test_nodepool_startup_taint_added_once_and_user_taints_kept():
    p, _ = prof()
    current = {"spec": {"template": {"spec": {"startupTaints": [{"key": "example.com/agent", "effect": "NoExecute"}]}}}}
    body = inject.desired_nodepool_fields(p, current)
    taints = body["spec"]["template"]["spec"]["startupTaints"]
    assert taints == [{"key": "example.com/agent", "effect": "NoExecute"}, {"key": "nodewarm.io/warming", "effect": "NoSchedule"}]
    again = inject.desired_nodepool_fields(p, body)
    assert again == body and inject.differs(again, body) == []


def test_automode_owns_only_ephemeral_storage_size():
    p, types = prof("automode")
    body = inject.desired_nodeclass_fields(p, {"spec": {"ephemeralStorage": {"iops": 6000}}}, types)
    assert body["spec"] == {"ephemeralStorage": {"size": body["spec"]["ephemeralStorage"]["size"]}}


@pytest.mark.kube
def test_injection_keeps_gitops_fields_and_user_parts_and_converges(kube):
    from kubernetes.dynamic import DynamicClient

    p, types = prof(spec__nodes__nodeClass="inject-nc", spec__nodes__nodePool="inject-np")
    user_nc = {
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "inject-nc"},
        "spec": {"role": "UserRole", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                 "subnetSelectorTerms": [{"tags": {"team": "ml"}}], "securityGroupSelectorTerms": [{"tags": {"team": "ml"}}],
                 "tags": {"owner": "gitops"}, "userData": USER_MIME},
    }
    apply(kube.api_client(), [user_nc], field_manager="gitops")
    res = DynamicClient(kube.api_client()).resources.get(api_version="karpenter.k8s.aws/v1", kind="EC2NodeClass")
    current = res.get(name="inject-nc").to_dict()

    body = inject.desired_nodeclass_fields(p, current, types)
    assert set(body["spec"]) == {"instanceStorePolicy", "userData"}
    assert inject.differs(body, current) != []
    apply(kube.api_client(), [body], field_manager="nodewarm")
    after = res.get(name="inject-nc").to_dict()
    assert after["spec"]["instanceStorePolicy"] == "RAID0"
    assert after["spec"]["role"] == "UserRole" and after["spec"]["tags"] == {"owner": "gitops"}
    ud = after["spec"]["userData"]
    assert "echo user-part-one" in ud and ud.index("echo user-part-one") < ud.index("nodewarm")

    # Converged: the next reconcile computes the same body, sees no difference, and an apply is a no-op.
    again = inject.desired_nodeclass_fields(p, after, types)
    assert inject.differs(again, after) == []
    assert apply(kube.api_client(), [again], field_manager="nodewarm")[0].action == "unchanged"
