"""Scaled sign (signSGD, Bernstein et al. 2018; EF-signSGD, Karimireddy et al. 2019 with
``ef=true``): one bit an element and one scale a bucket, the mean |x| (= ||p||_1/d), so the
decoded bucket keeps the L1 mass. Zero maps to +scale."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..xp import Array, Ops, tree_sum
from .level import RANGE_LIMIT, LevelScheme, pow2_at_least
from .registry import register


@register("sign", export="Sign", doc="Scaled sign (EF-signSGD with ``ef=True``).")
@dataclass(frozen=True, kw_only=True)
class Sign(LevelScheme):
    @property
    def symbols(self) -> int:
        return 2

    @property
    def limit(self) -> float:
        # the scale is a sum of |x| over the bucket: below 2**127 when every |x| < 2**127 / w
        return min(super().limit, RANGE_LIMIT / pow2_at_least(self.bucket))

    def choose(self, ops: Ops, x: Array) -> Array:
        return tree_sum(ops, ops.abs(x)) * np.float32(1.0 / ops.shape(x)[1])

    def table(self, ops: Ops, meta: Array) -> Array:
        return ops.concat([-meta, meta], 1)

    def locate(self, ops: Ops, x: Array, table: Array) -> Array:
        return ops.zeros(ops.shape(x), "int64")

    def assign(self, ops: Ops, x: Array, table: Array, u: Array | None) -> Array:
        return ops.i64(x >= 0.0)
