"""The node agent's own pod on the DaemonSet path (nodewarm.api.agentpod): the env the rendered DaemonSet hands it
names its pod exactly; without all of namespace, name and uid (AL2023's host unit) the agent has no pod of its own."""

from __future__ import annotations

import pytest

from nodewarm.api import agentpod
from nodewarm.api.agentpod import POD_NAME_ENV, POD_NAMESPACE_ENV, POD_UID_ENV, PodRef

ENV = {agentpod.NODE_NAME_ENV: "n1", POD_NAMESPACE_ENV: "nodewarm-system",
       POD_NAME_ENV: "nodewarm-bootstrap-gpu-p5-x7k2q", POD_UID_ENV: "0f6c1d2e-uid"}


def test_the_env_the_daemonset_hands_the_agent_names_its_own_pod():
    assert {name for name, _ in agentpod.DOWNWARD_ENV} >= {POD_NAMESPACE_ENV, POD_NAME_ENV, POD_UID_ENV}
    me = agentpod.own_pod(ENV)
    assert me == PodRef("nodewarm-system", "nodewarm-bootstrap-gpu-p5-x7k2q", "0f6c1d2e-uid")
    assert str(me) == "nodewarm-system/nodewarm-bootstrap-gpu-p5-x7k2q"
    assert agentpod.daemonset_name("gpu-p5") == "nodewarm-bootstrap-gpu-p5"


@pytest.mark.parametrize("missing", [POD_NAMESPACE_ENV, POD_NAME_ENV, POD_UID_ENV])
def test_without_any_of_namespace_name_and_uid_the_agent_has_no_pod(missing):
    assert agentpod.own_pod({k: val for k, val in ENV.items() if k != missing}) is None
    assert agentpod.own_pod({**ENV, missing: ""}) is None


def test_a_pod_made_again_under_the_same_name_is_another_pod():
    assert PodRef("ns", "a", "uid-1") != PodRef("ns", "a", "uid-2")
