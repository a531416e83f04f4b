"""Karpenter's own drift hashes (nodewarm/karpenter/drifthash.py) against the values upstream pins in its tests.

The EC2NodeClass table is aws/karpenter-provider-aws ``pkg/apis/v1/ec2nodeclass_hash_test.go``: at tag v1.14.1
(commit bde00654cd316fddb3dccfba3f5ac07039865429, hash version v5) and on main (commit
1d927085dd81a9df9301e613f371dac5b4d16bfe, v6). Each row is the Go object that test builds, written as the YAML a
user would write, and the decimal string ``nodeClass.Hash(testCABundle)`` must equal there. Upstream builds a row
with ``mergo.Merge(base, change, WithOverride, WithSliceDeepCopy)``: maps gain the change's keys, a list's
elements merge position by position, anything else is replaced; ``upstream_merge`` below does the same to the
YAML. Upstream has no static NodePool values (kubernetes-sigs/karpenter ``pkg/controllers/nodepool/hash/
suite_test.go`` compares ``nodePool.Hash()`` with itself); the NodePool rows assert the same walk's Go semantics
on the template: zero values, sets, durations.
"""

from __future__ import annotations

import base64
import copy

import pytest

from nodewarm.karpenter import apis, drifthash as kh, gotypes, hashstructure

CA = "test-ca-bundle"           # testCABundle in the upstream test

BASE = {"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"}, "spec": {
    "role": "role-1",
    "tags": {"keyTag-1": "valueTag-1", "keyTag-2": "valueTag-2"},
    "context": "fake-context",
    "detailedMonitoring": False,
    "associatePublicIPAddress": False,
    "metadataOptions": {"httpEndpoint": "disabled", "httpProtocolIPv6": "disabled", "httpPutResponseHopLimit": 1,
                        "httpTokens": "optional"},
    "blockDeviceMappings": [
        {"deviceName": "map-device-1", "rootVolume": False,
         "ebs": {"deleteOnTermination": False, "encrypted": False, "iops": 0, "kmsKeyID": "fakeKMSKeyID",
                 "snapshotID": "fakeSnapshot", "throughput": 0, "volumeSize": "2G", "volumeType": "standard"}},
        {"deviceName": "map-device-2"},
    ],
    "userData": "userdata-test-1",
}}

V5_BASE, V6_BASE = "2608468723537941485", "11148166120438674859"

# (row, spec change, v5 value at v1.14.1, v6 value on main)
EC2NODECLASS_ROWS = [
    ("Base EC2NodeClass", {}, V5_BASE, V6_BASE),
    ("UserData", {"userData": "userdata-test-2"}, "2153344579995979450", "11774429238106843388"),
    ("Tags", {"tags": {"keyTag-test-3": "valueTag-test-3"}}, "4608386791045313156", "9327338697296909506"),
    ("Context", {"context": "context-2"}, "11612053647989098410", "2279761750428738028"),
    ("DetailedMonitoring", {"detailedMonitoring": True}, "11845605438531206428", "1936848126751988570"),
    ("InstanceStorePolicy", {"instanceStorePolicy": "RAID0"}, "6430637013089544585", "16697988646989909967"),
    ("AssociatePublicIPAddress", {"associatePublicIPAddress": True}, "6811176403923819181", "16141801171825097963"),
    ("MetadataOptions HTTPEndpoint", {"metadataOptions": {"httpEndpoint": "enabled"}},
     "8158886403801636337", "14969742554812447671"),
    ("MetadataOptions HTTPProtocolIPv6", {"metadataOptions": {"httpProtocolIPv6": "enabled"}},
     "12355196004817691031", "1581716956216772561"),
    ("MetadataOptions HTTPPutResponseHopLimit", {"metadataOptions": {"httpPutResponseHopLimit": 10}},
     "8968306366664488826", "14046948658064232764"),
    ("MetadataOptions HTTPTokens", {"metadataOptions": {"httpTokens": "required"}},
     "12408995450371615650", "1346719102507290084"),
    ("BlockDeviceMapping DeviceName", {"blockDeviceMappings": [{"deviceName": "map-device-test-3"}]},
     "13986335469721503441", "8979166653850509463"),
    ("BlockDeviceMapping RootVolume", {"blockDeviceMappings": [{"rootVolume": True}]},
     "14242690863945643402", "8875796205856543692"),
    ("BlockDeviceMapping DeleteOnTermination", {"blockDeviceMappings": [{"ebs": {"deleteOnTermination": True}}]},
     "12316454167870753581", "1470935115846151531"),
    ("BlockDeviceMapping Encrypted", {"blockDeviceMappings": [{"ebs": {"encrypted": True}}]},
     "17753517657333560591", "5252376125396833097"),
    ("BlockDeviceMapping IOPS", {"blockDeviceMappings": [{"ebs": {"iops": 10}}]},
     "2249322442135400321", "11651419893470054855"),
    ("BlockDeviceMapping KMSKeyID", {"blockDeviceMappings": [{"ebs": {"kmsKeyID": "test"}}]},
     "12259594419287406661", "1488385067008138755"),
    ("BlockDeviceMapping SnapshotID", {"blockDeviceMappings": [{"ebs": {"snapshotID": "test"}}]},
     "1149563513090550380", "12786013539168652330"),
    ("BlockDeviceMapping Throughput", {"blockDeviceMappings": [{"ebs": {"throughput": 10}}]},
     "12068199760789564545", "1873429003468556999"),
    ("BlockDeviceMapping VolumeType", {"blockDeviceMappings": [{"ebs": {"volumeType": "io1"}}]},
     "16361719363399715944", "6743466905516550702"),
    ("ConnectionTracking TCPEstablishedTimeout", {"connectionTracking": {"tcpEstablishedTimeout": 300}},
     "12177489405137904098", "1619669030802245540"),
    ("ConnectionTracking UDPStreamTimeout", {"connectionTracking": {"udpStreamTimeout": 120}},
     "17567831983996427", "13743705849402595405"),
    ("ConnectionTracking UDPTimeout", {"connectionTracking": {"udpTimeout": 45}},
     "5078825826133662844", "17941926745862994490"),
    ("CPUOptions NestedVirtualization", {"cpuOptions": {"nestedVirtualization": "enabled"}},
     "17001101224536964682", "6157846767212910604"),
    # Behaviour / dynamic fields (hash:"ignore"): the base value. With WithSliceDeepCopy a list merged into an
    # absent one stays absent upstream; the rows below set them for real, which must not matter either.
    ("Modified AMISelector", {"amiSelectorTerms": [{"tags": {"": "ami-test-value"}}]}, V5_BASE, V6_BASE),
    ("Modified SubnetSelector", {"subnetSelectorTerms": [{"tags": {"subnet-test-key": "subnet-test-value"}}]},
     V5_BASE, V6_BASE),
    ("Modified SecurityGroupSelector",
     {"securityGroupSelectorTerms": [{"tags": {"security-group-test-key": "security-group-test-value"}}]},
     V5_BASE, V6_BASE),
    ("CapacityReservationSelector", {"capacityReservationSelectorTerms": [{"tags": {"cr-test-key": "v"}}]},
     V5_BASE, V6_BASE),
]


def upstream_merge(base, change):
    """mergo.Merge(dst, src, WithOverride, WithSliceDeepCopy) on the YAML form (see the module docstring)."""
    if isinstance(base, dict) and isinstance(change, dict):
        out = dict(base)
        for k, v in change.items():
            out[k] = upstream_merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(change, list):
        return [upstream_merge(b, change[i]) if i < len(change) else b for i, b in enumerate(base)]
    return copy.deepcopy(change)


def nodeclass(**spec_change) -> dict:
    out = copy.deepcopy(BASE)
    out["spec"] = upstream_merge(out["spec"], spec_change)
    return out


@pytest.mark.parametrize("version", ["v5", "v6"])
@pytest.mark.parametrize("row,change,v5,v6", EC2NODECLASS_ROWS, ids=[r[0] for r in EC2NODECLASS_ROWS])
def test_ec2nodeclass_hash_matches_upstreams_static_table(row, change, v5, v6, version):
    got = kh.ec2nodeclass_hash(nodeclass(**change), CA, version)
    assert (got.value, got.version) == ({"v5": v5, "v6": v6}[version], version)
    assert got.hash_annotation == "karpenter.k8s.aws/ec2nodeclass-hash"
    assert got.version_annotation == "karpenter.k8s.aws/ec2nodeclass-hash-version"


@pytest.mark.parametrize("version,value", [("v5", "3564293065344858862"), ("v6", "10372902467896351912")])
def test_volume_size_hashes_as_its_quantity_string(version, value):
    nc = nodeclass()
    nc["spec"]["blockDeviceMappings"][0]["ebs"]["volumeSize"] = "10G"        # resource.NewScaledQuantity(10, Giga)
    assert kh.ec2nodeclass_hash(nc, CA, version).value == value
    # Quantity.String() is canonical: spellings of the same amount hash alike.
    for same in ("10000M", "10000000000", "0.01T"):
        nc["spec"]["blockDeviceMappings"][0]["ebs"]["volumeSize"] = same
        assert kh.ec2nodeclass_hash(nc, CA, version).value == value, same
    # ... but the exponent form keeps its format (String() is "10e9"), so it is a different hash.
    assert apis.quantity_string("1e10") == "10e9"
    nc["spec"]["blockDeviceMappings"][0]["ebs"]["volumeSize"] = "1e10"
    assert kh.ec2nodeclass_hash(nc, CA, version).value != value


@pytest.mark.parametrize("text,canonical", [("2G", "2G"), ("100Gi", "100Gi"), ("1024Mi", "1Gi"), ("1536", "1536"),
                                            ("1.5Ki", "1536"), ("0.5Gi", "512Mi"), ("1.5", "1500m"), ("0", "0"),
                                            ("0Gi", "0"), ("12e6", "12e6"), ("100", "100"), (200, "200")])
def test_quantity_string_is_apimachinerys_canonical_form(text, canonical):
    assert apis.quantity_string(text) == canonical


@pytest.mark.parametrize("version,value", [("v5", "3585768058063247698"), ("v6", "10323991363677716244")])
def test_instance_profile_instead_of_role(version, value):
    nc = nodeclass()
    del nc["spec"]["role"]
    nc["spec"]["instanceProfile"] = "test-instance-profile"
    assert kh.ec2nodeclass_hash(nc, CA, version).value == value


@pytest.mark.parametrize("version", ["v5", "v6"])
def test_reordered_tags_and_block_device_mappings_hash_alike(version):
    nc = nodeclass()
    nc["spec"]["tags"] = {"keyTag-2": "valueTag-2", "keyTag-1": "valueTag-1"}
    nc["spec"]["blockDeviceMappings"].reverse()
    assert kh.ec2nodeclass_hash(nc, CA, version).value == {"v5": V5_BASE, "v6": V6_BASE}[version]


# --- the edges where Go's zero value decides ---------------------------------------------------------------------

def _nc_hash(spec: dict, version="v5", ca=CA) -> str:
    return kh.ec2nodeclass_hash({"kind": "EC2NodeClass", "metadata": {"name": "n"}, "spec": spec}, ca, version).value


MINIMAL = {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}]}


@pytest.mark.parametrize("version", ["v5", "v6"])
@pytest.mark.parametrize("field,value", [
    ("detailedMonitoring", False), ("associatePublicIPAddress", False), ("userData", ""), ("tags", {}),
    ("blockDeviceMappings", []), ("instanceProfile", ""), ("context", ""),
])
def test_a_pointer_to_zero_or_an_empty_collection_is_not_absent(field, value, version):
    """A nil pointer, slice or map is skipped (IgnoreZeroValue); a pointer to false/"" or an empty list/map is not:
    writing the Go default explicitly drifts every node of the class."""
    assert _nc_hash({**MINIMAL, field: value}, version) != _nc_hash(MINIMAL, version)


def test_v5_hashes_the_typed_kubelet_and_v6_its_json_string():
    # v5: *KubeletConfiguration; an empty object is a non-nil pointer to a zero struct: not absent.
    assert _nc_hash({**MINIMAL, "kubelet": {}}, "v5") != _nc_hash(MINIMAL, "v5")
    # v6: the field is hash:"ignore" and String() of an empty map is "null": absent and {} agree.
    assert _nc_hash({**MINIMAL, "kubelet": {}}, "v6") == _nc_hash(MINIMAL, "v6")
    a = _nc_hash({**MINIMAL, "kubelet": {"maxPods": 110}}, "v6")
    assert a != _nc_hash({**MINIMAL, "kubelet": {"maxPods": 220}}, "v6")
    # Upstream's "byte-permutations must not collide" case.
    assert _nc_hash({**MINIMAL, "kubelet": {"maxPods": 12}}, "v6") != _nc_hash({**MINIMAL, "kubelet": {"maxPods": 21}}, "v6")
    # Durations inside the v5 struct hash as nanoseconds.
    g = lambda d: _nc_hash({**MINIMAL, "kubelet": {"evictionSoft": {"memory.available": "5%"},  # noqa: E731
                                                   "evictionSoftGracePeriod": {"memory.available": d}}}, "v5")
    assert g("1m30s") == g("90s") != g("2m")


def test_kubelet_string_is_gos_json():
    assert apis.kubelet_string(None) == apis.kubelet_string({}) == "null"
    assert apis.kubelet_string({"maxPods": 110, "clusterDNS": ["10.0.0.10"], "a": {"z": 1, "b": 0.5}}) == \
        '{"a":{"b":0.5,"z":1},"clusterDNS":["10.0.0.10"],"maxPods":110}'
    assert apis.kubelet_string({"x": "<&>", "y": 1e21, "z": 1e-7, "w": 1.0}) == \
        '{"w":1,"x":"\\u003c\\u0026\\u003e","y":1e+21,"z":1e-7}'


def test_the_ca_bundle_and_the_ami_family_are_part_of_the_hash():
    assert _nc_hash(MINIMAL, ca="a") != _nc_hash(MINIMAL, ca="b")
    pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    assert kh.encode_ca_bundle(pem) == base64.b64encode(pem).decode()
    assert kh.encode_ca_bundle(base64.b64encode(pem) + b"\n") == base64.b64encode(pem).decode()
    # AMIFamily() is hashed as resolved: spelling out the alias's family changes nothing ...
    assert _nc_hash({**MINIMAL, "amiFamily": "AL2023"}) == _nc_hash(MINIMAL)
    # ... changing the family does; a new alias version of the same family does not (that is AMIDrift's job).
    assert _nc_hash({**MINIMAL, "amiSelectorTerms": [{"alias": "bottlerocket@latest"}]}) != _nc_hash(MINIMAL)
    assert _nc_hash({**MINIMAL, "amiSelectorTerms": [{"alias": "al2023@v20260801"}]}) == _nc_hash(MINIMAL)


def test_crd_defaults_are_applied_as_the_api_server_does():
    """metadataOptions is defaulted by the CRD: absent, or written with its defaults, is the same object."""
    explicit = {**MINIMAL, "metadataOptions": dict(apis.METADATA_OPTIONS_DEFAULT)}
    assert _nc_hash(explicit) == _nc_hash(MINIMAL) == _nc_hash({**MINIMAL, "metadataOptions": {"httpTokens": "required"}})
    assert _nc_hash({**MINIMAL, "metadataOptions": {"httpTokens": "optional"}}) != _nc_hash(MINIMAL)


def test_crd_defaults_in_the_model_match_the_upstream_crds():
    import yaml

    from support.crds import upstream_dir

    upstream_crd_dir = upstream_dir()

    def schema(file, *path):
        doc = yaml.safe_load((upstream_crd_dir / file).read_text())
        s = next(v for v in doc["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]
        for p in path:
            s = s["properties"][p]
        return s

    md = schema("karpenter.k8s.aws_ec2nodeclasses.yaml", "spec", "metadataOptions")
    assert md["default"] == apis.METADATA_OPTIONS_DEFAULT
    assert {k: v.get("default") for k, v in md["properties"].items()} == apis.METADATA_OPTIONS_DEFAULT
    tmpl = schema("karpenter.sh_nodepools.yaml", "spec", "template", "spec")
    assert tmpl["properties"]["expireAfter"]["default"] == "720h"
    assert {f.json: f.default for f in apis.NODECLAIM_TEMPLATE.fields[1].type.fields if f.default} == {"expireAfter": "720h"}


# --- NodePool -----------------------------------------------------------------------------------------------------

def pool(**tspec) -> dict:
    spec = {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge"]}]}
    spec.update(tspec)
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "gpu"},
            "spec": {"template": {"metadata": {"labels": {"team": "ml"}}, "spec": spec}}}


O = {"key": "nodewarm.io/warming", "effect": "NoSchedule"}
W = {"key": "example.com/w", "effect": "NoSchedule"}


def _np(p: dict) -> str:
    return kh.nodepool_hash(p).value


def test_nodepool_hash_is_stamped_as_karpenter_names_it():
    got = kh.nodepool_hash(pool())
    assert (got.kind, got.name, got.version) == ("NodePool", "gpu", "v3")
    assert (got.hash_annotation, got.version_annotation) == ("karpenter.sh/nodepool-hash", "karpenter.sh/nodepool-hash-version")
    assert int(got.value) < 2**64 and got.value == str(int(got.value))


def test_startup_taints_absent_and_empty_differ():
    """Removing the last startup taint (``[]``) is not the same object as never having had the field."""
    assert _np(pool(startupTaints=[])) != _np(pool())
    assert _np(pool(startupTaints=[O])) != _np(pool(startupTaints=[]))


def test_taints_are_sets_and_a_duplicated_pair_cancels():
    assert _np(pool(startupTaints=[O, W])) == _np(pool(startupTaints=[W, O]))
    assert _np(pool(startupTaints=[O, W, W])) == _np(pool(startupTaints=[O]))       # XOR: W ^ W = 0
    assert _np(pool(taints=[O])) != _np(pool(startupTaints=[O]))


def test_durations_hash_as_nanoseconds_and_expire_after_defaults_to_720h():
    assert _np(pool(expireAfter="720h")) == _np(pool(expireAfter="43200m")) == _np(pool())
    assert _np(pool(expireAfter="Never")) != _np(pool())
    assert _np(pool(terminationGracePeriod="1h")) == _np(pool(terminationGracePeriod="60m"))
    assert _np(pool(terminationGracePeriod="1h")) != _np(pool())


def test_requirements_are_not_hashed_but_labels_and_annotations_are():
    p = pool()
    p["spec"]["template"]["spec"]["requirements"].append({"key": "k", "operator": "Gte", "values": ["3"]})
    assert _np(p) == _np(pool())
    p = pool()
    p["spec"]["template"]["metadata"]["labels"]["team"] = "infra"
    assert _np(p) != _np(pool())
    p = pool()
    p["spec"]["template"]["metadata"]["annotations"] = {}
    assert _np(p) != _np(pool())                     # an empty map is not absent
    p = pool()
    p["spec"]["disruption"] = {"budgets": [{"nodes": "0"}]}
    p["spec"]["limits"] = {"cpu": "10"}
    assert _np(p) == _np(pool())                     # outside spec.template


def test_bad_input_names_the_field():
    with pytest.raises(gotypes.HashInputError, match=r"spec.template.spec.expireAfter: '3 days' is not a duration"):
        kh.nodepool_hash(pool(expireAfter="3 days"))
    with pytest.raises(gotypes.HashInputError, match=r"spec.detailedMonitoring: expected true or false"):
        _nc_hash({**MINIMAL, "detailedMonitoring": "yes"})
    with pytest.raises(gotypes.HashInputError, match=r"hash version 'v4'"):
        kh.ec2nodeclass_hash({"kind": "EC2NodeClass", "spec": MINIMAL}, CA, "v4")
    assert kh.ec2nodeclass_hash({"kind": "EC2NodeClass", "spec": {**MINIMAL, "colour": 1}}).unknown_fields == ("spec.colour",)


def test_fnv_is_fnv1_64():
    # Go: fnv.New64().Write([]byte("a")).Sum64() == 0xaf63bd4c8601b7be (FNV-1; FNV-1a would be 0xaf63dc4c8601ec8c)
    assert hashstructure.fnv64(b"a") == 0xAF63BD4C8601B7BE


def test_cli_prints_kind_name_version_hash(tmp_path, capsys):
    import yaml

    from nodewarm.cli import main

    f = tmp_path / "objs.yaml"
    f.write_text(yaml.safe_dump_all([BASE, pool(), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}]))
    (tmp_path / "ca").write_text(CA)
    for version, value in (("v5", V5_BASE), ("v6", V6_BASE)):
        assert main(["drift", "hash", "-f", str(f), "--ca-bundle", str(tmp_path / "ca"), "--hash-version", version]) == 0
        assert capsys.readouterr().out.splitlines() == [f"EC2NodeClass default {version} {value}",
                                                        f"NodePool gpu v3 {_np(pool())}"]


def test_the_drift_preview_judges_an_ec2nodeclass_at_the_hash_version_it_is_stamped_with():
    # v6 hashes the kubelet as a JSON string (list order counts), v5 as a struct (lists are sets): reordering
    # clusterDNS drifts a v6-stamped class's NodeClaims and no v5-stamped one's.
    from nodewarm.karpenter import driftpreview

    def stamped(version: str, cluster_dns: list[str]) -> dict:
        o = {"kind": "EC2NodeClass", "metadata": {"name": "gpu"}, "spec": {
            "role": "KarpenterNodeRole", "amiSelectorTerms": [{"alias": "al2023@v20250101"}],
            "kubelet": {"clusterDNS": cluster_dns}}}
        h = kh.ec2nodeclass_hash(o, "Q0E=", version)
        o["metadata"]["annotations"] = {h.hash_annotation: h.value, h.version_annotation: version}
        return o

    for version, verdict in (("v5", None), ("v6", driftpreview.WOULD)):
        live = stamped(version, ["10.0.0.10", "10.0.0.11"])
        claim = {"metadata": {"name": "gpu-abc", "annotations": dict(live["metadata"]["annotations"])}}
        after = copy.deepcopy(live)
        after["spec"]["kubelet"]["clusterDNS"].reverse()
        found = driftpreview.static_drift("EC2NodeClass", live, after, claim)
        assert (found[0] if found else None) == verdict, version
