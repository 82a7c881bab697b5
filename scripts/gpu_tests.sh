#!/usr/bin/env bash
# Run the GPU-marked tests on a machine with CUDA (the default run deselects them).
# Usage: scripts/gpu_tests.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m pytest -m gpu -p no:cacheprovider tests/gpu "$@"
