"""WarmProfile validation: every bad input names the field, the bad value and the fix."""

from __future__ import annotations

import pytest

from nodewarm import instancetypes, profile, sizing
from nodewarm.api import podlayout, warmprofile
from nodewarm.api.errors import ProfileError
from support.builders import v


def checked(doc):
    p = profile.from_dict(doc)
    profile.check(p, instancetypes.lookup(list(p.nodes.instance_types)))
    return p


SNAP = {"enabled": True}
CHECK = {"enabled": True, "timeout": "10m", "image": "registry.example/vllm-nodewarm:1"}


def test_snapshots_are_off_unless_asked_and_on_for_al2023_with_the_engine_check():
    assert profile.from_dict(v()).serving.snapshot is False
    checked(v(spec__serving__snapshot=SNAP, spec__readiness__engineCheck=CHECK))


@pytest.mark.parametrize("doc, field, words", [
    (v(spec__serving__tensorParallelSize=3), "spec.serving.tensorParallelSize", ["p5.48xlarge has 8 GPUs", "[1, 2, 4, 8]"]),
    (v(spec__serving__tensorParallelSize=16), "spec.serving.tensorParallelSize", ["8 GPUs"]),
    (v(spec__model__sizeGB=31000), "spec.model.sizeGB", ["30400 GB of NVMe", "larger instance types"]),
    (v(spec__nodes__instanceTypes=["p5.48xlarge", "g5.xlarge"]), "spec.serving.tensorParallelSize", ["g5.xlarge has 1 GPUs"]),
    (v(spec__nodes__instanceTypes=["p5.48xlarg"]), "spec.nodes.instanceTypes[0]", ["unknown instance type", "--instance-source ec2"]),
    (v(spec__nodes__role=None), "spec.nodes.role", ["IAM role"]),
    (v(spec__nodes__subnetSelectorTerms=None), "spec.nodes.subnetSelectorTerms", ["at least one term"]),
    (v("automode", spec__nodes__userData="#!/bin/bash\n"), "spec.nodes.userData", ["Auto Mode has no user data"]),
    (v("automode", spec__weights={"peers": {"enabled": True}}), "spec.weights.peers.enabled",
     ["AL2023 agent only", "turn peers off"]),
    (v("automode", spec__serving__snapshot=SNAP, spec__readiness__engineCheck=CHECK), "spec.serving.snapshot.enabled",
     ["Auto Mode nodes take no user data", "AL2023"]),
    (v(spec__nodes__amiAlias="bottlerocket@latest", spec__serving__snapshot=SNAP, spec__readiness__engineCheck=CHECK),
     "spec.serving.snapshot.enabled", ["Bottlerocket nodes take no user data"]),
    (v(spec__serving__snapshot=SNAP), "spec.serving.snapshot.enabled", ["engineCheck.enabled: true"]),
    (v(spec__serving__snapshot=SNAP, spec__readiness__engineCheck={**CHECK, "timeout": "15m"}),
     "spec.readiness.deadline", ["checkpoints the engine before Warm", "at least 22m"]),
])
def test_semantic_errors_name_field_value_and_fix(doc, field, words):
    with pytest.raises(ProfileError) as e:
        checked(doc)
    assert e.value.field == field
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("doc, field, words", [
    (v(spec__nodes__mode="eks"), "spec.nodes.mode", ["one of ['karpenter', 'automode']"]),
    (v(spec__model__uri="https://bucket/x"), "spec.model.uri", ["must match"]),
    (v(spec__model__uri="s3://models-bucket/qwen3"), "spec.model.uri", ["must match"]),   # not a prefix
    (v(spec__model__sizeGB=0), "spec.model.sizeGB", ["exclusiveMinimum"]),
    (v(spec__serving__tensorParallelSize="2"), "spec.serving.tensorParallelSize", ["type integer"]),
    (v(spec__serving__image=None), "spec.serving", ["'image' is required"]),
    (v(spec__readiness__deadline="20 minutes"), "spec.readiness.deadline", ["must match"]),
    (v(spec__readiness__onDeadline="evict"), "spec.readiness.onDeadline", ["untaint", "replace", "keep"]),
    (v(spec__serving__tensorParalelSize=2), "spec.serving", ["unknown field(s) ['tensorParalelSize']"]),
    (v(spec__compileCache=None), "spec", ["'compileCache' is required"]),
    (v(kind="Profile"), "kind", ["WarmProfile"]),
    (v(spec__weights={"peers": {"enabled": True, "port": 80}}), "spec.weights.peers.port", ["minimum"]),
    (v(spec__weights={"peers": {"maxMBps": 0}}), "spec.weights.peers.maxMBps", ["exclusiveMinimum"]),
    (v(spec__weights={"peers": {"enable": True}}), "spec.weights.peers", ["unknown field(s) ['enable']"]),
])
def test_schema_errors_name_field_value_and_fix(doc, field, words):
    with pytest.raises(ProfileError) as e:
        profile.from_dict(doc)
    assert e.value.field == field, str(e.value)
    for w in words:
        assert w in str(e.value)


def test_valid_profiles_in_both_modes_apply_defaults():
    k = checked(v(spec__readiness=None, spec__serving__chunkSizeGB=None))
    assert (k.readiness.taint_key, k.readiness.deadline_s, k.readiness.on_deadline) == ("nodewarm.io/warming", 1200, "untaint")
    assert k.serving.chunk_size_gb == 4
    assert k.nodes.cache_mount == "/mnt/k8s-disks/0"
    a = checked(v("automode"))
    assert a.nodes.cache_mount == "/mnt/.ephemeral"
    assert podlayout.model_dir(a).startswith("/mnt/.ephemeral/nodewarm/models/")


@pytest.mark.parametrize("size, expected", [(10, 3), (67, 17), (140, 35), (4, 1), (4.01, 2), (0.5, 1)])
def test_concurrency_is_ceil_size_over_chunk(size, expected):
    assert warmprofile.streamer_concurrency(size, 4) == expected
    if size >= 10:
        assert checked(v(spec__model__sizeGB=size)).concurrency == expected


def test_automode_size_equal_to_nvme_is_rejected():
    # g6e.12xlarge: 3800 GB of NVMe; asking for exactly that makes Auto Mode use EBS.
    doc = v("automode", spec__nodes__instanceTypes=["g6e.12xlarge"], spec__serving__tensorParallelSize=4,
            spec__nodes__ephemeralStorageSize="3800G")
    with pytest.raises(ProfileError) as e:
        checked(doc)
    assert e.value.field == "spec.nodes.ephemeralStorageSize" and "strictly below" in str(e.value)


def test_automode_size_just_below_nvme_is_accepted_and_too_small_is_rejected():
    ok = v("automode", spec__nodes__instanceTypes=["g6e.12xlarge"], spec__serving__tensorParallelSize=4,
           spec__nodes__ephemeralStorageSize="3799G")
    checked(ok)
    small = v("automode", spec__nodes__instanceTypes=["g6e.12xlarge"], spec__serving__tensorParallelSize=4,
              spec__nodes__ephemeralStorageSize="50Gi")
    with pytest.raises(ProfileError) as e:
        checked(small)
    assert "at least the model plus headroom" in str(e.value)


def test_automode_computed_size_is_below_the_smallest_nvme_of_all_types():
    from nodewarm.nodeclasses import automode

    p = checked(v("automode", spec__nodes__instanceTypes=["p5.48xlarge", "g6e.12xlarge"],
                  spec__serving__tensorParallelSize=4))
    types = instancetypes.lookup(list(p.nodes.instance_types))
    size = sizing.parse_quantity_bytes(automode.ephemeral_size(p, types))
    assert size < 3800 * sizing.GB                       # g6e.12xlarge is the smallest
    assert size >= sizing.required_nvme_gb(67) * sizing.GB


def test_model_that_does_not_fit_smallest_type_names_it():
    doc = v("automode", spec__nodes__instanceTypes=["p5.48xlarge", "g6e.xlarge"], spec__serving__tensorParallelSize=1,
            spec__model__sizeGB=300)
    with pytest.raises(ProfileError) as e:
        checked(doc)
    assert "g6e.xlarge has 250 GB" in str(e.value)


def test_load_reports_yaml_and_document_count_errors(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("a: [\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        profile.load(f)
    f.write_text("a: 1\n---\nb: 2\n")
    with pytest.raises(ProfileError, match="exactly one WarmProfile"):
        profile.load(f)


@pytest.mark.parametrize("deadline", ["0s", "30s", "59s", "0m", "0h"])
def test_deadline_under_a_minute_is_refused_with_the_reason(deadline):
    with pytest.raises(ProfileError) as e:
        profile.from_dict(v(spec__readiness__deadline=deadline))
    assert e.value.field == "spec.readiness.deadline" and "at least 1m" in str(e.value)


@pytest.mark.parametrize("deadline", ["60s", "90s", "1m", "20m", "1h"])
def test_deadline_of_a_minute_or_more_is_accepted(deadline):
    assert profile.from_dict(v(spec__readiness__deadline=deadline)).readiness.deadline_s >= 60


@pytest.mark.parametrize("value, seconds", [(None, 600), ("90s", 90), ("10m", 600), ("1h", 3600)])
def test_image_prepull_timeout_defaults_to_ten_minutes(value, seconds):
    p = profile.from_dict(v(spec__bootstrap__imagePrepullTimeout=value))
    assert p.bootstrap.image_prepull_timeout_s == seconds


@pytest.mark.parametrize("value", ["10 minutes", "0s", "0m", "600", "-5m", "1.5h", "1d", ""])
def test_a_bad_image_prepull_timeout_names_the_field_and_a_good_value(value):
    with pytest.raises(ProfileError) as e:
        profile.from_dict(v(spec__bootstrap__imagePrepullTimeout=value))
    assert e.value.field == "spec.bootstrap.imagePrepullTimeout" and e.value.value == value
    assert "e.g. 90s, 10m" in str(e.value)
