#!/usr/bin/env bash
# The test command (README, and .ci/run on a clean clone): set up, run the whole suite against the real local
# servers (kube-apiserver + etcd, S3) and real CPU torch.compile, then once more at the dependency floors
# (scripts/test-floors.sh), so the floors pyproject.toml declares are proven. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest "$@"
exec bash scripts/test-floors.sh "$@"
