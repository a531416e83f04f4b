"""The ValidatingAdmissionPolicy that keeps one node's agent off every other Node, evaluated with a CEL
implementation from PyPI (cel-python) against admission requests in the shape the API server sends them.

The local API server is v1.20: it has no ValidatingAdmissionPolicy (GA in 1.30) and puts no node name into
ServiceAccount token user info (1.30+, KEP-4193), so the expressions cannot run there; the requests below are
built exactly as an AdmissionRequest carries them (``request.userInfo.extra`` maps to lists of strings).
"""

from __future__ import annotations

import copy

import celpy
import pytest

from nodewarm.userdata.daemonset import NAME, NODE_NAME_EXTRA, admission_policy
from support.builders import node

NS = "nodewarm-system"
AGENT = f"system:serviceaccount:{NS}:{NAME}"


def request(obj: dict, old: dict, user: str = AGENT, bound_node: str | None = "node-a", sub: str = "status") -> dict:
    extra = {"authentication.kubernetes.io/pod-name": ["nodewarm-bootstrap-gpu-x2k9p"],
             "authentication.kubernetes.io/pod-uid": ["6f1c3a52-9e0b-4c1e-b0a4-0f5e0c1d2e3f"]}
    if bound_node is not None:
        extra[NODE_NAME_EXTRA] = [bound_node]
        extra["authentication.kubernetes.io/node-uid"] = ["1b2c3d4e-0000-4000-8000-00000000000a"]
    return {"object": obj, "oldObject": old, "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"}, "subResource": sub,
        "name": obj["metadata"]["name"], "operation": "UPDATE",
        "userInfo": {"username": user, "uid": "sa-uid",
                     "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NS}", "system:authenticated"],
                     "extra": extra}}}


class Policy:
    """The rendered policy's matchConditions and validations, compiled once."""

    def __init__(self):
        policy = admission_policy(NS)[0]["spec"]
        self.spec = policy
        env = celpy.Environment()
        self.match = [env.program(env.compile(m["expression"])) for m in policy["matchConditions"]]
        self.checks = [(v["message"], env.program(env.compile(v["expression"]))) for v in policy["validations"]]

    def admit(self, req: dict) -> tuple[bool, list[str]]:
        """(allowed, messages of failed validations); a request the policy does not match is allowed."""
        act = celpy.json_to_cel(req)
        if not all(bool(m.evaluate(act)) for m in self.match):
            return True, []
        failed = [msg for msg, prog in self.checks if not bool(prog.evaluate(act))]
        return not failed, failed


@pytest.fixture(scope="module")
def policy():
    return Policy()


def warm(name: str, **extra_labels) -> dict:
    return node(name, labels={"nodewarm.io/generation": "4f2a9c1e0b7d3a65", **extra_labels},
                annotations={"nodewarm.io/compile-cache": "cold"})


def test_the_agent_may_write_its_own_node(policy):
    assert policy.admit(request(warm("node-a"), node("node-a"))) == (True, [])


def test_the_agent_may_not_mark_another_node(policy):
    ok, why = policy.admit(request(warm("node-b"), node("node-b"), bound_node="node-a"))
    assert not ok and any("only write the Node its pod runs on" in m for m in why)


def test_a_token_without_a_node_binding_is_refused(policy):
    ok, why = policy.admit(request(warm("node-a"), node("node-a"), bound_node=None))
    assert not ok and any("only write the Node" in m for m in why)


@pytest.mark.parametrize("change", [
    lambda o: o["metadata"]["labels"].update({"node-role.kubernetes.io/gpu": ""}),      # add a foreign label
    lambda o: o["metadata"]["labels"].update({"karpenter.sh/nodepool": "other"}),       # change one
    lambda o: o["metadata"]["labels"].pop("kubernetes.io/hostname"),                    # remove one
    lambda o: o["metadata"]["annotations"].update({"karpenter.sh/do-not-disrupt": "true"}),
])
def test_the_agent_may_touch_only_nodewarm_labels_and_annotations(policy, change):
    new = warm("node-a")
    change(new)
    ok, _ = policy.admit(request(new, node("node-a", annotations={})))
    assert not ok


def test_other_identities_are_not_this_policys_business(policy):
    """The kubelet, the controller and admins are governed by NodeRestriction and their RBAC, not by this."""
    for user in ("system:node:node-a", "system:serviceaccount:nodewarm:nodewarm-controller", "kubernetes-admin"):
        assert policy.admit(request(warm("node-b"), node("node-b"), user=user, bound_node=None)) == (True, [])


def test_the_policy_covers_both_the_node_and_its_status_and_denies(policy):
    rules = policy.spec["matchConstraints"]["resourceRules"]
    assert rules == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                      "resources": ["nodes", "nodes/status"]}]
    assert policy.spec["failurePolicy"] == "Fail"
    binding = admission_policy(NS)[1]
    assert binding["spec"] == {"policyName": f"{NAME}-own-node", "validationActions": ["Deny"]}


def test_the_expressions_have_teeth_on_unset_maps(policy):
    """Nodes with no annotations at all (a fresh node) must not make the expressions error or pass blindly."""
    old = node("node-a")
    old["metadata"].pop("annotations", None)
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"nodewarm.io/compile-cache": "cold"}
    assert policy.admit(request(new, old)) == (True, [])
    new["metadata"]["annotations"]["foreign.example/x"] = "y"
    assert policy.admit(request(new, old))[0] is False


# --- the compile-cache publisher: its own Node, the two compile-cache annotations, nothing else -------------

def _publisher_policy():
    from nodewarm import profile
    from nodewarm.nodeclasses.vllm import publisher_admission_policy
    from support.builders import v

    p = profile.from_dict(v(spec__compileCache__verifyKey="A" * 43 + "=",
                            spec__compileCache__publisher={"image": "i", "signingKeySecret": "k"}))
    pol = Policy.__new__(Policy)
    spec = publisher_admission_policy(p)[0]["spec"]
    env = celpy.Environment()
    pol.spec = spec
    pol.match = [env.program(env.compile(m["expression"])) for m in spec["matchConditions"]]
    pol.checks = [(x["message"], env.program(env.compile(x["expression"]))) for x in spec["validations"]]
    return pol, f"system:serviceaccount:{p.serving.namespace}:{p.name}-publisher"


def test_the_publisher_may_only_record_the_compile_cache_outcome_on_its_own_node():
    pol, user = _publisher_policy()
    old = warm("node-a")
    old["status"] = {"conditions": [{"type": "nodewarm.io/Warm", "status": "True"}]}
    hit = copy.deepcopy(old)
    hit["metadata"]["annotations"].update({"nodewarm.io/compile-cache": "hit",
                                           "nodewarm.io/compile-cache-reason": "CompileCacheHit"})
    assert pol.admit(request(hit, old, user=user)) == (True, [])
    assert not pol.admit(request(hit, old, user=user, bound_node="node-b"))[0]        # another node's
    relabel = copy.deepcopy(hit)
    relabel["metadata"]["labels"]["nodewarm.io/generation"] = "0000000000000000"
    assert not pol.admit(request(relabel, old, user=user))[0]
    unwarm = copy.deepcopy(hit)
    unwarm["status"]["conditions"][0]["status"] = "False"
    assert not pol.admit(request(unwarm, old, user=user))[0]
    other = copy.deepcopy(hit)
    other["metadata"]["annotations"]["nodewarm.io/timeline"] = "{}"
    assert not pol.admit(request(other, old, user=user))[0]
    assert pol.admit(request(unwarm, old, user=AGENT)) == (True, [])    # not its business: the agent's policy
