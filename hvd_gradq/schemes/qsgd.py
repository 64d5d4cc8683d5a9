"""QSGD (Alistarh et al., NeurIPS 2017): unbiased stochastic rounding of each element onto
``levels`` evenly spaced magnitudes of the bucket's norm, with its sign: 2*levels+1 symbols.

``norm=max`` (default) scales by max|x| of the bucket, the variant practitioners use;
``norm=l2`` is the paper's ||v||_2, whose grid is much coarser: the exact rounding variance
sum (l_j+1 - x)(x - l_j), over ||x||^2, measured on 2000 standard Gaussian buckets of 512, is
17.1 against 1.59 with ``max`` at levels=1 (11x), 8.0 against 0.44 at levels=2 (18x), 3.5
against 0.11 at levels=4 (32x)."""
from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import SpecError
from ..xp import Array, Ops, tree_sum
from .level import SQUARE_LIMIT, EvenLevelScheme, sqrt_pow2_at_least
from .options import param
from .registry import register


class Norm(enum.Enum):
    MAX = "max"
    L2 = "l2"


@register("qsgd", export="QSGD",
          doc="QSGD (Alistarh et al. 2017): unbiased stochastic rounding onto evenly spaced levels.",
          speed="levels", calibrate=[f"qsgd:levels={q}" for q in (1, 4, 16, 64)])
@dataclass(frozen=True, kw_only=True)
class QSGD(EvenLevelScheme):
    unbiased_rounding: ClassVar[bool] = True
    stochastic: ClassVar[bool] = True
    levels: int = param(4, int, "magnitude levels q (2q+1 symbols), >= 1")
    norm: Norm = param(Norm.MAX, Norm, "max | l2")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.levels <= 1 << 15:
            raise SpecError(f"qsgd: levels={self.levels} is not valid; valid: 1 .. 32768")

    @property
    def symbols(self) -> int:
        return 2 * self.levels + 1

    def refined(self, factor: float) -> QSGD:
        return dataclasses.replace(self, levels=min(1 << 15, math.ceil(self.levels * factor - 1e-9)))

    @property
    def limit(self) -> float:
        if self.norm is Norm.L2:  # a sum of squares
            return min(super().limit, SQUARE_LIMIT / sqrt_pow2_at_least(self.bucket))
        return super().limit

    def choose(self, ops: Ops, x: Array) -> Array:
        if self.norm is Norm.MAX:
            return ops.amax(ops.abs(x), 1)
        return ops.sqrt(tree_sum(ops, x * x))

    def affine(self, ops: Ops, meta: Array) -> tuple[Array, Array]:
        step = meta * np.float32(1.0 / self.levels)
        return -meta, step

    def shared_stats(self, ops: Ops, x: Array) -> Array:
        return self.choose(ops, x)

    def meta_from_stats(self, ops: Ops, stats: Array) -> Array:
        return stats
