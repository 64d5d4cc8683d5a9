#!/usr/bin/env bash
# Set up if needed, then lint (ruff), type-check (mypy, strict on hvd_gradq/) and run every test:
# unit tests in one process and parallel tests that pytest launches under horovodrun
# (2 and 4 ranks, Gloo and MPI). Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
PY="$ROOT/.venv/bin/python"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2
echo "== ruff"
"$PY" -m ruff check hvd_gradq tests examples scripts bench
echo "== mypy (strict on hvd_gradq)"
"$PY" -m mypy hvd_gradq
echo "== import without torch and TensorFlow"
"$PY" - <<'PYEOF'
import subprocess, sys
code = ("import sys; sys.modules['torch'] = None; sys.modules['tensorflow'] = None; "
        "import hvd_gradq, numpy as np; p = hvd_gradq.quantize(np.ones(10, np.float32), 'orq'); "
        "assert 'torch' not in sys.modules or sys.modules['torch'] is None; print('ok', p.nbytes)")
subprocess.run([sys.executable, "-c", code], check=True)
PYEOF
echo "== pytest"
"$PY" -m pytest "$@"
