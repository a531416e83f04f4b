"""The DaemonSet path end to end (Auto Mode, and Bottlerocket under Karpenter), as a real node runs it: the
rendered Namespace, identity, RBAC and DaemonSet applied to the real API server; the pod's exact command,
args and env (the downward API filled in from the agent's own pod, as the kubelet would) run with a token minted for the
DaemonSet's ServiceAccount, against the local S3 server, with the hostPath mount at its real path in a
private mount namespace. The node reports Warm with that identity and the controller lifts the taint."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support.bootstrap_fixtures import kubelet_env, model_files, put_model
from support.controller_fixtures import running, taint_keys, uniq, wait_for
from nodewarm import instancetypes, profile
from nodewarm.api import generation, prepullpod
from nodewarm.api.names import GENERATION_LABEL
from nodewarm.controller.kube import NODES
from nodewarm.kubeapply import apply
from nodewarm.nodeclasses.render import render
from nodewarm_dev.testenv.karpenter import KarpenterSim
from support.builders import v

pytestmark = [pytest.mark.kube, pytest.mark.s3]
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def model_uri(s3) -> str:
    """The model both variants warm, uploaded once (they only read it)."""
    return put_model(s3, model_files(shards=2, mib_per_shard=1, seed=7))


@pytest.mark.parametrize("variant", ["automode", "bottlerocket"])
def test_the_rendered_daemonset_warms_its_node_with_its_own_identity(kube, k, admin, aws_env, model_uri, tmp_path,
                                                                     variant):
    name = uniq(f"ds{variant[:2]}")
    mode = "automode" if variant == "automode" else "karpenter"
    doc = v(mode, metadata__name=name, spec__nodes__nodePool=f"{name}-pool", spec__nodes__nodeClass=f"{name}-class",
            spec__model__uri=model_uri, spec__model__sizeGB=0.01, spec__nodes__region=None,
            spec__bootstrap__namespace=f"{name}-system", spec__bootstrap__allowNonNvme=True,
            **({"spec__nodes__amiAlias": "bottlerocket@latest"} if variant == "bottlerocket" else {}))
    p = profile.from_dict(doc)
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    docs = render(p, types).documents
    ds, = (d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"].startswith("nodewarm-bootstrap-"))
    assert ds["metadata"]["namespace"] == f"{name}-system"
    # Everything as rendered, except the admission policy (v1.20 has none; test_admission_policy covers it) and
    # the PodDisruptionBudget (policy/v1 is served from 1.21; tests/nodeclasses/test_vllm_pod.py checks its fields).
    apply(admin, [d for d in docs if not d["kind"].startswith("ValidatingAdmissionPolicy")
                  and d["kind"] != "PodDisruptionBudget"])

    sim = KarpenterSim(admin)
    node = sim.scale_up(p.nodes.node_pool).node
    # The DaemonSet controller and the kubelet: the serving image's pre-pull pod on the node, pulled.
    sim.run_daemonset_pod(node, p.bootstrap.namespace, prepullpod.daemonset_name(p.name))
    # The cloud provider labels the node's region; the agent has no other way to learn it on Auto Mode.
    k.merge_patch(NODES, node, {"metadata": {"labels": {"topology.kubernetes.io/region": "us-west-2"}}})
    assert p.readiness.taint_key in taint_keys(k, node)

    # The agent's own pod, from the stored template: its env (the downward API's node and pod) is resolved from it.
    agent_pod = sim.run_daemonset_pod(node, ds["metadata"]["namespace"], ds["metadata"]["name"])
    container = agent_pod["spec"]["containers"][0]
    token = kube.service_account_token(ds["metadata"]["namespace"], ds["spec"]["template"]["spec"]["serviceAccountName"])
    kcfg = kube.write_kubeconfig(tmp_path / "pod-kubeconfig", token, "pod")     # stands in for the token mount
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    mount = container["volumeMounts"][0]["mountPath"]
    env = {**{key: val for key, val in aws_env.env().items() if key not in ("AWS_REGION", "AWS_DEFAULT_REGION")},
           **kubelet_env(container, agent_pod), "KUBECONFIG": str(kcfg), "PATH": f"{VENV_BIN}:/usr/bin:/bin",
           "HOME": str(tmp_path)}
    # The hostPath at its real path, in a private mount namespace: nothing on this machine's /mnt changes.
    script = ('mount -t tmpfs none /mnt && mkdir -p "$MNT" && mount --bind "$NVME" "$MNT" && shift 2 && exec "$@"')
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", "x", "x",
            *container["command"], *container["args"]]
    env.update(MNT=mount, NVME=str(nvme))
    assert shutil.which("unshare"), "util-linux unshare is installed by scripts/setup.sh"
    agent = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with running(admin):
            wait_for(lambda: p.readiness.taint_key not in taint_keys(k, node), 120,
                     what=f"the controller to lift the taint (agent running: {agent.poll() is None})")
        got = k.get(NODES, node)
        cond = next(c for c in got["status"]["conditions"] if c["type"] == "nodewarm.io/Warm")
        assert (cond["status"], cond["reason"]) == ("True", "WeightsVerified"), cond
        assert got["metadata"]["labels"][GENERATION_LABEL] == generation.generation(p)
        # Read with the DaemonSet's ServiceAccount and the Role render gives it, nothing more.
        assert got["metadata"]["annotations"]["nodewarm.io/image-prepull"] == "pulled ImagePulled"
        assert list((nvme / "nodewarm" / "models" / name / generation.model_key(p)).glob("*.safetensors"))
        assert agent.poll() is None, "the agent keeps running to follow its profile"
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            out, _ = agent.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            agent.kill()
            out, _ = agent.communicate()
    assert agent.returncode == 0, out[-3000:]
