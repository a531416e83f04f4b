"""The serving spec the compile-cache key sees (nodewarm.api.servingspec): eager mode, once allowed, is in it and in
the generation; allowEager alone changes nothing."""

from __future__ import annotations

from nodewarm import profile
from nodewarm.api.generation import generation
from nodewarm.api.servingspec import serving_spec
from support.builders import v


def test_allowed_eager_mode_is_in_the_compile_cache_key_and_the_generation():
    plain = profile.from_dict(v(spec__serving__allowEager=True))
    eager = profile.from_dict(v(spec__serving__extraArgs=["--enforce_eager"], spec__serving__allowEager=True))
    assert serving_spec(eager).engine["enforce-eager"] == "true"
    assert "enforce-eager" not in serving_spec(plain).engine and serving_spec(plain) != serving_spec(eager)
    # Pods of the eager profile select only nodes warmed for it.
    assert generation(plain) != generation(eager)
    # allowEager alone changes nothing vLLM gets.
    assert serving_spec(plain) == serving_spec(profile.from_dict(v()))
