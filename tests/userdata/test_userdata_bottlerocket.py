"""Bottlerocket user data: left to the user (the DaemonSet launches), but checked before it reaches a node."""

from __future__ import annotations

import pytest

from nodewarm.userdata.bottlerocket import KARPENTER_SETTINGS_RESERVE, check
from nodewarm.userdata.errors import UserDataInvalid, UserDataTooLarge
from nodewarm.userdata.merge import USER_DATA_LIMIT

SETTINGS = """\
[settings.kubernetes]
max-pods = 110

[settings.host-containers.admin]
enabled = false
"""


def test_valid_settings_pass_through_unchanged_with_the_budget():
    result = check(SETTINGS)
    assert result.user_data == SETTINGS
    assert result.bytes_used == len(SETTINGS) + KARPENTER_SETTINGS_RESERVE
    assert result.budget_left == USER_DATA_LIMIT - result.bytes_used


def test_no_user_data_is_fine():
    assert check(None).user_data is None and check(None).bytes_used == KARPENTER_SETTINGS_RESERVE


@pytest.mark.parametrize("text,match", [
    ("#!/bin/bash\necho hi\n", "not valid TOML"),
    ('[settings.kubernetes]\nnode-taints = { "a" = ["b:NoSchedule"] }\n', "NodePool"),
    ("settings = 1\n", "must be tables"),
])
def test_settings_that_would_break_or_be_dropped_are_refused(text, match):
    with pytest.raises(UserDataInvalid, match=match):
        check(text)


def test_oversized_settings_are_a_clear_error():
    text = "# " + "x" * (USER_DATA_LIMIT - KARPENTER_SETTINGS_RESERVE) + "\n"
    with pytest.raises(UserDataTooLarge, match="16384"):
        check(text)
