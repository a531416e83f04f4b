#!/usr/bin/env bash
# The test command (README, and .ci/run on a clean clone): set up, then run the whole suite against the
# real local servers (kube-apiserver + etcd, S3) and real CPU torch.compile.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
