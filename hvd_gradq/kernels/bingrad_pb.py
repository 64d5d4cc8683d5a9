"""BinGrad-pb's two levels at the exact minimum of its objective: the one implementation.

For a sorted bucket y_0 <= ... <= y_{w-1}, -pb (see :mod:`hvd_gradq.schemes.bingrad`) minimises

    F(l1, l2) = sum_{x<l1} (l1-x)^2 + sum_{l1<=x<=l2} (l2-x)(x-l1) + sum_{x>l2} (x-l2)^2

over l1 <= l2 (any reals). F is continuous; it is not jointly convex (the quadratic form
n_A l1^2 - n_B l1 l2 + n_C l2^2 of a piece is indefinite when n_B^2 > 4 n_A n_C), so
alternating minimisation stops in local minima. What makes the exact minimum cheap:

* the minimum lies in [y_0, y_{w-1}]^2 (below y_0, dF/dl1 <= 0; above y_{w-1}, dF/dl2 >= 0);
* on a box (l1 in [y_a, y_{a+1}], l2 in [y_b, y_{b+1}], a <= b) the sets below l1, between and
  above l2 are fixed, so F is one quadratic there, and its minimum over the box is at the
  stationary point (when positive definite and inside) or on an edge, where F is a convex
  quadratic in the free level (coefficient n_A >= 1 or n_C >= 0): a clamped vertex. O(1) a box
  from prefix sums of y and y^2;
* for fixed l2, F is convex in l1, and its minimiser l1*(l2) is non-decreasing in l2
  (dF/dl1 = 2 sum_{x<l1} (l1-x) - sum_{l1<=x<=l2} (l2-x) falls as l2 rises). So the boxes that
  hold the curve (l1*(l2), l2) form a staircase: for l2's interval b (a strip), only l1's
  intervals from a*(y_b) to a*(y_{b+1}) (a monotone pointer over the sorted points), O(w) boxes
  in all. The minimum over them is min_{l2} min_{l1} F: exact;
* F is C^1 (every term's derivative vanishes where a point changes sets), so along the curve
  the minimum is a stationary point of a box's quadratic, or the vertex of an edge where the
  curve runs along a kink l1 = y_{a+1} or meets a strip's side l2 = y_b: per box the l1 = u1
  and l2 = v0 edges and the stationary point (u0 too on a strip's first box, v1 on the last
  strip). An edge shared by two boxes is one function of one level, so its other copy adds
  nothing; the edges also catch a stationary point that rounding puts a hair outside its box;
* every point above a strip is clamped to l2 <= y_{b+1}, so F >= sum_{k>b} (y_k - y_{b+1})^2 on
  strip b, a bound that only grows as b falls: the strips run from the top down (where the
  minimum usually is: l2 near the 75th percentile for a Gaussian) and stop at the first whose
  bound exceeds the best value found, with the pointer walked down alongside them. About half
  the strips are visited, ~4 candidates each (the search was 5 boxes x 5 candidates a strip,
  every strip: ~5x slower, measured on Gaussian buckets of 512).

A pointer test or the bound whose sign rounding flips (|value| within a few ulp of w·range^2)
moves the search by a sliver next to a kink, where dF/dl1 ~ 0: the value missed differs from
the one found by a second-order amount, far below the tests' tolerance (see test_bingrad.py).

Measured (one thread, Gaussian buckets of 512, search only, AMD EPYC): ~25 ns an element. A row
visits ~242 strips and ~440 boxes, ~1570 candidates (~1130 with l1 <= l2), ~6 float64 divisions
and ~100 other operations a box, all scalar: the time is the floating-point work itself (without
the boxes, scan, pointer walk and bounds take ~1.6 ns an element). Tried and dropped, the same
bits each: the candidates branch-free (selects for the skips, safe divisors), 0.95x; and with
each box's first minimum taken before one comparison with the best, so that the chain from box
to box is one compare and select, 0.90x. What would help: the boxes of a run of strips listed
first (the pointer walk), then evaluated 8 boxes to a vector step (lanes independent, the same
operations a lane: LLVM IR as :mod:`._nb_lanes` does for ORQ, since a loop over that many arrays
exceeds LLVM's run-time alias checks), then merged in order with the strips' bounds.

So O(w) after the sort. :func:`pb_levels_sorted` is plain Python over NumPy arrays, compiled
as it is by numba (``hvd_gradq.kernels._numba.bingrad_pb``), like :mod:`.orq_levels`: one body,
no allocation, ties keep the first candidate in a fixed order, same bits compiled or not.
``tests/unit/test_bingrad.py`` checks it against a brute force over every box.
Dispatch (compiled or not) is :func:`hvd_gradq.kernels.search.pb_levels`; this module holds only
the source, so that the compiled modules can import it and nothing here imports them back.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray


def scratch(w: int) -> tuple[NDArray[Any], ...]:
    """Work arrays for :func:`pb_levels_sorted` on buckets of up to ``w`` points: (y, p, q)."""
    w = max(w, 1)
    return (np.empty(w, np.float64), np.empty(w + 1, np.float64), np.empty(w + 1, np.float64))


def pb_levels_sorted(ys: Any, out: Any, y: Any, p: Any, q: Any) -> None:
    """out[r] = (l1, l2), float64, the exact minimiser of F for each sorted float64 row ys[r].
    Scratch from :func:`scratch`. Numba-compilable as it is."""
    rows = ys.shape[0]
    w = ys.shape[1]
    for r in range(rows):
        row = ys[r]
        y0 = row[0]
        if w == 1 or row[w - 1] == y0:
            out[r, 0] = y0
            out[r, 1] = y0
            continue
        # points shifted to start at 0 (smaller cancellation), prefix sums of y and y^2
        p[0] = 0.0
        q[0] = 0.0
        a1 = 0.0
        a2 = 0.0
        for k in range(w):
            v = row[k] - y0
            y[k] = v
            a1 += v
            a2 += v * v
            p[k + 1] = a1
            q[k + 1] = a2
        best = np.inf
        b1 = 0.0
        b2 = y[w - 1]
        tot1 = p[w]
        tot2 = q[w]
        last = w - 2
        # strip b's boxes run from a*(y_b) to a*(y_{b+1}), a*(y_k) the first a < k whose left
        # derivative at y_{a+1}, 2 ((a+1) y_{a+1} - P_{a+1}) - ((k-a) y_k - (P_{k+1} - P_{a+1})),
        # is >= 0, else k: non-increasing as k falls, so one pointer walks down with the strips
        ahi = w - 1
        yk = y[w - 1]
        while ahi > 0:
            a = ahi - 1
            d = 2.0 * (np.float64(a + 1) * y[a + 1] - p[a + 1]) - (np.float64(w - 1 - a) * yk - (p[w] - p[a + 1]))
            if d < 0.0:
                break
            ahi = a
        for b in range(w - 2, -1, -1):
            v0 = y[b]
            v1 = y[b + 1]
            nc = np.float64(w - 1 - b)
            pb1 = p[b + 1]
            qb1 = q[b + 1]
            sc = tot1 - pb1
            qc = tot2 - qb1
            # every point above the strip is clamped to l2 <= v1: F >= sum_{k>b} (y_k - v1)^2,
            # which only grows as b falls
            if (qc - 2.0 * v1 * sc) + nc * v1 * v1 > best:
                break
            alo = min(ahi, b)
            while alo > 0:
                a = alo - 1
                d = 2.0 * (np.float64(a + 1) * y[a + 1] - p[a + 1]) - (np.float64(b - a) * v0 - (pb1 - p[a + 1]))
                if d < 0.0:
                    break
                alo = a
            top = min(ahi, b)
            for a in range(alo, top + 1):
                u0 = y[a]
                u1 = y[a + 1] if a < b else v1
                na = np.float64(a + 1)
                sa = p[a + 1]
                qa = q[a + 1]
                nb = np.float64(b - a)
                sb = pb1 - sa
                qb = qb1 - qa
                # candidates 0..4: the l1 = u0 edge (a strip's first box only), the l1 = u1
                # edge, the l2 = v0 edge, the stationary point, the l2 = v1 edge (last strip)
                c0 = 0 if a == alo else 1
                c1 = 4 if b == last else 3
                for c in range(c0, c1 + 1):
                    if c < 2:  # l1 fixed at u0 / u1, l2 free
                        l1 = u0 if c == 0 else u1
                        if nc > 0.0:
                            l2 = (2.0 * sc + nb * l1 - sb) / (2.0 * nc)
                        else:
                            l2 = v0 if sb - nb * l1 >= 0.0 else v1
                        l2 = min(max(l2, v0), v1)
                    elif c != 3:  # l2 fixed at v0 / v1, l1 free
                        l2 = v0 if c == 2 else v1
                        l1 = min(max((2.0 * sa + nb * l2 - sb) / (2.0 * na), u0), u1)
                    else:
                        det = 4.0 * na * nc - nb * nb
                        if not det > 0.0:
                            continue
                        r1 = 2.0 * sa - sb
                        r2 = 2.0 * sc - sb
                        l1 = (2.0 * nc * r1 + nb * r2) / det
                        l2 = (2.0 * na * r2 + nb * r1) / det
                        if not (u0 <= l1 <= u1 and v0 <= l2 <= v1):
                            continue
                    if l1 > l2:
                        continue
                    f = (na * l1 * l1 - 2.0 * sa * l1 + qa) + (sb * (l1 + l2) - nb * l1 * l2 - qb) + (
                        nc * l2 * l2 - 2.0 * sc * l2 + qc)
                    if f < best:
                        best = f
                        b1 = l1
                        b2 = l2
            ahi = alo
        out[r, 0] = b1 + y0
        out[r, 1] = b2 + y0
