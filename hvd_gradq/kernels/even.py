"""Kernels for evenly spaced levels (uniform, qsgd, terngrad) and for sign: registered for their
scheme classes; the compiled loops are in :mod:`._nb_even` and :mod:`._nb_table`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..schemes.qsgd import QSGD, Norm
from ..schemes.sign import Sign
from ..schemes.terngrad import TernGrad
from ..schemes.uniform import Uniform
from ._registry import NO_FED, Fed, Kernel, kernel_for, level_fields


def _nb() -> Any:
    from . import _nb_even  # numba: imported when a kernel first runs

    return _nb_even


def _nb_table() -> Any:
    from . import _nb_table

    return _nb_table


@dataclass(frozen=True)
class EvenKernel(Kernel):
    """amode 0: lo=min, step=(max-min)*cst; 1: lo=-m, step=m*cst. mmode 0: [min, max]; 1: max|x|;
    2: ||x||_2."""

    amode: int = 0
    mmode: int = 0
    cst: np.float32 = np.float32(1.0)

    def encode(self, x: NDArray[Any], n: int, b0: int, b1: int, sa: int, sb: int, meta: NDArray[Any],
               codes: NDArray[Any], fed: Fed = NO_FED) -> bool:
        f = fed
        return int(_nb().even_encode(x, n, self.d, self.s, self.g, self.bits, self.lid, self.amode, self.mmode,
                                     self.cst, self.clip, self.fp16, self.stoch, sa, sb, meta, codes, b0, b1,
                                     self.byte_at(b0 * self.d), f.on, f.e, f.out, f.scale, f.scaled, f.has_e,
                                     f.limit, f.flush)) >= 0

    def decode(self, meta: NDArray[Any], codes: NDArray[Any], n: int, b0: int, b1: int, out: NDArray[Any],
               acc: bool) -> None:
        _nb().even_decode(meta, codes, n, self.d, self.s, self.g, self.bits, self.lid, self.magic, self.amode,
                          self.cst, b0, b1, out, acc)


@kernel_for(Uniform)
def _uniform(scheme: Uniform) -> Kernel | None:
    f = level_fields(scheme)
    return None if f is None else EvenKernel(**f, amode=0, mmode=0, cst=np.float32(1.0 / (f["s"] - 1)))


@kernel_for(TernGrad)
def _terngrad(scheme: TernGrad) -> Kernel | None:
    f = level_fields(scheme)
    return None if f is None else EvenKernel(**f, amode=1, mmode=1, cst=np.float32(1.0))


@kernel_for(QSGD)
def _qsgd(scheme: QSGD) -> Kernel | None:
    f = level_fields(scheme)
    mmode = 1 if scheme.norm is Norm.MAX else 2
    return None if f is None else EvenKernel(**f, amode=1, mmode=mmode, cst=np.float32(1.0 / scheme.levels))


@dataclass(frozen=True)
class SignKernel(Kernel):
    """meta = mean |x| a bucket, code = x >= 0; decoded against the table [-m, m]."""

    def encode(self, x: NDArray[Any], n: int, b0: int, b1: int, sa: int, sb: int, meta: NDArray[Any],
               codes: NDArray[Any], fed: Fed = NO_FED) -> bool:
        f = fed
        return int(_nb().sign_encode(x, n, self.d, self.clip, self.fp16, meta, codes, b0, b1,
                                     self.byte_at(b0 * self.d), f.on, f.e, f.out, f.scale, f.scaled, f.has_e,
                                     f.limit, f.flush)) >= 0

    def decode(self, meta: NDArray[Any], codes: NDArray[Any], n: int, b0: int, b1: int, out: NDArray[Any],
               acc: bool) -> None:
        _nb_table().table_decode(meta, self.mw, True, codes, n, self.d, self.s, self.g, self.bits, self.lid,
                                 self.magic, b0, b1, out, acc)


@kernel_for(Sign)
def _sign(scheme: Sign) -> Kernel | None:
    f = level_fields(scheme)
    return None if f is None else SignKernel(**f)
