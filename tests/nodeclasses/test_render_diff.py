"""`nodewarm render --diff` against the real API server: before anything is applied, which live NodeClaims the
rendered NodePool / EC2NodeClass would drift, and why. Every prediction is then checked by applying the objects
and asking the Karpenter stand-in (its drift controller's verdict), so the preview cannot be right by fiat."""

from __future__ import annotations

import pytest
import yaml

from support.controller_fixtures import uniq
from nodewarm import instancetypes, profile
from nodewarm.cli import main
from nodewarm.controller.kube import EC2NODECLASSES, NODECLAIMS, NODEPOOLS
from nodewarm.kubeapply import apply
from nodewarm import livediff
from nodewarm.nodeclasses.render import render
from nodewarm_dev.testenv.karpenter import KarpenterSim
from support.builders import v

pytestmark = pytest.mark.kube


def _diff_kubeconfig(kube, k, tmp_path):
    """A ServiceAccount that may do exactly what --diff does (livediff.RBAC_RULES), as a kubeconfig."""
    from support.rbac import apply_replacing

    ns = uniq("diff")
    sa = {"kind": "ServiceAccount", "name": "differ", "namespace": ns}
    apply_replacing(k, [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "differ", "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": f"{ns}-differ"},
         "rules": [dict(r) for r in livediff.RBAC_RULES]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{ns}-differ"}, "subjects": [sa],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{ns}-differ"}},
    ])
    return kube.write_kubeconfig(tmp_path / "kubeconfig-differ", kube.service_account_token(ns, "differ"), "differ")


def _node_docs(doc: dict) -> list[dict]:
    p = profile.from_dict(doc)
    docs = render(p, instancetypes.lookup(list(p.nodes.instance_types))).documents
    return [d for d in docs if d["kind"] in ("EC2NodeClass", "NodePool")]


# change -> the drift reason Karpenter gives the live NodeClaim once it is applied (None: no node replaced)
CHANGES = {
    "taint key (NodePool template: hashed)": (dict(spec__readiness__taintKey="example.com/warming"), "NodePoolDrifted"),
    "launcher artifact (EC2NodeClass userData: hashed)": (dict(spec__bootstrap__artifactSha256="b" * 64),
                                                          "NodeClassDrift"),
    "reserved only (a requirement the node no longer meets)": (dict(spec__nodes__capacityTypes=["reserved"]),
                                                               "RequirementsDrifted"),
    "disruption (outside the hash)": (dict(spec__nodes__disruption={"consolidateAfter": "1h"}), None),
    "model revision (read by the agent at boot)": (dict(spec__model__revision="r2"), None),
}


def test_render_diff_names_the_nodeclaims_an_apply_would_drift_and_karpenter_agrees(kube, admin, k, tmp_path, capsys):
    name = uniq("wpdiff")
    base = dict(metadata__name=name, spec__nodes__nodePool=f"{name}-pool", spec__nodes__nodeClass=f"{name}-class")
    pool = f"{name}-pool"
    f = tmp_path / "profile.yaml"
    kubeconfig = str(_diff_kubeconfig(kube, k, tmp_path))
    sim = KarpenterSim(admin)
    original = _node_docs(v(**base))
    apply(admin, original, field_manager="kubectl")           # what `render | kubectl apply --server-side` made
    try:
        f.write_text(yaml.safe_dump(v(**base)))
        assert main(["render", "-f", str(f), "--diff", "--kubeconfig", kubeconfig]) == 0
        out = capsys.readouterr().out
        assert f"NodePool/{pool}: 0 live NodeClaim(s)" in out and "applying would drift no NodeClaim" in out

        claim = sim.scale_up(pool).claim                       # launched from these objects: stamped with their hashes
        assert sim.drifted(claim) is None
        for change, (fields, reason) in CHANGES.items():
            f.write_text(yaml.safe_dump(v(**base, **fields)))
            rc = main(["render", "-f", str(f), "--diff", "--kubeconfig", kubeconfig])
            out = capsys.readouterr().out
            if reason:
                assert rc == livediff.WOULD_DRIFT_EXIT, (change, out)
                assert f"{claim}  {reason}  would drift" in out, (change, out)
                assert f"applying would drift 1 NodeClaim(s) of NodePool(s) {pool}" in out
                assert "each re-pulls 67 GB of weights" in out
            else:
                assert rc == 0 and "applying would drift no NodeClaim" in out, (change, out)
            # The check: apply it and let the stand-in's drift controller judge; then put the objects back.
            apply(admin, _node_docs(v(**base, **fields)), field_manager="kubectl")
            assert sim.drifted(claim) == reason, change
            apply(admin, original, field_manager="kubectl")
            assert sim.drifted(claim) is None, change
    finally:
        for c in k.list(NODECLAIMS)["items"]:
            if (c["metadata"].get("labels") or {}).get("karpenter.sh/nodepool") == pool:
                sim.delete_nodeclaim(c["metadata"]["name"])
                sim.finish_termination(c["metadata"]["name"])
        k.delete(NODEPOOLS, pool)
        k.delete(EC2NODECLASSES, f"{name}-class")


def test_render_diff_of_objects_not_in_the_cluster_drifts_nothing(kube, k, tmp_path, capsys):
    f = tmp_path / "profile.yaml"
    name = uniq("wpnew")
    f.write_text(yaml.safe_dump(v(metadata__name=name, spec__nodes__nodePool=f"{name}-pool",
                                  spec__nodes__nodeClass=f"{name}-class")))
    assert main(["render", "-f", str(f), "--diff", "--kubeconfig", str(_diff_kubeconfig(kube, k, tmp_path))]) == 0
    out = capsys.readouterr().out
    assert f"NodePool/{name}-pool: not in the cluster" in out and f"EC2NodeClass/{name}-class: not in the cluster" in out
