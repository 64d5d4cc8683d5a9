"""TernGrad (Wen et al., NeurIPS 2017): each element becomes s*sign(g)*Bernoulli(|g|/s), with
s = max|g| of the bucket after clipping at ``clip`` standard deviations (2.5 by default, as in
the paper).

Bias: the rounding is unbiased for the *clipped* gradient, so ``terngrad:clip=0`` is unbiased
(``scheme.unbiased`` is True), but the default ``clip=2.5`` is **biased**: every element beyond
mean +- 2.5 std is pulled to that bound in expectation (``scheme.unbiased`` is False). The paper
accepts that bias for a much smaller s and variance."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..xp import Array, Ops
from .level import EvenLevelScheme
from .options import param
from .registry import register


@register("terngrad", export="TernGrad", doc="TernGrad (Wen et al. 2017): {-s, 0, s} with Bernoulli draws.")
@dataclass(frozen=True, kw_only=True)
class TernGrad(EvenLevelScheme):
    unbiased_rounding: ClassVar[bool] = True
    stochastic: ClassVar[bool] = True
    clip: float = param(2.5, float, "clip at mean +- clip*std before s is taken (0: off)")

    @property
    def symbols(self) -> int:
        return 3

    def choose(self, ops: Ops, x: Array) -> Array:
        return ops.amax(ops.abs(x), 1)

    def affine(self, ops: Ops, meta: Array) -> tuple[Array, Array]:
        return -meta, meta

    def shared_stats(self, ops: Ops, x: Array) -> Array:
        return self.choose(ops, x)

    def meta_from_stats(self, ops: Ops, stats: Array) -> Array:
        return stats
