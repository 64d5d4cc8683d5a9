"""Whether the compiled fast paths may run: numba importable, and not turned off.

A module of its own so that the kernel modules (``bingrad_pb``, ``orq_levels``) and the package
``__init__`` can all ask without importing each other.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

_off_depth = 0  # > 0 inside ``disabled()`` blocks


@lru_cache(maxsize=1)
def numba_importable() -> bool:
    """Whether numba imports (checked once: importing it costs about a second)."""
    try:
        import numba  # noqa: F401
    except Exception as e:
        # a declared dependency (setup.cfg); without it every scheme runs the NumPy reference,
        # 10-110x slower, which a user would otherwise only see as slow steps
        warnings.warn(f"numba cannot be imported ({type(e).__name__}: {e}): hvd_gradq runs its NumPy reference "
                      "codec, 10-110x slower; install numba (pip install numba)", RuntimeWarning, stacklevel=2)
        return False
    return True


def available() -> bool:
    """Whether the compiled fast paths can run (numba is importable and not turned off by
    ``HVD_GRADQ_KERNELS=0`` or a :func:`disabled` block)."""
    if _off_depth > 0:
        return False
    if os.environ.get("HVD_GRADQ_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return numba_importable()


@contextmanager
def disabled() -> Iterator[None]:
    """Run the NumPy reference instead of the kernels inside the block (process-wide, nestable):
    tests use it to get an oracle that shares no code with the compiled paths."""
    global _off_depth
    _off_depth += 1
    try:
        yield
    finally:
        _off_depth -= 1
