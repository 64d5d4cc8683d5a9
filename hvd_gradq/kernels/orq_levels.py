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
(``tests/unit/test_orq.py::test_compiled_search_is_the_python_search``).
:func:`hvd_gradq.kernels.search.levels` runs the compiled one when numba is importable (it is a
dependency; ``HVD_GRADQ_KERNELS`` turns off the fused encode kernels, not this search), else this
source as it is. Every frontend reaches it through ``Ops.host``
(:meth:`hvd_gradq.schemes.orq.ORQ.choose`); the fused numba encoder calls ``orq_exact`` itself.
This module holds only the source, so that the compiled modules can import it and nothing here
imports them back.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

STACK = 64  # divide-and-conquer frames: the depth is at most log2(w) + 1


def scratch(w: int, s: int) -> tuple[NDArray[Any], ...]:
    """Work arrays for :func:`exact_level_indices` on buckets of up to ``w`` points, ``s`` levels:
    (y, p1, p2, hh, fa, fb, gg, arg, stk). Allocate once per call, reuse for every bucket."""
    w = max(w, 1)
    return (
        np.empty(w, np.float64),
        np.empty(w + 1, np.float64),
        np.empty(w + 1, np.float64),
        np.empty(w, np.float64),
        np.empty(w, np.float64),
        np.empty(w, np.float64),
        np.empty(w, np.float64),
        np.empty((max(s - 3, 1), w), np.int64),
        np.empty(4 * STACK, np.int64),
    )


def exact_level_indices(ys: Any, s: int, idx: Any, y: Any, p1: Any, p2: Any, hh: Any, fa: Any, fb: Any,
                        gg: Any, arg: Any, stk: Any) -> None:
    """Level indices idx[r, :s] (non-decreasing, first 0, last w-1) of the exact optimum for each
    sorted float64 row ys[r, :w]. Scratch from :func:`scratch`. Numba-compilable as it is.

    The candidate value f(i) + C(i, j) is evaluated as G_i + y_i K1_j + y_j H_i + K0_j with
    G_i = f(i) + P2_i - y_i P1_i (per layer), H_i = i y_i - P1_i (per bucket), K1_j =
    P1_{j+1} - (j+1) y_j, K0_j = y_j P1_{j+1} - P2_{j+1}: the same sum regrouped (P1, P2 prefix
    sums of y, y^2 before each index), two products a candidate, K0 left out of the comparison."""
    rows = ys.shape[0]
    w = ys.shape[1]
    for r in range(rows):
        row = ys[r]
        out = idx[r]
        # points shifted to start at 0 (keeps the cancellation small), prefix sums of y, y^2
        y0 = row[0]
        a1 = 0.0
        a2 = 0.0
        for k in range(w):
            v = row[k] - y0
            y[k] = v
            p1[k] = a1
            p2[k] = a2
            hh[k] = np.float64(k) * v - a1
            a1 += v
            a2 += v * v
        p1[w] = a1
        p2[w] = a2
        out[0] = 0
        out[s - 1] = w - 1
        if s == 2:
            continue
        # layer 1: F_1(j) = C(0, j) = K0_j (G_0 = H_0 = y_0 = 0)
        f0 = fa
        f1 = fb
        for j in range(w):
            f0[j] = y[j] * p1[j + 1] - p2[j + 1]
        # layers 2 .. s-2: divide and conquer over j with monotone argmin
        for t in range(2, s - 1):
            for i in range(w):
                gg[i] = f0[i] + p2[i] - y[i] * p1[i]
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
                k1 = b1 - np.float64(mid + 1) * ym
                top = min(mid, ihi)
                # and opt_t(mid) >= opt_{t-1}(mid) (a last segment only shortens as segments are
                # added: the quadrangle inequality again); a floor of 0 at t = 2
                lo = ilo
                if t > 2:
                    lo = min(max(ilo, arg[t - 3, mid]), top)
                best = np.inf
                bi = lo
                for i in range(lo, top + 1):
                    v = gg[i] + y[i] * k1 + ym * hh[i]
                    if v < best:  # ties keep the smaller index
                        best = v
                        bi = i
                f1[mid] = best + (ym * b1 - p2[mid + 1])
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
        k1 = p1[w] - np.float64(w) * ym
        lo = 0
        if s > 3:
            lo = arg[s - 4, w - 1]
        best = np.inf
        bi = lo
        for i in range(lo, w):
            v = (f0[i] + p2[i] - y[i] * p1[i]) + y[i] * k1 + ym * hh[i]
            if v < best:
                best = v
                bi = i
        out[s - 2] = bi
        for t in range(s - 2, 1, -1):
            out[t - 1] = arg[t - 2, out[t]]
