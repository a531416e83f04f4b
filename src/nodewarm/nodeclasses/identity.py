"""How nodewarm's pods get AWS credentials (``spec.aws.identity``), rendered for each principal.

* ``podIdentity``: EKS Pod Identity. The association is an EKS API object, not a Kubernetes one, so it is
  rendered as the documented AWS CLI command (``aws eks create-pod-identity-association``), one per
  ServiceAccount; Auto Mode runs the Pod Identity Agent itself.
* ``irsa``: the ``eks.amazonaws.com/role-arn`` annotation on the ServiceAccount (the EKS pod identity webhook
  injects the web-identity token and role into the pod).
* ``node``: the instance role; only for the AL2023 host agent (profile.check_aws refuses it for pods).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from nodewarm.api.warmprofile import WarmProfile

IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"
AGENT_SERVICE_ACCOUNT = "nodewarm-bootstrap"


@dataclass(frozen=True)
class Principal:
    name: str                       # agent | publisher
    namespace: str
    service_account: str
    role_arn: str | None


def publisher_service_account(p: WarmProfile) -> str:
    # A model's view (nodewarm.api.models) publishes as its profile: one ServiceAccount, one role, one RBAC and
    # admission policy for all the profile's models, none minted per model.
    return f"{p.parent or p.name}-publisher"


def principals(p: WarmProfile) -> list[Principal]:
    """The pods' principals (the AL2023 host agent is the node itself, not a ServiceAccount)."""
    out = []
    if p.uses_daemonset:
        out.append(Principal("agent", p.bootstrap.namespace, AGENT_SERVICE_ACCOUNT, p.aws.agent_role_arn))
    if p.compile_cache.publisher:
        out.append(Principal("publisher", p.serving.namespace, publisher_service_account(p), p.aws.publisher_role_arn))
    return out


def service_account_annotations(p: WarmProfile, principal: str) -> dict[str, str]:
    if p.aws.identity != "irsa":
        return {}
    role = next(x.role_arn for x in principals(p) if x.name == principal)
    return {IRSA_ANNOTATION: role}


def pod_identity_commands(p: WarmProfile) -> list[str]:
    """One `aws eks create-pod-identity-association` per pod principal (empty unless identity is podIdentity)."""
    if p.aws.identity != "podIdentity":
        return []
    return [" ".join(["aws", "eks", "create-pod-identity-association", "--cluster-name", shlex.quote(p.aws.cluster_name),
                      "--namespace", shlex.quote(x.namespace), "--service-account", shlex.quote(x.service_account),
                      "--role-arn", shlex.quote(x.role_arn)]) for x in principals(p)]
