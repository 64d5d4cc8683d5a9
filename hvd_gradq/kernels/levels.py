"""Kernels for levels chosen from each bucket (bingrad b/pb, orq): registered for their scheme
classes; the compiled loops are in :mod:`._nb_table` (over :mod:`._nb_levels`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from ..schemes.bingrad import BinGrad, Variant
from ..schemes.orq import ORQ
from ._registry import NO_FED, Fed, Kernel, kernel_for, level_fields

# bingrad and orq sort every bucket (_nb_sort), a chunk of buckets at a time (the
# chunk stays in cache for the kernel that follows)
_SORT_CHUNK_ELEMS = 1 << 17
BINGRAD, ORQ_EXACT = 2, 4  # the ``kind`` _nb_table.sorted_encode takes


def _nb() -> Any:
    from . import _nb_table  # numba: imported when a kernel first runs

    return _nb_table


@dataclass(frozen=True)
class TableKernel(Kernel):
    """Levels stored as the bucket's meta row, decoded against that table."""

    def decode(self, meta: NDArray[Any], codes: NDArray[Any], n: int, b0: int, b1: int, out: NDArray[Any],
               acc: bool) -> None:
        _nb().table_decode(meta, self.mw, False, codes, n, self.d, self.s, self.g, self.bits, self.lid, self.magic,
                           b0, b1, out, acc)


@dataclass(frozen=True)
class SortedKernel(TableKernel):
    """bingrad (kind 2; param 1: pb) or orq with 4 levels or more (kind 4: the exact search)."""

    kind: int = BINGRAD
    param: int = 0
    searches: ClassVar[bool] = True

    def encode(self, x: NDArray[Any], n: int, b0: int, b1: int, sa: int, sb: int, meta: NDArray[Any],
               codes: NDArray[Any], fed: Fed = NO_FED) -> bool:
        k = _nb()
        d = self.d
        state = np.array([0, self.byte_at(b0 * d)], np.int64)  # (pending codes, output byte)
        cb = np.empty(d + 2 * self.unit, np.uint8)
        full = min(n // d, b1)  # whole buckets of the range end here; a tail bucket follows
        step = max(1, _SORT_CHUNK_ELEMS // d)
        srt = np.empty((min(step, max(full - b0, 1)), d), np.float32)
        # with error feedback a chunk is compensated (and checked) into ``held`` before its sort
        held = np.empty(srt.size if full > b0 else n - full * d, np.float32) if fed.on else None
        chunks = [(c0, min(full, c0 + step)) for c0 in range(b0, full, step)]
        if full < b1:
            chunks.append((full, full + 1))
        for c0, c1 in chunks:
            e0, e1 = c0 * d, min(c1 * d, n)
            src = x[e0:e1]
            if held is not None:
                src = held[: e1 - e0]
                if not k.compensate_checked(x, fed.e, fed.scale, fed.scaled, fed.has_e, fed.limit,
                                            fed.flush, e0, e1, src):
                    return False
            rows = srt[: c1 - c0] if c1 <= full else np.empty((1, e1 - e0), np.float32)
            k.sort_rows(src.reshape(rows.shape), rows)
            k.sorted_encode(self.kind, self.param, src, e0, rows, n, d, c0, c1, self.s, self.g, self.bits, self.lid,
                            self.clip, self.fp16, self.stoch, sa, sb, meta, codes, state, cb, fed.on, fed.e, fed.out,
                            fed.scale, fed.scaled, fed.has_e, fed.flush)
        from . import _nb_pack

        _nb_pack.final_flush(self.lid, self.s, self.g, self.bits, cb, state, codes)
        return True


@dataclass(frozen=True)
class OrqSmallKernel(TableKernel):
    """orq with 2 or 3 levels: min, max and one best level, without sorting."""

    def encode(self, x: NDArray[Any], n: int, b0: int, b1: int, sa: int, sb: int, meta: NDArray[Any],
               codes: NDArray[Any], fed: Fed = NO_FED) -> bool:
        f = fed
        return int(_nb().orq_small_encode(x, n, self.d, self.s, self.g, self.bits, self.lid, self.clip, self.fp16, sa,
                                          sb, meta, codes, b0, b1, self.byte_at(b0 * self.d), f.on, f.e, f.out,
                                          f.scale, f.scaled, f.has_e, f.limit, f.flush)) >= 0


@kernel_for(BinGrad)
def _bingrad(scheme: BinGrad) -> Kernel | None:
    f = level_fields(scheme)
    return None if f is None else SortedKernel(**f, kind=BINGRAD, param=int(scheme.variant is Variant.PB))


@kernel_for(ORQ)
def _orq(scheme: ORQ) -> Kernel | None:
    f = level_fields(scheme)
    if f is None:
        return None
    return SortedKernel(**f, kind=ORQ_EXACT) if f["s"] >= 4 else OrqSmallKernel(**f)
