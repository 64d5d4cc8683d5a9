"""ORQ (Xu, Huo, Huang, arXiv 2002.11082, 2020): unbiased multi-level quantization whose
``levels`` l_0 < ... < l_{s-1} are chosen per bucket to minimise the variance of stochastic
rounding, sum_x (l_{j+1}-x)(x-l_j), with l_0 = min and l_{s-1} = max of the bucket.

This is the adaptive stochastic quantization (ASQ) problem, and the levels are its exact
optimum for every ``levels`` the scheme accepts:

* s = 2: min and max (nothing to choose);
* s = 3: one level c between fixed neighbours a < b; the variance is convex and piecewise linear
  in c, so its exact minimiser is the data point y_ceil(n-S), S = sum (y-a)/(b-a)
  (:func:`best_level`), in-graph in every namespace (and, unsorted, in the fused kernel);
* s >= 4: the exact dynamic program over data points, O(w) a bucket after the sort for s = 4, 5
  and O((s-5) w log w) beyond (monotone argmin, two layers by the closed form above),
  :mod:`hvd_gradq.kernels.orq_levels`, installed in :mod:`.searches`: one host
  implementation (compiled by numba) that every namespace calls through ``Ops.host``, so NumPy,
  torch, TensorFlow and the fused numba encoder choose the same levels; a namespace may offer
  its own search (``orq_levels``): torch does for s = 4, 5 (:mod:`hvd_gradq.torch.device_levels`,
  tensor ops over all buckets, the same indices), so a CUDA gradient stays on its device.

``tests/unit/test_orq.py`` checks every s against an independent O(s w^2) program.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from ..errors import SpecError
from ..xp import Array, Ops, count_true, scan_sum
from . import searches
from .level import LevelScheme
from .options import param
from .registry import register


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


def choose_levels(ops: Ops, x: Array, s: int) -> Array:
    """ORQ's ``s`` levels (rows, s), float32, at the exact optimum, for buckets ``x`` (rows, w)
    float32 (see the module docstring for how each s is solved)."""
    if s >= 4:
        # a namespace may search on its own device (torch: s = 4, 5, hvd_gradq.torch.device_levels,
        # the same bits); None, or no such hook, means the host search
        on_device = getattr(ops, "orq_levels", None)
        got = on_device(x, s) if on_device is not None else None
        if got is not None:
            return got
        levels = searches.search(searches.ORQ)  # the kernels' exact program (searches.py: why a slot)
        rows, w = ops.shape(x)
        return ops.host(lambda v: levels(v, s), ops.f32(x), (rows, s))
    ys = ops.sort(ops.f64(x), 1)
    rows, w = ops.shape(ys)
    lo, hi = ys[:, 0:1], ys[:, w - 1 : w]
    if s == 2:
        return ops.f32(ops.concat([lo, hi], 1))
    pre = ops.concat([ops.zeros((rows, 1), "float64"), scan_sum(ops, ys)], 1)
    return ops.f32(ops.concat([lo, best_level(ops, ys, pre, lo, hi), hi], 1))


@register("orq", export="ORQ",
          doc="ORQ (Xu et al. 2020): levels at the exact minimum of the rounding variance; the default "
              "ORQ-5 kept fp32's accuracy in results/quality/quality.md.",
          speed="levels", calibrate=[f"orq:levels={s}" for s in (2, 3, 4, 5, 6, 9, 17, 33, 65)])
@dataclass(frozen=True, kw_only=True)
class ORQ(LevelScheme):
    """``orq:levels=5``: ORQ-s, unbiased, levels chosen per bucket to minimise variance."""

    unbiased_rounding: ClassVar[bool] = True
    stochastic: ClassVar[bool] = True
    levels: int = param(5, int, "number of levels s >= 2 (ORQ-3/5/9 in the paper)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 2 <= self.levels <= 256:
            raise SpecError(f"orq: levels={self.levels} is not valid; valid: 2 .. 256")

    @property
    def symbols(self) -> int:
        return self.levels

    def refined(self, factor: float) -> ORQ:
        return dataclasses.replace(self, levels=min(256, math.ceil((self.levels - 1) * factor - 1e-9) + 1))

    @property
    def meta_width(self) -> int:  # type: ignore[override]
        return self.levels

    def choose(self, ops: Ops, x: Array) -> Array:
        return choose_levels(ops, x, self.levels)

    def table(self, ops: Ops, meta: Array) -> Array:
        return meta
