"""How a pattern cuts a tensor: the scatter pattern's chunks (and the hierarchical pattern's
pieces, cut the same way) on bucket boundaries, and the summable pattern's int32 lanes. The
reduction core cuts by these, the cost model prices by them and a frontend sizes its residual
variables by them (:func:`hvd_gradq.reduce.table.residual_widths`), so all three agree."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecError


@dataclass(frozen=True)
class Lanes:
    """``fields`` codes of ``field_bits`` bits in each int32 lane (31 bits used: no sign)."""

    field_bits: int
    fields: int

    def lanes(self, n: int) -> int:
        return -(-n // self.fields)

def lanes_for(symbols: int, nranks: int) -> Lanes:
    """The lane layout for codes in [0, symbols) summed over ``nranks`` ranks."""
    top = (symbols - 1) * nranks
    fb = max(1, top.bit_length())
    if fb > 31:
        raise SpecError(f"{symbols} symbols summed over {nranks} ranks do not fit a 31-bit lane; use pattern=gather")
    return Lanes(fb, 31 // fb)

def chunk_bounds(n: int, bucket: int, nranks: int) -> list[tuple[int, int]]:
    """[lo, hi) element ranges of the N chunks of the scatter pattern, on bucket boundaries."""
    nb = -(-n // bucket)
    out = []
    for j in range(nranks):
        lo = min(n, (j * nb // nranks) * bucket)
        hi = min(n, ((j + 1) * nb // nranks) * bucket)
        out.append((lo, hi))
    return out
