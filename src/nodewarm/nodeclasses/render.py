"""Everything `nodewarm render` prints for one WarmProfile, as a list of Kubernetes documents.

Pure: given the profile, the instance facts and (optionally) the EC2NodeClass's current user data, it
returns the objects; the CLI does the I/O. The same functions feed the controller's injector, so what
`render` shows is exactly what the controller converges to.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from nodewarm.api import models
from nodewarm.api.errors import ProfileError
from nodewarm.api.names import CONTROLLER_NAMESPACE
from nodewarm.api.warmprofile import WarmProfile
from nodewarm.instancetypes import InstanceType
from nodewarm.userdata import daemonset

from . import (agentaccess, automode, ec2nodeclass, enginecheck, iam, identity, nodepool, peeraccess, prepull, snapshot,
               vllm)
from .launch import bootstrap_launch


@dataclass(frozen=True)
class Rendered:
    documents: list[dict]          # in apply order
    iam_policies: dict[str, dict]  # principal (agent | publisher) -> policy
    pod_identity_commands: list[str]
    user_data_budget_left: int | None


def node_user_data(p: WarmProfile, existing: str | None) -> tuple[str, int]:
    """The EC2NodeClass userData: the user's own parts (kept, in order) plus nodewarm's part, once."""
    from nodewarm.userdata import al2023, merge

    result = merge.merge(existing if existing is not None else p.nodes.user_data, al2023.render_part(bootstrap_launch(p)))
    return result.user_data, result.budget_left


def bootstrap_image(p: WarmProfile) -> str:
    if not p.bootstrap.image:
        raise ProfileError("spec.bootstrap.image", None, "Auto Mode and Bottlerocket run the bootstrap as a DaemonSet: "
                                                         "set an image that has nodewarm and python3 on PATH")
    return p.bootstrap.image


def render(p: WarmProfile, types: dict[str, InstanceType],
           controller_namespace: str = CONTROLLER_NAMESPACE) -> Rendered:
    """``controller_namespace``: where the controller runs, for the engine check's RoleBinding (only with
    spec.readiness.engineCheck)."""
    docs: list[dict] = [warmprofile_document(p)]
    budget = None
    if p.nodes.mode == "karpenter":
        if p.uses_daemonset:
            user_data = p.nodes.user_data or ""
        else:
            user_data, budget = node_user_data(p, None)
        docs.append(ec2nodeclass.render(p, user_data))
    else:
        docs.append(automode.render(p, types))
    docs.append(nodepool.render(p, types))
    if p.uses_daemonset:
        docs += daemonset.manifests(bootstrap_launch(p), nodepool=p.nodes.node_pool, image=bootstrap_image(p),
                                    readiness_taint_key=p.readiness.taint_key, namespace=p.bootstrap.namespace,
                                    service_account_annotations=identity.service_account_annotations(p, "agent"))
    else:
        # The host agent needs no namespace, but the image pre-pull pod does. The same Namespace document as the
        # DaemonSet launchers': profiles of both kinds may share it, and each apply would otherwise flip its labels.
        docs += agentaccess.node_rbac() + [daemonset.namespace_doc(p.bootstrap.namespace)]
        docs += peeraccess.manifests(p, controller_namespace)   # nothing unless peers are on
    docs.append(prepull.daemonset(p))
    if p.compile_cache.publisher:
        docs.append(vllm.publisher_service_account(p))
        docs += vllm.publisher_node_status_rbac(p) + vllm.publisher_admission_policy(p)
    docs.append(vllm.start_script_configmap(p))   # the vLLM container's start script, before its Deployment
    if p.serving.snapshot:
        # Before the Deployment (and the check pod) that name it: the API server refuses a pod whose RuntimeClass
        # does not exist. Nothing at all when off, so a profile without snapshots renders what it always did.
        docs.append(snapshot.runtime_class())
    docs += [vllm.deployment(p, types), vllm.service(p), vllm.pod_disruption_budget(p)]
    for view in models.views(p)[1:]:    # spec.models: each served as the first model is, from its view
        docs += [vllm.deployment(view, types), vllm.service(view), vllm.pod_disruption_budget(view)]
    # Last, and nothing at all unless enabled: a profile without the check renders what it always did.
    docs += enginecheck.manifests(p, types, controller_namespace)
    return Rendered(docs, iam.policies(p), identity.pod_identity_commands(p), budget)


# Fields of the user's profile that stay out of the cluster's WarmProfile. userData may carry secrets (bootstrap
# tokens, registry passwords) and a WarmProfile is cluster-scoped and readable by every node agent; nothing in
# the cluster needs it: the controller merges nodewarm's part into the live EC2NodeClass's own userData.
LOCAL_ONLY_FIELDS = (("nodes", "userData"),)


def warmprofile_document(p: WarmProfile) -> dict:
    """The profile itself, so the controller in the cluster watches the same settings `render` used (less the
    LOCAL_ONLY_FIELDS, which only shape the documents rendered here)."""
    doc = copy.deepcopy({k: v for k, v in p.raw.items() if k in ("apiVersion", "kind", "spec")})
    for section, name in LOCAL_ONLY_FIELDS:
        doc.get("spec", {}).get(section, {}).pop(name, None)
    doc["metadata"] = {"name": p.name}
    return doc
