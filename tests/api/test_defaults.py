"""The WarmProfile's defaults, read from its one schema (nodewarm.api.defaults): a dotted path under spec reads the
default the schema declares there, a list's field is read in its items, and a path without one is refused at once."""

from __future__ import annotations

import pytest

from nodewarm.api import defaults
from nodewarm.api.schema import profile_schema

SPEC = profile_schema()["properties"]["spec"]["properties"]


def test_a_dotted_path_reads_the_default_the_schema_declares_there():
    readiness = SPEC["readiness"]["properties"]
    assert defaults.default("readiness.deadline") == readiness["deadline"]["default"]
    peers = SPEC["weights"]["properties"]["peers"]["properties"]
    assert defaults.default("weights.peers.port") == peers["port"]["default"]
    assert (defaults.TAINT_KEY, defaults.DEADLINE, defaults.ON_DEADLINE) == tuple(
        readiness[k]["default"] for k in ("taintKey", "deadline", "onDeadline"))


def test_a_field_of_a_list_is_read_in_its_items():
    item = SPEC["models"]["items"]["properties"]
    assert defaults.default("models.priority") == item["priority"]["default"]
    assert defaults.default("models.replicas") == item["replicas"]["default"]


def test_a_path_without_a_default_is_refused_at_once():
    with pytest.raises(KeyError, match=r"declares no default for spec\.model\.uri"):
        defaults.default("model.uri")
