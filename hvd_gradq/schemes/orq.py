"""ORQ (Xu, Huo, Huang, arXiv 2002.11082, 2020): unbiased multi-level quantization whose
``levels`` l_0 < ... < l_{s-1} are chosen per bucket to minimise the variance of stochastic
rounding, sum_x (l_{j+1}-x)(x-l_j), with l_0 = min and l_{s-1} = max of the bucket.

This is the adaptive stochastic quantization (ASQ) problem; its optimum puts every level on a
data point. For one level c between fixed neighbours a < b holding n sorted points y, the
variance is convex and piecewise linear in c, so its exact minimiser is the data point
y_ceil(n-S), S = sum (y-a)/(b-a) (:func:`best_level`): that solves s = 3 exactly. The paper-style
greedy (bisection, then coordinate-descent sweeps with the same formula, :func:`greedy_levels`)
stops in local minima: up to 8% above the optimum on Gaussian buckets of 128 at s = 9 and 60% on
Student-t(2). So for 4 <= s <= 17 the levels come from dynamic programs over data points
(:func:`dp_levels`: several starts, each exact over ~40 candidate points, then exact over index
windows around its levels; the cheapest start wins), which ``tests/unit/test_orq.py`` checks
against the exact O(s w^2) dynamic program: within 1% (in practice 0.01%) at s = 3, 5, 9.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from ..errors import SpecError
from ..spec import register
from ..xp import Array, Ops, count_true, scan_sum
from .base import LevelScheme, param

SWEEPS = 3


def best_level(ops: Ops, ys: Array, pre: Array, a: Array, b: Array) -> Array:
    """The variance-minimising level between neighbours ``a`` <= ``b`` (rows, 1), float64.

    ``ys`` sorted rows (rows, w), ``pre`` their prefix sums with a leading 0 (rows, w+1).
    """
    i0 = count_true(ops, ys < a)
    i1 = count_true(ops, ys <= b)
    n = ops.f64(i1 - i0)
    span = b - a
    pos = span > 0.0
    t = ops.take_along(pre, i1) - ops.take_along(pre, i0) - n * a
    s = ops.where(pos, t / ops.where(pos, span, ops.zeros((1, 1), "float64") + 1.0), n * 0.0)
    # k = ceil(n - S) in 1..n; the level is the k-th point of the interval
    k = ops.i64(-ops.floor(-(n - s)))
    nn = i1 - i0
    k = ops.minimum(ops.maximum(k, ops.zeros((1, 1), "int64") + 1), ops.maximum(nn, ops.zeros((1, 1), "int64") + 1))
    rows, w = ops.shape(ys)
    idx = ops.minimum(i0 + k - 1, ops.zeros((1, 1), "int64") + (w - 1))
    c = ops.take_along(ys, idx)
    ok = (nn > 0) & pos
    return ops.where(ok, ops.minimum(ops.maximum(c, a), b), a)


def greedy_levels(ops: Ops, x: Array, s: int, sweeps: int = SWEEPS) -> Array:
    """The paper-style greedy: bisection (or rank quantiles) plus coordinate-descent sweeps.

    Cheap, but it stops in local minima: on heavy-tailed buckets it lands up to 60% above the
    optimum at s = 9 (``tests/unit/test_orq.py``). Used by :func:`choose_levels` only for
    s > ``DP_MAX_LEVELS``."""
    ys = ops.sort(ops.f64(x), 1)
    rows, w = ops.shape(ys)
    pre = ops.concat([ops.zeros((rows, 1), "float64"), scan_sum(ops, ys)], 1)
    lo, hi = ys[:, 0:1], ys[:, w - 1 : w]
    r = (s - 1).bit_length() - 1
    if s == 2:
        return ops.concat([lo, hi], 1)
    if (1 << r) + 1 == s:
        levels = [lo, hi]
        for _ in range(r):
            nxt = [levels[0]]
            for a, b in zip(levels[:-1], levels[1:]):
                nxt += [best_level(ops, ys, pre, a, b), b]
            levels = nxt
    else:
        # rank quantiles as a start; the sweeps below do the real work
        levels = [lo]
        for j in range(1, s - 1):
            levels.append(ys[:, (j * (w - 1)) // (s - 1) : (j * (w - 1)) // (s - 1) + 1])
        levels.append(hi)
    for _ in range(sweeps):
        for j in range(1, s - 1):
            levels[j] = best_level(ops, ys, pre, levels[j - 1], levels[j + 1])
    return ops.concat(levels, 1)


# -- near-exact levels: dynamic programs over data points ---------------------------------------
# The optimum puts every level on a data point, so it is a shortest path over sorted points with
# the segment cost sum_{i<=k<=j} (y_j - y_k)(y_k - y_i), O(1) from prefix sums of y and y^2. The
# exact program costs (s-1) w^2 a bucket: used as it is up to w = EXACT_MAX. Wider buckets get
# STARTS starts, each solved exactly over ~40 candidate points (the extremes, a rank grid and a
# value grid, shifted per start) and refined by programs over index windows around its levels
# (each level may move within its window, all of them jointly); the cheapest start wins. Against
# the exact optimum (tests/unit/test_orq.py), Gaussian, Laplace and Student-t(2) buckets of 128
# and 512: within 0.02% at s = 4 .. 9, within 2% at s = 10 .. 17; the greedy was 2-60% above at
# s = 9. Everything is elementwise arithmetic, gathers and row minima, identical in every
# namespace; about 15x the greedy's work (NumPy: ~2 s CPU for 2**20 elements at s = 9;
# hvd_gradq.kernels has a compiled port that picks the same points, ~50 ns an element).
DP_MAX_LEVELS = 17
STARTS = 4
EXTREMES = 4
EACH = 3  # refinements of every start; any further ones refine the winner only
GRID = 16  # rank-grid and value-grid candidates per start
REFINE = (
    (0, 1, -1, 2, -2, 4, -4, 8, -8, 16, -16, 32, -32),
    tuple(range(-8, 8)),
    tuple(range(-8, 8)),
)
CELLS = 1 << 18  # float64 cells of one (rows, K, K) block of a program
EXACT_MAX = 64  # buckets up to this width get the exact program: (s-1) w^2 cells a bucket


class _Sorted:
    """A chunk of sorted buckets shifted to start at 0, with prefix sums of y and y^2, laid side
    by side in one table so that one gather fetches everything a set of points needs."""

    def __init__(self, ops: Ops, ys: Array, copies: int = 1) -> None:
        rows, w = ops.shape(ys)
        y = ys - ys[:, 0:1]  # exact for float32 data; keeps the cost's cancellation small
        z = ops.zeros((rows, 1), "float64")
        p1 = ops.concat([z, scan_sum(ops, y)], 1)
        p2 = ops.concat([z, scan_sum(ops, y * y)], 1)
        table = ops.concat([y, y[:, w - 1 : w], p1, p2], 1)  # (rows, 3(w+1))
        if copies > 1:  # the rows repeated, copy-major: one copy per start of the programs
            table = ops.concat([table] * copies, 0)
        self.ops, self.rows, self.w = ops, rows * copies, w
        self.table = table

    def gather(self, idx: Array) -> tuple[Array, ...]:
        """For points ``idx`` (rows, k): (idx, y, P1, P2 there, P1, P2 just after)."""
        ops, k, v = self.ops, _width(self.ops, idx), self.w + 1
        got = ops.take_along(self.table, ops.concat([idx, idx + v, idx + 2 * v, idx + (v + 1), idx + (2 * v + 1)], 1))
        return (idx,) + tuple(got[:, i * k : (i + 1) * k] for i in range(5))

    def cost(self, a: tuple[Array, ...], b: tuple[Array, ...]) -> Array:
        """Segment costs (rows, kb, ka) from gathered points ``a`` to gathered points ``b``."""
        ops, rows = self.ops, self.rows
        ka, kb = _width(ops, a[0]), _width(ops, b[0])
        ia, ya, a1, a2 = (ops.reshape(t, (rows, 1, ka)) for t in a[:4])
        ib, yb, b1, b2 = (ops.reshape(t, (rows, kb, 1)) for t in (b[0], b[1], b[4], b[5]))
        n = ops.f64(ib - ia + 1)
        s1 = b1 - a1
        return yb * s1 - (b2 - a2) - ya * yb * n + ya * s1


def _width(ops: Ops, idx: Array) -> int:
    return ops.shape(idx)[1]


def _row_argmin(ops: Ops, x: Array) -> tuple[Array, Array]:
    """Minimum and index of its first occurrence over the last axis of (rows, k, m)."""
    rows, k, m = ops.shape(x)
    flat = ops.reshape(x, (rows * k, m))
    low = ops.amin(flat, 1)
    idx = ops.reshape(ops.arange(m), (1, m))
    first = ops.amin(ops.where(flat <= low, idx, ops.zeros((1, 1), "int64") + m), 1)
    return ops.reshape(low, (rows, k)), ops.reshape(first, (rows, k))


def _inf(ops: Ops) -> Array:
    return ops.zeros((1, 1, 1), "float64") + float("inf")


def _coarse(ops: Ops, d: _Sorted, cand: Array, s: int) -> Array:
    """Exact s-level program over sorted candidate indices ``cand`` (rows, K) whose first is 0 and
    last w-1: level indices (rows, s)."""
    rows, k = ops.shape(cand)
    g = d.gather(cand)
    c = d.cost(g, g)
    ii = ops.reshape(ops.arange(k), (1, k, 1))
    jj = ops.reshape(ops.arange(k), (1, 1, k))
    c = ops.where(jj < ii, c, _inf(ops))  # from an earlier candidate only
    first = ops.reshape(ops.arange(k), (1, k)) == 0
    f = ops.where(first, ops.zeros((rows, k), "float64"), ops.zeros((rows, k), "float64") + float("inf"))
    args = []
    for _ in range(s - 1):
        f, a = _row_argmin(ops, ops.reshape(f, (rows, 1, k)) + c)
        args.append(a)
    pos = ops.zeros((rows, 1), "int64") + (k - 1)
    path = [pos]
    for a in reversed(args):
        pos = ops.take_along(a, pos)
        path.append(pos)
    return ops.take_along(cand, ops.concat(path[::-1], 1))


def _refine(ops: Ops, d: _Sorted, p: Array, offsets: tuple[int, ...]) -> tuple[Array, Array]:
    """Exact program with every interior level confined to its index plus ``offsets``: the new
    level indices (rows, s) and their variance (rows, 1). Never worse than ``p`` (offset 0)."""
    rows, s = ops.shape(p)
    lo = ops.zeros((1, 1), "int64")
    hi = lo + (d.w - 1)
    off = ops.reshape(ops.i64(ops.from_numpy(_np_i64(offsets))), (1, len(offsets)))
    cands = [ops.zeros((rows, 1), "int64")]
    for j in range(1, s - 1):
        cands.append(ops.clip(p[:, j : j + 1] + off, lo, hi))
    cands.append(ops.zeros((rows, 1), "int64") + (d.w - 1))
    f = ops.zeros((rows, 1), "float64")
    args = []
    prev = d.gather(cands[0])
    for j in range(1, s):
        ka, kb = ops.shape(cands[j - 1])[1], ops.shape(cands[j])[1]
        cur = d.gather(cands[j])
        c = d.cost(prev, cur)
        ok = ops.reshape(cands[j], (rows, kb, 1)) >= ops.reshape(cands[j - 1], (rows, 1, ka))
        f, a = _row_argmin(ops, ops.where(ok, ops.reshape(f, (rows, 1, ka)) + c, _inf(ops)))
        args.append(a)
        prev = cur
    pos = ops.zeros((rows, 1), "int64")
    path = [cands[s - 1]]
    for j in range(s - 1, 0, -1):
        pos = ops.take_along(args[j - 1], pos)
        path.append(ops.take_along(cands[j - 1], pos))
    return ops.concat(path[::-1], 1), f


def _np_i64(v: tuple[int, ...]) -> NDArray[Any]:
    return np.asarray(v, dtype=np.int64)


def _candidates(ops: Ops, d: _Sorted, phase: float) -> Array:
    """Sorted candidate indices (rows, K): the extremes, a rank grid and a value grid."""
    w, rows = d.w, d.rows
    y = d.table[:, :w]
    fixed = list(range(EXTREMES)) + [w - 1 - e for e in range(EXTREMES)]
    fixed += [round((g + phase) / GRID * (w - 1)) for g in range(GRID)]
    fixed_idx = ops.zeros((rows, 1), "int64") + ops.reshape(
        ops.i64(ops.from_numpy(np.clip(_np_i64(tuple(fixed)), 0, w - 1))), (1, len(fixed))
    )
    frac = ops.from_numpy(((np.arange(GRID) + phase) / GRID).astype(np.float64).reshape(1, GRID, 1))
    span = ops.reshape(y[:, w - 1 : w], (rows, 1, 1))
    below = ops.reshape(y, (rows, 1, w)) < span * frac
    vals = ops.reshape(count_true(ops, ops.reshape(below, (rows * GRID, w))), (rows, GRID))
    vals = ops.minimum(vals, ops.zeros((1, 1), "int64") + (w - 1))
    return ops.sort(ops.concat([fixed_idx, vals], 1), 1)


def dp_levels(ops: Ops, ys: Array, s: int) -> Array:
    """Level indices (rows, s) for sorted buckets ``ys`` (rows, w), float64: the exact program
    over all points when w <= ``EXACT_MAX`` (cheaper there), else the multi-start programs."""
    rows, w = ops.shape(ys)
    if w <= EXACT_MAX:
        k = max(w, s)  # fewer points than levels: the last point repeats (zero-cost segments)
        every = ops.i64(ops.from_numpy(np.minimum(np.arange(k), w - 1).reshape(1, k)))
        return _coarse(ops, _Sorted(ops, ys), ops.zeros((rows, 1), "int64") + every, s)
    one = _Sorted(ops, ys)
    d = _Sorted(ops, ys, STARTS)  # every start's programs run side by side
    cand = ops.concat([_candidates(ops, one, t / STARTS) for t in range(STARTS)], 0)
    p = _coarse(ops, d, cand, s)
    for offsets in REFINE[:EACH]:
        p, v = _refine(ops, d, p, offsets)
    best_p, best_v = p[:rows], v[:rows]
    for t in range(1, STARTS):
        pt, vt = p[t * rows : (t + 1) * rows], v[t * rows : (t + 1) * rows]
        better = vt < best_v  # the cheapest start wins; ties keep the earlier
        best_p = ops.where(better, pt, best_p)
        best_v = ops.where(better, vt, best_v)
    for offsets in REFINE[EACH:]:
        best_p, best_v = _refine(ops, one, best_p, offsets)
    return best_p


def choose_levels(ops: Ops, x: Array, s: int, sweeps: int = SWEEPS) -> Array:
    """ORQ's ``s`` levels (rows, s), float64, for buckets ``x`` (rows, w).

    s = 2: min and max. s = 3: the exact optimum (one convex coordinate). 4 <= s <= 17: the
    multi-start dynamic programs above. Larger s: :func:`greedy_levels`.
    """
    if s > DP_MAX_LEVELS:
        return greedy_levels(ops, x, s, sweeps)
    ys = ops.sort(ops.f64(x), 1)
    rows, w = ops.shape(ys)
    lo, hi = ys[:, 0:1], ys[:, w - 1 : w]
    if s == 2:
        return ops.concat([lo, hi], 1)
    if s == 3:
        pre = ops.concat([ops.zeros((rows, 1), "float64"), scan_sum(ops, ys)], 1)
        return ops.concat([lo, best_level(ops, ys, pre, lo, hi), hi], 1)
    k = max(w, s) if w <= EXACT_MAX else EXTREMES * 2 + GRID * 2
    chunk = max(1, CELLS // (k * k * (1 if w <= EXACT_MAX else STARTS)))
    out = []
    for r0 in range(0, rows, chunk):
        part = ys[r0 : r0 + chunk]
        out.append(ops.take_along(part, dp_levels(ops, part, s)))
    return ops.concat(out, 0) if len(out) > 1 else out[0]


@register("orq")
@dataclass(frozen=True, kw_only=True)
class ORQ(LevelScheme):
    """``orq:levels=5``: ORQ-s, unbiased, levels chosen per bucket to minimise variance."""

    unbiased: ClassVar[bool] = True
    stochastic: ClassVar[bool] = True
    levels: int = param(5, int, "number of levels s >= 2 (ORQ-3/5/9 in the paper)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 2 <= self.levels <= 256:
            raise SpecError(f"orq: levels={self.levels} is not valid; valid: 2 .. 256")

    @property
    def symbols(self) -> int:
        return self.levels

    @property
    def meta_width(self) -> int:  # type: ignore[override]
        return self.levels

    def choose(self, ops: Ops, x: Array) -> Array:
        return ops.f32(choose_levels(ops, x, self.levels))

    def table(self, ops: Ops, meta: Array) -> Array:
        return meta
