"""BinGrad (Xu, Huo, Huang, "Optimal Gradient Quantization Condition for Communication-Efficient
Distributed Training", arXiv 2002.11082, 2020): binary quantization with two levels per bucket
chosen from the bucket's own distribution, 1 bit an element.

* ``variant=b`` (biased, minimum error): the levels and the split minimise sum (Q(x)-x)^2
  exactly. That is the 1-D 2-means problem, solved exactly: sort the bucket, and with prefix sums
  P choose the split k maximising P_k^2/k + (P_d-P_k)^2/(d-k); the levels are the two parts'
  means and each element goes to the nearer one. (Lloyd iterations get stuck on heavy tails.)
  The decoded bucket keeps the bucket's sum exactly, but each element is biased towards its
  level: E[Q(x)] - x = level - x.

* ``variant=pb`` (partially biased; our definition of the paper's "reduces bias with a wider
  range"): levels l1 <= l2 with *stochastic* rounding between them, so elements inside
  [l1, l2] are unbiased, and elements outside are clamped to the nearer level (biased). The levels
  minimise the expected squared error
      sum_{x<l1} (l1-x)^2 + sum_{l1<=x<=l2} (l2-x)(x-l1) + sum_{x>l2} (x-l2)^2,
  found exactly (:mod:`hvd_gradq.kernels.bingrad_pb`): F is one quadratic on each box of
  consecutive data points, convex in each level with the other fixed but not jointly convex (the
  alternating minimisation used before stopped in local minima, up to 5% above the minimum on
  buckets of 16), and the best l1 for a given l2 is non-decreasing in l2, so the minimum over the
  O(w) boxes along that staircase is the global one, O(w) after the sort, run on the host
  through ``Ops.host`` by every frontend (``tests/unit/test_bingrad.py`` checks it against a
  brute force over every box). ``bench/quality/bingrad_study.py`` (buckets of 512, measured with the
  alternating optimiser): the mean |bias| is 35-40% below -b's but its L2 norm only 5-7% below
  (9% above on Student-t(2)), the error is 17-35% above, and the bucket's sum is no longer
  exact. The range comes out *narrower* than -b's (0.81x Gaussian, 0.78x Laplace, 0.35x Student-t(2)), not wider as the
  review describes: minimising this error cannot widen it (for a Gaussian the optimum [-a, a] has
  a P(|x|<a) = E(|x|-a)+, a ~ 0.67 against -b's 0.80); a wider range needs an objective that
  weighs the clamp error above the variance.
  With l1 = min and l2 = max it would be unbiased binary stochastic rounding (ORQ with 2 levels).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..xp import Array, Ops, first_argmax, scan_sum
from . import searches
from .level import LevelScheme
from .options import param
from .registry import register


class Variant(enum.Enum):
    B = "b"
    PB = "pb"


def two_means(ops: Ops, ys: Array, pre: Array) -> tuple[Array, Array]:
    """Exact 1-D 2-means of sorted rows ``ys`` (rows, w) with prefix sums ``pre`` (rows, w+1),
    float64. Returns the two means, float64 (rows, 1) each."""
    rows, w = ops.shape(ys)
    if w == 1:
        return ys, ys
    total = pre[:, w : w + 1]
    k = ops.f64(ops.reshape(ops.arange(w - 1) + 1, (1, w - 1)))
    pk = pre[:, 1:w]
    score = pk * pk / k + (total - pk) * (total - pk) / (np.float64(w) - k)
    j = first_argmax(ops, score)  # split after element j+1
    kk = ops.f64(j + 1)
    pj = ops.take_along(pk, j)
    return pj / kk, (total - pj) / (np.float64(w) - kk)


@register("bingrad", export="BinGrad",
          doc="BinGrad (Xu et al. 2020): error feedback is on by default (it is biased; ``ef=False`` is the "
              "paper's plain form). results/quality/quality.md.",
          speed="variant", calibrate=["bingrad", "bingrad:variant=pb"])
@dataclass(frozen=True, kw_only=True)
class BinGrad(LevelScheme):
    variant: Variant = param(Variant.B, Variant, "b (minimum error) | pb (partially biased, wider)")
    # On by default, unlike every other scheme's: -b is biased, and without error feedback its bias
    # accumulates (the quality study, results/quality/quality.md: momentum SGD on MNIST-1D, 4 workers, 5
    # seeds, each at its best rate: -6.1 points vs fp32 without, -0.5 with). ``ef=false`` is the
    # paper's plain BinGrad. A policy default (hvd_gradq.policy): it never reaches the wire.
    default_ef: ClassVar[bool] = True
    meta_width: ClassVar[int] = 2

    @property
    def symbols(self) -> int:
        return 2

    def choose(self, ops: Ops, x: Array) -> Array:
        if self.variant is Variant.PB:  # the exact minimiser, on the host (see the module docstring)
            pb_levels = searches.search(searches.BINGRAD_PB)  # the kernels' exact search (searches.py)
            rows, w = ops.shape(x)
            return ops.host(pb_levels, ops.f32(x), (rows, 2))
        ys = ops.sort(ops.f64(x), 1)
        rows, w = ops.shape(ys)
        pre = ops.concat([ops.zeros((rows, 1), "float64"), scan_sum(ops, ys)], 1)
        l1, l2 = two_means(ops, ys, pre)
        return ops.f32(ops.concat([l1, l2], 1))

    def table(self, ops: Ops, meta: Array) -> Array:
        return meta

    def locate(self, ops: Ops, x: Array, table: Array) -> Array:
        return ops.zeros(ops.shape(x), "int64")

    @property
    def draws(self) -> bool:
        return self.variant is Variant.PB
