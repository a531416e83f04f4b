"""The background pull's settings come from the profile's spec.weights.background, as the user wrote it or by
default."""

from __future__ import annotations

from nodewarm import profile
from nodewarm.bootstrap.modelcache.background import pull_overrides
from support.builders import v


def test_the_profiles_defaults_throttle_the_pull_and_lower_its_cpu_priority():
    assert pull_overrides(profile.from_dict(v()).weights.background) == {
        "concurrency": 2, "max_bps": 200e6, "nice": 19}


def test_the_users_settings_reach_the_pull():
    p = profile.from_dict(v(spec__weights__background={"maxMBps": 50, "concurrency": 6}))
    assert pull_overrides(p.weights.background) == {"concurrency": 6, "max_bps": 50e6, "nice": 19}
