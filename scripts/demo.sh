#!/usr/bin/env bash
# The main job: set up if needed, then train the MNIST-1D CNN on 2 ranks with ORQ-5 and with no
# compression, and print the two summaries side by side.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2 OMP_NUM_THREADS=1
exec "$ROOT/.venv/bin/python" scripts/demo.py "$@"
