"""The two engines the unit tests run a scheme through: the NumPy reference
(``HVD_GRADQ_KERNELS=0``) and the compiled fast paths (``hvd_gradq.kernels``, numba).

numba is a dependency of this test suite (``scripts/setup.sh`` installs it). Without it the
kernels turn themselves off and every caller runs the NumPy reference, so a "kernels" case would
silently rerun the reference case: it fails instead, saying why.
"""
from __future__ import annotations

import pytest

from hvd_gradq.kernels._switch import numba_importable

ENGINES = ("reference", "kernels")
NO_NUMBA = (
    "numba is not importable, so the 'kernels' case would silently run the NumPy reference "
    "again; numba is a dependency of the tests: install it (scripts/setup.sh)"
)


def require_numba() -> None:
    """Fail the test (never skip) if the compiled paths cannot run."""
    if not numba_importable():
        pytest.fail(NO_NUMBA)


def set_engine(monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    """Route ``quantize`` / ``dequantize`` through ``engine`` for this test."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, not {engine!r}")
    if engine == "kernels":
        require_numba()
    monkeypatch.setenv("HVD_GRADQ_KERNELS", "0" if engine == "reference" else "1")
