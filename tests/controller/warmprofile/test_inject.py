"""The injector's bodies: only owned fields, the user's parts kept, and convergence after one apply."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from nodewarm import instancetypes, profile
from nodewarm.kubeapply import apply
from nodewarm.nodeclasses import inject
from support.builders import USER_MIME, v


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
def test_injection_keeps_user_parts_converges_and_never_forces_a_gitops_field(kube):
    from kubernetes.dynamic import DynamicClient

    from nodewarm.controller.kube import EC2NODECLASSES, Kube
    from nodewarm.controller.warmprofile.inject import conflict_managers

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
    # gitops owns userData: an unforced apply is refused, naming the manager, and changes nothing.
    with pytest.raises(ApiException) as e:
        Kube(kube.api_client()).apply(EC2NODECLASSES, body, force=False)
    assert e.value.status == 409 and conflict_managers(e.value)[0] == ["gitops"]
    assert res.get(name="inject-nc").to_dict()["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]

    # The user puts nodewarm's part into their own copy (what `nodewarm render` shows): their manager owns it all.
    user_nc["spec"].update(body["spec"])
    apply(kube.api_client(), [user_nc], field_manager="gitops")
    after = res.get(name="inject-nc").to_dict()
    assert after["spec"]["instanceStorePolicy"] == "RAID0"
    assert after["spec"]["role"] == "UserRole" and after["spec"]["tags"] == {"owner": "gitops"}
    ud = after["spec"]["userData"]
    assert "echo user-part-one" in ud and ud.index("echo user-part-one") < ud.index("nodewarm")

    # Converged: the next reconcile computes the same body and sees no difference, so it sends nothing.
    again = inject.desired_nodeclass_fields(p, after, types)
    assert inject.differs(again, after) == []
