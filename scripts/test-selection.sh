# shellcheck shell=bash disable=SC2034  # sourced: the variables are the caller's
# Sourced by scripts/test.sh and scripts/test-floors.sh: which tests are light, in one place.
# Light: no vLLM boot, no real node, nothing marked slow (pyproject.toml's markers). Their time is mostly waiting
# on the local servers, so they run on two workers (pytest-xdist; a test file stays on one worker, so a module's
# fixture is built once). The heavy ones each keep the cores busy themselves: they run one at a time.
LIGHT_TESTS="not vllm and not realnode and not slow"
LIGHT_WORKERS=(-n 2 --dist loadfile)
