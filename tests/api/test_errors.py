"""The one exception family (nodewarm.api.errors): a failure says its reason and its message on one line, and a
ProfileError names the field, the bad value and the fix, and exits 2."""

from __future__ import annotations

from nodewarm.api.errors import NodewarmError, ProfileError


def test_a_failure_is_one_line_led_by_its_reason():
    e = NodewarmError("the NVMe mount\n   /mnt/k8s-disks/0 is missing:\tformat it", reason="InsufficientNVMe")
    assert e.one_line() == "InsufficientNVMe: the NVMe mount /mnt/k8s-disks/0 is missing: format it"
    plain = NodewarmError("x")
    assert (plain.reason, plain.exit_code, plain.one_line()) == ("Failed", 1, "Failed: x")


def test_a_profile_error_names_the_field_the_value_and_the_fix():
    e = ProfileError("spec.readiness.deadline", "30s", "at least 1m")
    assert (e.field, e.value, e.fix, e.reason, e.exit_code) == (
        "spec.readiness.deadline", "30s", "at least 1m", "InvalidProfile", 2)
    assert e.one_line() == "InvalidProfile: spec.readiness.deadline: '30s' is not valid: at least 1m"
    assert isinstance(e, NodewarmError)
