"""ORQ's level search at the exact optimum: the one implementation every path runs.

The problem (adaptive stochastic quantization, ASQ): for a sorted bucket y_0 <= ... <= y_{w-1},
choose s levels l_0 = y_0 <= ... <= l_{s-1} = y_{w-1} minimising the variance of unbiased
stochastic rounding, sum_x (l_{j+1} - x)(x - l_j). The optimum puts every level on a data point,
so it is a shortest path over sorted points: with the segment cost

    C(i, j) = sum_{i<=k<=j} (y_j - y_k)(y_k - y_i) = (y_i + y_j) S1 - S2 - n y_i y_j

(S1, S2: sums of y and y^2 over i..j, from prefix sums; n = j - i + 1), the program is
F_1(j) = C(0, j), F_t(j) = min_{i<=j} F_{t-1}(i) + C(i, j), answer F_{s-1}(w-1). ``i == j``
(a zero-cost segment, a repeated level) is allowed, so buckets with fewer points than levels,
or with runs of equal values, need no special case.

C satisfies the quadrangle inequality (Ben Basat, Ben-Itzhak, Mitzenmacher, Vargaftik,
"Optimal and Approximate Adaptive Stochastic Quantization", NeurIPS 2024, arXiv 2402.03158),
so the first index attaining each row minimum, opt_t(j), is non-decreasing in j and every layer
is a divide-and-conquer over j with monotone argmin: O(w log w) a layer, O(s w log w) a bucket
after the sort (QUIVER's SMAWK variant is O(s w); the difference is a log factor at w = 512).
The first layer is direct (O(w)), the last needs only j = w-1 (O(w)). Exactness is checked
against an independent O(s w^2) program in ``tests/unit/test_orq.py``.

:func:`exact_level_indices` is plain Python over NumPy arrays, written so that numba compiles
the same source (``hvd_gradq.kernels._numba.orq_exact``): one function body, no helper calls,
no allocation (the caller passes the scratch, see :func:`scratch`), deterministic (ties keep
the smaller index, a fixed visiting order, no threads), IEEE float64 operations in a fixed order
and no fast-math, so the compiled function and this one return the same indices
(``tests/unit/test_orq.py::test_compiled_search_is_the_python_search``). :func:`levels` runs
the compiled one when numba is importable (it is a dependency; ``HVD_GRADQ_KERNELS`` turns off
the fused encode kernels, not this search), else this source as it is. Every frontend reaches
it through ``Ops.host`` (:meth:`hvd_gradq.schemes.orq.ORQ.choose`); the fused numba encoder
calls ``orq_exact`` itself.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import GradqError

STACK = 64  # divide-and-conquer frames: the depth is at most log2(w) + 1


def scratch(w: int, s: int) -> tuple[NDArray[Any], ...]:
    """Work arrays for :func:`exact_level_indices` on buckets of up to ``w`` points, ``s`` levels:
    (y, p1, p2, fx, fa, fb, vb, arg, stk). Allocate once per call, reuse for every bucket."""
    w = max(w, 1)
    return (
        np.empty(w, np.float64),
        np.empty(w + 1, np.float64),
        np.empty(w + 1, np.float64),
        np.empty(w + 1, np.float64),
        np.empty(w, np.float64),
        np.empty(w, np.float64),
        np.empty(w, np.float64),
        np.empty((max(s - 3, 1), w), np.int64),
        np.empty(4 * STACK, np.int64),
    )


def exact_level_indices(ys: Any, s: int, idx: Any, y: Any, p1: Any, p2: Any, fx: Any, fa: Any, fb: Any,
                        vb: Any, arg: Any, stk: Any) -> None:
    """Level indices idx[r, :s] (non-decreasing, first 0, last w-1) of the exact optimum for each
    sorted float64 row ys[r, :w]. Scratch from :func:`scratch`. Numba-compilable as it is."""
    rows = ys.shape[0]
    w = ys.shape[1]
    for r in range(rows):
        row = ys[r]
        out = idx[r]
        # points shifted to start at 0 (keeps the cost's cancellation small), prefix sums of y, y^2
        y0 = row[0]
        a1 = 0.0
        a2 = 0.0
        p1[0] = 0.0
        p2[0] = 0.0
        fx[0] = 0.0
        for k in range(w):
            v = row[k] - y0
            y[k] = v
            a1 += v
            a2 += v * v
            p1[k + 1] = a1
            p2[k + 1] = a2
            fx[k + 1] = np.float64(k + 1)
        out[0] = 0
        out[s - 1] = w - 1
        if s == 2:
            continue
        # layer 1: F_1(j) = C(0, j)
        f0 = fa
        f1 = fb
        for j in range(w):
            yj = y[j]
            f0[j] = (y[0] + yj) * p1[j + 1] - p2[j + 1] - (fx[j + 1] - fx[0]) * y[0] * yj
        # layers 2 .. s-2: divide and conquer over j with monotone argmin
        for t in range(2, s - 1):
            at = arg[t - 2]
            stk[0] = 0
            stk[1] = w - 1
            stk[2] = 0
            stk[3] = w - 1
            sp = 1
            while sp > 0:
                sp -= 1
                jlo = stk[4 * sp]
                jhi = stk[4 * sp + 1]
                ilo = stk[4 * sp + 2]
                ihi = stk[4 * sp + 3]
                mid = (jlo + jhi) >> 1
                ym = y[mid]
                b1 = p1[mid + 1]
                b2 = p2[mid + 1]
                top = min(mid, ihi)
                # and opt_t(mid) >= opt_{t-1}(mid) (a last segment only shortens as segments are
                # added: the quadrangle inequality again); a floor of 0 at t = 2
                lo = ilo
                if t > 2:
                    lo = min(max(ilo, arg[t - 3, mid]), top)
                # two passes, each a straight loop that LLVM vectorizes: the values, then the
                # first index attaining their minimum (ties keep the smaller index)
                fm = fx[mid + 1]
                for i in range(lo, top + 1):
                    yi = y[i]
                    vb[i] = f0[i] + ((yi + ym) * (b1 - p1[i]) - (b2 - p2[i]) - (fm - fx[i]) * yi * ym)
                best = np.inf
                for i in range(lo, top + 1):
                    best = min(best, vb[i])
                bi = lo
                while vb[bi] != best:
                    bi += 1
                f1[mid] = best
                at[mid] = bi
                if mid < jhi:
                    stk[4 * sp] = mid + 1
                    stk[4 * sp + 1] = jhi
                    stk[4 * sp + 2] = bi
                    stk[4 * sp + 3] = ihi
                    sp += 1
                if jlo < mid:
                    stk[4 * sp] = jlo
                    stk[4 * sp + 1] = mid - 1
                    stk[4 * sp + 2] = ilo
                    stk[4 * sp + 3] = bi
                    sp += 1
            f0, f1 = f1, f0
        # layer s-1 at j = w-1 only, then back along the stored argmins
        ym = y[w - 1]
        b1 = p1[w]
        b2 = p2[w]
        lo = 0
        if s > 3:
            lo = arg[s - 4, w - 1]
        fm = fx[w]
        for i in range(lo, w):
            yi = y[i]
            vb[i] = f0[i] + ((yi + ym) * (b1 - p1[i]) - (b2 - p2[i]) - (fm - fx[i]) * yi * ym)
        best = np.inf
        for i in range(lo, w):
            best = min(best, vb[i])
        bi = lo
        while vb[bi] != best:
            bi += 1
        out[s - 2] = bi
        for t in range(s - 2, 1, -1):
            out[t - 1] = arg[t - 2, out[t]]


@lru_cache(maxsize=1)
def _compiled() -> Any:
    """The numba-compiled :func:`exact_level_indices`, or None without numba."""
    from . import _numba_importable

    if not _numba_importable():
        return None
    from ._numba import orq_exact

    return orq_exact


def level_indices(ys: NDArray[Any], s: int, *, compiled: bool = True) -> NDArray[Any]:
    """Indices (rows, s) of the optimal levels of sorted float64 rows ``ys`` (rows, w).
    ``compiled=False`` runs the Python source (the tests compare the two)."""
    ys = np.ascontiguousarray(ys, dtype=np.float64)
    rows, w = ys.shape
    if s < 2:
        raise GradqError(f"orq: {s} levels; the level search needs at least 2 (levels=2 .. 256)")
    idx = np.zeros((rows, s), np.int64)
    if rows == 0 or w == 0:
        return idx
    fn = _compiled() if compiled else None
    (fn or exact_level_indices)(ys, s, idx, *scratch(w, s))
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
