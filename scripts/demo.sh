#!/usr/bin/env bash
# The demo: set up if needed, then train the same MNIST-1D MLP on 2 ranks with no compression,
# Horovod's fp16, ORQ-5 and ORQ-3, on an emulated 20 Mbit/s link when run as root (else on
# loopback, saying so), and print them side by side (scripts/demo.py --help for options).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2 OMP_NUM_THREADS=1
exec "$ROOT/.venv/bin/python" scripts/demo.py "$@"
