"""Uniform quantization (INT8, INT4, ...) on each bucket's [min, max] with 2**bits evenly spaced
levels. ``rounding=nearest`` (default) is deterministic and biased, its error at most step/2;
``rounding=stochastic`` rounds up with probability the fraction of the step, so it is unbiased
with a variance of at most step^2/4 an element and needs no sort and no table: the scatter
pattern's second phase (:func:`hvd_gradq.plan.second_phase.reduced_scheme`)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import SpecError
from ..xp import Array, Ops
from .level import EvenLevelScheme
from .options import Rounding, param
from .registry import register


@register("uniform", export="Uniform", doc="Deterministic uniform quantization, 2^bits levels a bucket.",
          speed="bits", calibrate=[f"uniform:bits={b}" for b in (2, 4, 8)])
@dataclass(frozen=True, kw_only=True)
class Uniform(EvenLevelScheme):
    """``uniform:bits=8``: 2**bits levels from the bucket's min to its max, nearest rounding
    (``rounding=stochastic``: unbiased)."""

    bits: int = param(8, int, "bits an element, 1..8")
    rounding: Rounding = param(Rounding.NEAREST, Rounding, "nearest (biased) | stochastic (unbiased)")
    meta_width: ClassVar[int] = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.bits <= 8:
            raise SpecError(f"uniform: bits={self.bits} is not valid; valid: 1 .. 8")

    @property
    def symbols(self) -> int:
        return 1 << self.bits

    @property
    def unbiased(self) -> bool:
        return self.rounding is Rounding.STOCHASTIC and self.clip == 0

    @property
    def draws(self) -> bool:
        return self.rounding is Rounding.STOCHASTIC

    def refined(self, factor: float) -> Uniform:
        return dataclasses.replace(self, bits=min(8, self.bits + math.ceil(math.log2(max(factor, 1.0)) - 1e-9)))

    def choose(self, ops: Ops, x: Array) -> Array:
        return ops.concat([ops.amin(x, 1), ops.amax(x, 1)], 1)

    def affine(self, ops: Ops, meta: Array) -> tuple[Array, Array]:
        lo, hi = meta[:, 0:1], meta[:, 1:2]
        return lo, (hi - lo) * np.float32(1.0 / (self.symbols - 1))

    def shared_stats(self, ops: Ops, x: Array) -> Array:
        return ops.concat([-ops.amin(x, 1), ops.amax(x, 1)], 1)

    def meta_from_stats(self, ops: Ops, stats: Array) -> Array:
        return ops.concat([-stats[:, 0:1], stats[:, 1:2]], 1)
