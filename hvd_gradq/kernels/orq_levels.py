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
so the first index attaining each row minimum, opt_t(j), is non-decreasing in j, and a layer is
a divide and conquer over j with monotone argmin: O(w log w).

Two layers cost O(w) instead, by the closed form of one level between fixed neighbours (the
same fact QUIVER's accelerated variant uses): C2(i, j) = min_m C(i, m) + C(m, j) is a convex,
piecewise-linear function of the middle level whose slope right of y_m is T - (j - m)(y_j - y_i),
T = sum_{i<=k<=j} (y_k - y_i), so its first minimiser is m = ceil(j - T / (y_j - y_i)) (i when
the span is 0): O(1) from the prefix sums. Layer 2 is F_2(j) = C2(0, j) for every j, and the last
two levels are one pass over the next-to-last layer, min_i F_{s-3}(i) + C2(i, w-1) (for s = 4,
min_i F_2(i) + C(i, w-1)). So s = 3, 4, 5 (ORQ-5 is the default) cost O(w) a bucket after the
sort, and s >= 6 runs s - 5 divide-and-conquer layers (3 .. s-3) instead of s - 3. Exactness
is checked against an independent O(s w^2) program in ``tests/unit/test_orq.py``.

Measured costs (one thread, Gaussian buckets of 512, search only, AMD EPYC with AVX-512): a
divide-and-conquer layer is ~7.5 candidates an element at ~2 ns each plus ~5 ns an element of
per-row overhead, ~18 ns an element in all; ORQ-5 ~4.7 ns (was ~11: ~1.0 the scan, ~1.1 layer 2,
~1.7 the last pass, ~0.2 its first minimum), ORQ-4 ~3.6, ORQ-9 ~75, ORQ-16 ~200. Most rows at the
finest strides have 1 to 4 candidates: they take four fixed, branch-free candidates (the last
repeated past the range), which saved ~12% (mispredicted loop exits and comparisons). Tried and
dropped: C2 as the step of the divide and conquer (C2 is the (min,+) square of a Monge matrix,
so Monge too: half the layers) is 0.59x as fast for ORQ-9, a C2 candidate (a division, a
rounding, six more loads) costing 3-4 C candidates; four interleaved argmin lanes for long
ranges, 0.86x.

The two closed-form passes (:func:`mid_level_pass`, :func:`last_pair_pass`) and the last pass's
first minimum (:func:`first_min`) are functions of their own, branch-free and with no state from
one element to the next, so that the compiled search runs them 8 elements at a time:
``_nb_search`` overloads them with vector steps written in LLVM IR (LLVM leaves the plain loops
scalar: it cannot bound the gathered y[m], P[m], Q[m] against the stores) and an integer-key
reduction. A gather is 8 scalar loads, or, where the 8 middle levels lie within 16 (97% of the
steps on Gaussian buckets: m grows slowly with j), two loads and a two-register permute;
``llvm.masked.gather`` (vgatherqpd, microcoded on AMD Zen 4) was ~1.35x slower a pass. P_{m+1}
and Q_{m+1} are P_m + y_m and Q_m + y_m^2, as the scan rounded them: three gathers, not five.
Tried and dropped: the passes as plain loops with the divisor made safe by a select (still scalar,
and 0.88x: the extra select); scoped no-alias metadata on the gathered loads (LLVM still wanted
run-time checks for the contiguous ones).

:func:`exact_level_indices` is plain Python over NumPy arrays, written so that numba compiles
the same source (``hvd_gradq.kernels._nb_search.orq_exact``): no allocation (the caller passes
the scratch, see :func:`scratch`), no helper calls but the three passes above (compiled as their
vector versions), deterministic (ties keep the smaller index, a fixed visiting order, no
threads), IEEE float64 operations in a fixed order and no fast-math, so the compiled function
and this one return the same indices
(``tests/unit/test_orq.py::test_compiled_search_is_the_python_search``, and
``test_vector_passes_are_the_python_passes`` for the passes alone, every width from 1 to 40).
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


def scratch(w: int, s: int) -> tuple[NDArray[Any], ...]:
    """Work arrays for :func:`exact_level_indices` on buckets of up to ``w`` points, ``s`` levels:
    (y, p1, p2, hh, fa, fb, gg, arg). Allocate once per call, reuse for every bucket."""
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
    )


def mid_level_pass(y: Any, p1: Any, p2: Any, f0: Any, a0: Any, j0: int, j1: int) -> None:
    """Layer 2 for j0 <= j < j1: f0[j] = F_2(j) = C2(0, j) = C(0, m) + C(m, j), a0[j] = m =
    ceil(j - T_j / y_j) clamped to 0..j (T_j = P1_{j+1}: y_0 = 0), 0 where y_j = 0.

    Branch-free (a zero y_j divides by 1 and takes m = 0), with no state from one j to the next:
    the compiled version (``_nb_search``) runs 8 j at a time in vector registers, the same
    operations lane by lane. P_{m+1} and Q_{m+1} are P_m + y_m and Q_m + y_m^2, exactly as the
    scan rounded them: three gathers, not five."""
    for j in range(j0, j1):
        yj = y[j]
        pos = yj > 0.0
        m = int(np.ceil(np.float64(j) - p1[j + 1] / (yj if pos else 1.0)))
        m = min(max(m, 0), j) if pos else 0
        ym = y[m]
        pm = p1[m]
        qm = p2[m]
        f0[j] = (ym * (pm + ym) - (qm + ym * ym)) + (
            (ym + yj) * (p1[j + 1] - pm) - (p2[j + 1] - qm) - np.float64(j - m + 1) * ym * yj)
        a0[j] = m


def last_pair_pass(y: Any, p1: Any, p2: Any, f0: Any, gg: Any, am: Any, w: int, i0: int, i1: int) -> None:
    """The last two levels' candidates for i0 <= i < i1: gg[i] = F_{s-3}(i) + C2(i, w-1) (f0 the
    layer F_{s-3}) and am[i] its closed-form middle level, ceil(w-1 - T / (y_{w-1} - y_i))
    clamped to i..w-1 (i where the span is 0). Branch-free and independent per i, like
    :func:`mid_level_pass`; the caller takes the first minimum."""
    yj = y[w - 1]
    pw1 = p1[w]
    pw2 = p2[w]
    for i in range(i0, i1):
        yi = y[i]
        span = yj - yi
        pos = span > 0.0
        tt = (pw1 - p1[i]) - np.float64(w - i) * yi
        m = int(np.ceil(np.float64(w - 1) - tt / (span if pos else 1.0)))
        m = min(max(m, i), w - 1) if pos else i
        ym = y[m]
        pm = p1[m]
        qm = p2[m]
        gg[i] = f0[i] + (
            (yi + ym) * ((pm + ym) - p1[i]) - ((qm + ym * ym) - p2[i]) - np.float64(m - i + 1) * yi * ym) + (
            (ym + yj) * (pw1 - pm) - (pw2 - qm) - np.float64(w - m) * ym * yj)
        am[i] = m


def first_min(v: Any, i0: int, i1: int) -> int:
    """The first i in i0 .. i1-1 holding the smallest v[i] (ties keep the smaller index; a NaN
    never wins), -1 where none is below +inf. The compiled version (``_nb_search``) finds the
    minimum as a vector reduction over integer keys, then its first index."""
    best = np.inf
    bi = -1
    for i in range(i0, i1):
        x = v[i]
        if x < best:
            best = x
            bi = i
    return bi


def exact_level_indices(ys: Any, s: int, idx: Any, y: Any, p1: Any, p2: Any, hh: Any, fa: Any, fb: Any,
                        gg: Any, arg: Any) -> None:
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
        # points shifted to start at 0 (keeps the cancellation small), prefix sums of y, y^2:
        # the shift a vector loop, the scan only the two running sums (latency bound)
        y0 = row[0]
        for k in range(w):
            y[k] = row[k] - y0
        a1 = 0.0
        a2 = 0.0
        for k in range(w):
            v = y[k]
            p1[k] = a1
            p2[k] = a2
            a1 += v
            a2 += v * v
        p1[w] = a1
        p2[w] = a2
        if s == 4 or s > 5:  # H_i for the candidates of the divide and conquer and of s = 4
            for k in range(w):
                hh[k] = np.float64(k) * y[k] - p1[k]
        pw = 1
        while pw < w:
            pw <<= 1
        out[0] = 0
        out[s - 1] = w - 1
        if s == 2:
            continue
        if s == 3:  # C2(0, w-1): the middle level's closed form (see the module docstring)
            m = 0
            yj = y[w - 1]
            if yj > 0.0:
                m = min(max(int(np.ceil(np.float64(w - 1) - a1 / yj)), 0), w - 1)
            out[1] = m
            continue
        # layer 2: F_2(j) = C2(0, j) = C(0, m) + C(m, j), m = ceil(j - T_j / y_j) in 0..j,
        # T_j = P1_{j+1} (y_0 = 0); m is also layer 2's argmin, level 1
        f0 = fa
        f1 = fb
        a0 = arg[0]
        mid_level_pass(y, p1, p2, f0, a0, 0, w)
        # layers 3 .. s-3: divide and conquer over j with monotone argmin
        for t in range(3, s - 2):
            for i in range(w):
                gg[i] = f0[i] + p2[i] - y[i] * p1[i]
            at = arg[t - 2]
            # j by strides: j + 1 an odd multiple of h, h = pw .. 1, so both neighbours j - h
            # and j + h (multiples of 2h) are done first and bound opt_t(j) from either side
            h = pw
            while h >= 1:
                for j in range(h - 1, w, 2 * h):
                    ilo = at[j - h] if j >= h else 0
                    top = min(at[j + h], j) if j + h < w else j
                    # and opt_t(j) >= opt_{t-1}(j) (a last segment only shortens as segments are
                    # added: the quadrangle inequality again)
                    lo = min(max(ilo, arg[t - 3, j]), top)
                    ym = y[j]
                    b1 = p1[j + 1]
                    k1 = b1 - np.float64(j + 1) * ym
                    if top - lo < 4:
                        # short ranges (most of the finest strides): four candidates, the
                        # last repeated past top (a repeat never wins a tie), no data branch
                        i1 = min(lo + 1, top)
                        i2 = min(lo + 2, top)
                        i3 = min(lo + 3, top)
                        v0 = gg[lo] + y[lo] * k1 + ym * hh[lo]
                        v1 = gg[i1] + y[i1] * k1 + ym * hh[i1]
                        v2 = gg[i2] + y[i2] * k1 + ym * hh[i2]
                        v3 = gg[i3] + y[i3] * k1 + ym * hh[i3]
                        c = v1 < v0
                        best = v1 if c else v0
                        bi = i1 if c else lo
                        c = v2 < best
                        best = v2 if c else best
                        bi = i2 if c else bi
                        c = v3 < best
                        best = v3 if c else best
                        bi = i3 if c else bi
                    else:
                        best = np.inf
                        bi = lo
                        for i in range(lo, top + 1):
                            v = gg[i] + y[i] * k1 + ym * hh[i]
                            if v < best:  # ties keep the smaller index
                                best = v
                                bi = i
                    f1[j] = best + (ym * b1 - p2[j + 1])
                    at[j] = bi
                h >>= 1
            f0, f1 = f1, f0
        # the last layer at j = w-1 only, then back along the stored argmins
        if s == 4:  # F_2(i) + C(i, w-1); level 2 at i (its floor: layer 2's argmin at w-1)
            ym = y[w - 1]
            k1 = p1[w] - np.float64(w) * ym
            lo = arg[0, w - 1]
            best = np.inf
            bi = lo
            for i in range(lo, w):
                v = (f0[i] + p2[i] - y[i] * p1[i]) + y[i] * k1 + ym * hh[i]
                if v < best:
                    best = v
                    bi = i
            out[2] = bi
        else:  # F_{s-3}(i) + C2(i, w-1): level s-3 at i, level s-2 at its closed-form middle
            # the candidates first (a vector loop: divisions, gathers), into gg and the unused
            # argmin row arg[s-4], then the first minimum (ties keep the smaller index)
            am = arg[s - 4]
            last_pair_pass(y, p1, p2, f0, gg, am, w, 0, w)
            bi = first_min(gg, 0, w)
            out[s - 3] = bi if bi >= 0 else 0
            out[s - 2] = am[bi] if bi >= 0 else w - 1
        for t in range(s - 3 if s > 4 else 2, 1, -1):
            out[t - 1] = arg[t - 2, out[t]]
