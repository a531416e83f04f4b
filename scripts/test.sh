#!/usr/bin/env bash
# The test command (README, and .ci/run on a clean clone): set up, run the whole suite against the real local
# servers (kube-apiserver + etcd, S3) and real CPU torch.compile (the light tests on two workers, then the heavy
# ones in turn: scripts/test-selection.sh), then the clean-clone check
# (scripts/check-standalone.sh: a clone with nothing beside it runs setup and the demo), then the suite once more at
# the dependency floors (scripts/test-floors.sh), so the floors pyproject.toml declares are proven. Arguments go to
# pytest; with arguments (a developer running part of the suite) the clean-clone check is left out.
#
# Karpenter's CRDs: the suite installs and checks against the project's own (nodewarm/karpenter/crds.py)
# unless NODEWARM_CRDS_DIR names a Karpenter release's CRD folder; then it uses those, and the floors pass still
# runs on the project's own, so one run with NODEWARM_CRDS_DIR covers both (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/test-selection.sh
# --durations: the slowest 30, where CI time goes (docs/testing.md).
if (($# == 0)); then
  .venv/bin/python -m pytest "${LIGHT_WORKERS[@]}" -m "$LIGHT_TESTS" --durations=30
  .venv/bin/python -m pytest -m "not ($LIGHT_TESTS)" --durations=30
  bash scripts/check-standalone.sh
else
  .venv/bin/python -m pytest --durations=30 "$@"
fi
exec env -u NODEWARM_CRDS_DIR bash scripts/test-floors.sh "$@"
