"""Karpenter's CRDs as nodewarm generates them (nodewarm/karpenter/crds.py, from the Go types the drift hash
walks): the API server accepts them and applies the defaults the hash assumes, every rendered example passes them,
they refuse what upstream's refuse for the fields nodewarm writes, and (with NODEWARM_CRDS_DIR) every constraint
they declare is upstream's own. `nodewarm render` checks its Karpenter objects against them without any upstream
file."""

from __future__ import annotations

import copy

import pytest
import yaml

from nodewarm.cli import main
from nodewarm.karpenter import apis, crds, drifthash as kh
from nodewarm.nodeclasses import crdvalidate
from nodewarm.nodeclasses import render as render_module
from support import crds as crdsupport
from support.paths import REPO

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def render_example(path, capsys) -> list[dict]:
    assert main(["render", "-f", str(path)]) == 0
    return [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]


def karpenter_objects(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["apiVersion"].startswith(("karpenter.sh/", "karpenter.k8s.aws/"))]


def own() -> dict:
    return crdvalidate.builtin()


# --- the rendered examples ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_rendered_example_passes_the_own_crds_and_upstreams_when_given(example, capsys):
    objects = karpenter_objects(render_example(example, capsys))
    assert {d["kind"] for d in objects} >= {"NodePool"}
    assert crdvalidate.validate(objects, own()) == {}
    assert crdvalidate.validate(objects, crdsupport.strict_crds()) == {}     # upstream's, with NODEWARM_CRDS_DIR


# --- what upstream refuses, the own CRDs refuse ---------------------------------------------------------------------

def _set(path: str, value):
    def change(doc):
        *parents, last = path.split(".")
        node = doc
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return change


NODEPOOL_MUTATIONS = {
    "taint effect typo": _set("spec.template.spec.taints", [{"key": "a", "effect": "NoSchedual"}]),
    "startup taint effect typo": _set("spec.template.spec.startupTaints.0.effect", "NoSchedual"),
    "startup taint without a key": _set("spec.template.spec.startupTaints.0", {"effect": "NoSchedule"}),
    "budget nodes not a count or percent": _set("spec.disruption.budgets", [{"nodes": "abc"}]),
    "budget reason that does not exist": _set("spec.disruption.budgets", [{"nodes": "1", "reasons": ["Expired"]}]),
    "budget duration out of order": _set("spec.disruption.budgets",
                                         [{"nodes": "0", "schedule": "@daily", "duration": "30m1h"}]),
    "budget schedule that is no cron": _set("spec.disruption.budgets",
                                            [{"nodes": "0", "schedule": "daily", "duration": "1h"}]),
    "consolidationPolicy typo": _set("spec.disruption.consolidationPolicy", "WhenIdle"),
    "requirement operator typo": _set("spec.template.spec.requirements.0.operator", "Within"),
    "weight 0": _set("spec.weight", 0),
    "weight 101": _set("spec.weight", 101),
    "expireAfter in days": _set("spec.template.spec.expireAfter", "30d"),
    "limits not a quantity": _set("spec.limits", {"cpu": "lots"}),
    "unknown field": _set("spec.template.spec.startupTaintz", []),
}
EC2NODECLASS_MUTATIONS = {
    "instanceStorePolicy RAID5": _set("spec.instanceStorePolicy", "RAID5"),
    "instanceStorePolicy misspelt": lambda d: d["spec"].update(instanceStorPolicy=d["spec"].pop("instanceStorePolicy")),
    "metadataOptions httpTokens typo": _set("spec.metadataOptions", {"httpTokens": "requried"}),
    "hop limit 0": _set("spec.metadataOptions", {"httpPutResponseHopLimit": 0}),
    "detailedMonitoring as a string": _set("spec.detailedMonitoring", "yes"),
    "no subnet selector": lambda d: d["spec"].pop("subnetSelectorTerms"),
    "volume size beyond EBS": _set("spec.blockDeviceMappings", [{"deviceName": "/dev/xvda",
                                                                 "ebs": {"volumeSize": "100Ti"}}]),
}


@pytest.fixture(scope="module")
def al2023_objects():
    from nodewarm import instancetypes, profile
    from nodewarm.nodeclasses.render import render

    p = profile.load(REPO / "examples" / "karpenter-al2023.yaml")
    types = instancetypes.lookup(list(p.nodes.instance_types))
    profile.check(p, types)
    docs = karpenter_objects(render(p, types).documents)
    return {d["kind"]: d for d in docs}


@pytest.mark.parametrize("kind, what", [("NodePool", k) for k in NODEPOOL_MUTATIONS]
                         + [("EC2NodeClass", k) for k in EC2NODECLASS_MUTATIONS])
def test_a_mutation_upstream_refuses_is_refused_by_the_own_crds(al2023_objects, kind, what):
    doc = copy.deepcopy(al2023_objects[kind])
    assert crdvalidate.validate([doc], own()) == {}
    (NODEPOOL_MUTATIONS if kind == "NodePool" else EC2NODECLASS_MUTATIONS)[what](doc)
    assert crdvalidate.validate([doc], own()), f"the own CRDs accept: {what}"
    # The table mirrors upstream: each row is refused by the release's own CRDs too, where they are given.
    assert crdvalidate.validate([doc], crdsupport.strict_crds()), f"the CRDs in force accept: {what}"


def test_the_table_is_refused_by_upstream_itself(al2023_objects):
    upstream = crdsupport.upstream_crds()
    for kind, table in (("NodePool", NODEPOOL_MUTATIONS), ("EC2NodeClass", EC2NODECLASS_MUTATIONS)):
        assert crdvalidate.validate([al2023_objects[kind]], upstream) == {}
        for what, mutate in table.items():
            doc = copy.deepcopy(al2023_objects[kind])
            mutate(doc)
            assert crdvalidate.validate([doc], upstream), f"upstream accepts: {what} (drop the row, or say why)"


# --- every constraint the own CRDs declare is upstream's ------------------------------------------------------------

CONSTRAINTS = ("type", "enum", "pattern", "default", "required", "format", "maxItems", "minItems", "minimum",
               "maximum", "maxLength", "minLength", "maxProperties", "x-kubernetes-int-or-string",
               "x-kubernetes-preserve-unknown-fields", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
               "x-kubernetes-map-type")


def differences(own_schema: dict, upstream: dict | None, path: str) -> list[str]:
    """Paths where the own schema declares a field upstream lacks, or a constraint upstream states otherwise."""
    if upstream is None:
        return [f"{path}: not in upstream's schema"]
    if upstream.get("x-kubernetes-preserve-unknown-fields") and not upstream.get("properties"):
        return []          # upstream keeps this open (main's kubelet): the own, typed one is the release's shape
    out = [f"{path}: {k} is {own_schema[k]!r}, upstream {upstream.get(k)!r}"
           for k in CONSTRAINTS if k in own_schema and own_schema[k] != upstream.get(k)]
    for name, sub in (own_schema.get("properties") or {}).items():
        out += differences(sub, (upstream.get("properties") or {}).get(name), f"{path}.{name}")
    if "items" in own_schema:
        out += differences(own_schema["items"], upstream.get("items"), f"{path}[]")
    if isinstance(own_schema.get("additionalProperties"), dict):
        out += differences(own_schema["additionalProperties"], upstream.get("additionalProperties"), f"{path}{{}}")
    return out


def _root(crd: dict) -> dict:
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("which", ["newest", "release"])
def test_every_constraint_the_own_crds_declare_is_upstreams(which):
    from nodewarm_dev.testenv import kube as kubeenv

    folder = crdsupport.upstream_dir() if which == "newest" else crdsupport.upstream_release_dir()
    upstream = {d["spec"]["names"]["kind"]: d for d in kubeenv.load_crd_files(kubeenv.upstream_crd_files(folder))}
    found = []
    for crd in crds.crds():
        kind = crd["spec"]["names"]["kind"]
        theirs = upstream[kind]
        assert (crd["metadata"]["name"], crd["spec"]["scope"], crd["spec"]["names"]) == \
            (theirs["metadata"]["name"], theirs["spec"]["scope"], theirs["spec"]["names"])
        found += differences(_root(crd), _root(theirs), kind)
    assert not found, "\n".join(found)


def test_the_comparison_finds_a_divergence():
    crd = crds.ec2nodeclass_crd()
    changed = copy.deepcopy(crd)
    _root(changed)["properties"]["spec"]["properties"]["instanceStorePolicy"]["enum"] = ["RAID0", "RAID5"]
    del _root(changed)["properties"]["spec"]["properties"]["role"]
    found = differences(_root(crd), _root(changed), "EC2NodeClass")
    assert sorted(found) == ["EC2NodeClass.spec.instanceStorePolicy: enum is ['RAID0'], upstream ['RAID0', 'RAID5']",
                             "EC2NodeClass.spec.role: not in upstream's schema"]


def test_the_crd_defaults_are_the_hash_models_defaults():
    """One home: the defaults the CRD gives the API server are the Field defaults the hash applies to absent
    fields, so an object the server defaulted and the same object as written hash alike."""
    spec = _root(crds.nodepool_crd())["properties"]["spec"]["properties"]["template"]["properties"]["spec"]
    assert spec["properties"]["expireAfter"]["default"] == "720h"
    nc = _root(crds.ec2nodeclass_crd())["properties"]["spec"]["properties"]["metadataOptions"]
    assert nc["default"] == apis.METADATA_OPTIONS_DEFAULT
    assert {k: v["default"] for k, v in nc["properties"].items()} == apis.METADATA_OPTIONS_DEFAULT


# --- on the real API server -----------------------------------------------------------------------------------------

@pytest.mark.kube
def test_the_api_server_applies_the_defaults_the_hash_assumes(kube):
    """The CRDs in force are installed by the kube fixture (nodewarm's own unless NODEWARM_CRDS_DIR is set): a
    NodePool and an EC2NodeClass written without the defaulted fields come back with them, and hash as written."""
    from kubernetes import client

    api = client.CustomObjectsApi(kube.api_client())
    pool = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "crd-defaults"},
            "spec": {"template": {"spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "crd-defaults"},
                "requirements": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["p5"]}],
                "startupTaints": [{"key": "nodewarm.io/warming", "effect": "NoSchedule"}]}}}}
    nodeclass = {"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "crd-defaults"},
                 "spec": {"role": "KarpenterNodeRole", "amiSelectorTerms": [{"alias": "al2023@v20251201"}],
                          "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "c"}}],
                          "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "c"}}],
                          "instanceStorePolicy": "RAID0"}}
    got_pool = api.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", pool)
    got_nc = api.create_cluster_custom_object("karpenter.k8s.aws", "v1", "ec2nodeclasses", nodeclass)
    try:
        assert got_pool["spec"]["template"]["spec"]["expireAfter"] == "720h"
        assert got_pool["spec"]["disruption"] == {"consolidateAfter": "0s", "budgets": [{"nodes": "10%"}],
                                                  "consolidationPolicy": "WhenEmptyOrUnderutilized"}
        assert got_nc["spec"]["metadataOptions"] == apis.METADATA_OPTIONS_DEFAULT
        assert kh.nodepool_hash(got_pool).value == kh.nodepool_hash(pool).value
        assert kh.ec2nodeclass_hash(got_nc, "ca").value == kh.ec2nodeclass_hash(nodeclass, "ca").value
        # The status subresource is there, and the server keeps what Karpenter writes in it.
        got_nc["status"] = {"amis": [{"id": "ami-0abc", "name": "al2023", "requirements": []}],
                            "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "ready",
                                            "lastTransitionTime": "2026-12-05T10:00:00Z"}]}
        st = api.replace_cluster_custom_object_status("karpenter.k8s.aws", "v1", "ec2nodeclasses", "crd-defaults",
                                                      got_nc)
        assert st["status"]["amis"][0]["id"] == "ami-0abc" and st["status"]["conditions"][0]["type"] == "Ready"
        # Unknown fields are pruned as upstream's schema prunes them (the server is v1.20: no strict field check).
        bad = copy.deepcopy(pool)
        bad["metadata"]["name"] = "crd-pruned"
        bad["spec"]["template"]["spec"]["startupTaintz"] = [{"key": "x", "effect": "NoSchedule"}]
        pruned = api.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", bad)
        api.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", "crd-pruned")
        assert "startupTaintz" not in pruned["spec"]["template"]["spec"]
        # And a value the schema refuses is refused by the server, naming the field.
        bad = copy.deepcopy(nodeclass)
        bad["metadata"]["name"] = "crd-refused"
        bad["spec"]["instanceStorePolicy"] = "RAID5"
        with pytest.raises(client.ApiException) as e:
            api.create_cluster_custom_object("karpenter.k8s.aws", "v1", "ec2nodeclasses", bad)
        assert e.value.status == 422 and "instanceStorePolicy" in e.value.body
    finally:
        api.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", "crd-defaults")
        api.delete_cluster_custom_object("karpenter.k8s.aws", "v1", "ec2nodeclasses", "crd-defaults")


# --- render checks its own output -----------------------------------------------------------------------------------

def test_render_refuses_a_karpenter_object_the_schema_refuses_naming_the_field(monkeypatch, capsys):
    real = render_module.render

    def render_raid5(*args, **kwargs):
        out = real(*args, **kwargs)
        for d in out.documents:
            if d["kind"] == "EC2NodeClass":
                d["spec"]["instanceStorePolicy"] = "RAID5"
        return out

    monkeypatch.setattr("nodewarm.render_cli.render", render_raid5)
    assert main(["render", "-f", str(REPO / "examples" / "karpenter-al2023.yaml")]) != 0
    err = capsys.readouterr().err
    assert "EC2NodeClass/" in err and ".spec.instanceStorePolicy" in err and "RAID5" in err
