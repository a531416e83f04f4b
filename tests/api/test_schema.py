"""The WarmProfile schema (nodewarm.api.schema, one file beside it): the CLI's strict view and the CRD built from it
refuse what the profile loader refuses, and carry the defaults the fields declare (and none a field must not have)."""

from __future__ import annotations

import yaml


def test_the_crd_schema_refuses_a_short_deadline_too():
    import re

    from nodewarm.api.schema import strict_schema

    pattern = strict_schema()["properties"]["spec"]["properties"]["readiness"]["properties"]["deadline"]["pattern"]
    assert not any(re.match(pattern, d) for d in ("0s", "59s", "0m", "5", "1d"))
    assert all(re.match(pattern, d) for d in ("60s", "600s", "1m", "20m", "2h"))


def test_the_crd_refuses_what_the_cli_refuses_for_the_image_prepull_timeout():
    """The CRD is generated from the same schema: its pattern is the one the CLI's message explains."""
    import re

    from nodewarm.api.schema import crd

    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    field = spec["properties"]["bootstrap"]["properties"]["imagePrepullTimeout"]
    assert "default" not in field       # 10m, or half a shorter readiness.deadline (profile.default_prepull_timeout)
    assert not any(re.match(field["pattern"], t) for t in ("10 minutes", "0s", "600", "1.5h"))
    assert all(re.match(field["pattern"], t) for t in ("1s", "90s", "10m", "2h"))


def test_the_crd_has_no_fixed_prepull_default_that_would_contradict_a_short_deadline():
    from nodewarm.api.schema import crd

    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "default" not in spec["properties"]["bootstrap"]["properties"]["imagePrepullTimeout"]
    assert yaml.safe_dump(crd())       # still one serializable document


def test_the_crd_carries_the_field_with_its_defaults():
    from nodewarm.api.schema import crd

    ec = (crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
          ["readiness"]["properties"]["engineCheck"])
    assert ec["properties"]["enabled"]["default"] is False and ec["properties"]["timeout"]["default"] == "10m"
