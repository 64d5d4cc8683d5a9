"""The sorted schemes' level searches as the frontends call them: compiled when numba is there.

:mod:`.orq_levels` (ORQ's exact program) and :mod:`.bingrad_pb` (BinGrad-pb's exact two levels)
hold each search once, as plain Python that numba compiles unchanged (``_nb_search`` compiles
them, with ORQ's closed-form passes as vector steps, because the fused encoders call them per
bucket). This module picks the compiled function
when numba is importable and the source otherwise; the two give the same bits (the tests compare
them with ``compiled=False``). It is the only module that imports both the sources and the
compiled versions, so the import graph has no cycle: sources <- compiled <- this.

Loading this module installs :func:`levels` and :func:`pb_levels` in the schemes' slot
(:mod:`hvd_gradq.schemes.searches`): the schemes call them from there, never importing this
package, which sits above them.

``HVD_GRADQ_KERNELS`` switches off the fused encode kernels, not these searches: the searches
are the schemes' math (the reference runs them too), and the compiled one is merely faster.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import GradqError
from ..schemes import searches
from . import bingrad_pb, orq_levels
from ._switch import numba_importable


@lru_cache(maxsize=1)
def _compiled() -> tuple[Callable[..., None], Callable[..., None]] | None:
    """(orq_exact, bingrad_pb) compiled by numba, or None without numba."""
    if not numba_importable():
        return None
    from ._numba import bingrad_pb as pb_compiled
    from ._numba import orq_exact

    return orq_exact, pb_compiled


def compiled_available() -> bool:
    return _compiled() is not None


def level_indices(ys: NDArray[Any], s: int, *, compiled: bool = True) -> NDArray[Any]:
    """Indices (rows, s) of ORQ's optimal levels of sorted float64 rows ``ys`` (rows, w).
    ``compiled=False`` runs the Python source (the tests compare the two)."""
    ys = np.ascontiguousarray(ys, dtype=np.float64)
    rows, w = ys.shape
    if s < 2:
        raise GradqError(f"orq: {s} levels; the level search needs at least 2 (levels=2 .. 256)")
    idx = np.zeros((rows, s), np.int64)
    if rows == 0 or w == 0:
        return idx
    fns = _compiled() if compiled else None
    (fns[0] if fns else orq_levels.exact_level_indices)(ys, s, idx, *orq_levels.scratch(w, s))
    return idx


def levels(x: NDArray[Any], s: int) -> NDArray[Any]:
    """ORQ's ``s`` levels (rows, s), float32, at the exact optimum for buckets ``x`` (rows, w):
    the function the frontends run through ``Ops.host``. The levels are data points of each
    bucket, so float32 holds them exactly."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise GradqError(
            f"orq levels: buckets must be a 2-D (rows, width) array, got shape {x.shape}; reshape to (buckets, bucket)"
        )
    ys = np.sort(x, axis=1).astype(np.float64)
    idx = level_indices(ys, s)
    return np.take_along_axis(ys, idx, axis=1).astype(np.float32)


def pb_levels_f64(ys: NDArray[Any], *, compiled: bool = True) -> NDArray[Any]:
    """BinGrad-pb's (l1, l2) rows (rows, 2), float64, for sorted float64 rows ``ys`` (rows, w).
    ``compiled=False`` runs the Python source (the tests compare the two)."""
    ys = np.ascontiguousarray(ys, dtype=np.float64)
    if ys.ndim != 2 or ys.shape[1] == 0:
        raise GradqError(f"bingrad pb levels: need sorted rows (rows, width >= 1), got shape {ys.shape}")
    out = np.zeros((ys.shape[0], 2), np.float64)
    fns = _compiled() if compiled else None
    (fns[1] if fns else bingrad_pb.pb_levels_sorted)(ys, out, *bingrad_pb.scratch(ys.shape[1]))
    return out


def pb_levels(x: NDArray[Any]) -> NDArray[Any]:
    """BinGrad-pb's levels (rows, 2), float32, for buckets ``x`` (rows, w): the function the
    frontends run through ``Ops.host``."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise GradqError(f"bingrad pb levels: buckets must be 2-D (rows, width), got shape {x.shape}")
    return pb_levels_f64(np.sort(x, axis=1).astype(np.float64)).astype(np.float32)


searches.provide(searches.ORQ, levels)
searches.provide(searches.BINGRAD_PB, pb_levels)
