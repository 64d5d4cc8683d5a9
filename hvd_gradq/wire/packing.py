"""Base-s packing of symbols into bytes (close to log2(s) bits a symbol), int32 lanes of
summable fields, and fixed-width bitstreams (Top-K indices).

``g`` symbols of an alphabet of ``s`` are combined into one word ``sum c_k s**k`` of ``b`` bits
(``s**g <= 2**b``). Words of ``b < 8`` bits are laid eight at a time into ``b`` bytes; words of
8, 16 or 32 bits are laid byte by byte, little-endian. The (g, b) pair minimising b/g is chosen
once per alphabet: 3 symbols -> 5 in 8 bits (1.6 bits), 5 -> 3 in 7 bits (2.33), 9 -> 5 in 16
bits (3.2), 2 -> 1 bit. Everything is int64 arithmetic in the :mod:`hvd_gradq.xp` namespace,
so NumPy, torch and TensorFlow lay down identical bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import PayloadError, SpecError
from ..xp import NUMPY, Array, Ops

_WORD_BITS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32)


@dataclass(frozen=True)
class Layout:
    """How symbols of one alphabet are packed: ``group`` symbols in a word of ``bits`` bits."""

    symbols: int
    group: int
    bits: int

    @property
    def bits_per_symbol(self) -> float:
        return self.bits / self.group

    def words(self, n: int) -> int:
        """Words that hold ``n`` symbols, padded to a multiple of 8 for sub-byte words."""
        w = -(-n // self.group)
        return -(-w // 8) * 8 if self.bits < 8 else w

    def nbytes(self, n: int) -> int:
        """Bytes that ``n`` packed symbols occupy."""
        return self.words(n) * self.bits // 8


@cache
def layout(symbols: int) -> Layout:
    """The densest (group, bits) layout for an alphabet of ``symbols`` (2 .. 2**32)."""
    if not 2 <= symbols <= 1 << 32:
        raise SpecError(f"an alphabet of {symbols} symbols cannot be packed; valid: 2 .. 2**32")
    best: Layout | None = None
    for b in _WORD_BITS:
        g = 0
        while symbols ** (g + 1) <= 1 << b:
            g += 1
        if g == 0:
            continue
        cand = Layout(symbols, g, b)
        if best is None or cand.bits_per_symbol < best.bits_per_symbol - 1e-12:
            best = cand
    assert best is not None  # b = 32 always fits one symbol
    return best


def pack(ops: Ops, codes: Array, symbols: int) -> Array:
    """Pack int64 ``codes`` (1-D, values in [0, symbols)) into a 1-D int64 array of byte values."""
    lay = layout(symbols)
    n = ops.shape(codes)[0]
    nw = lay.words(n)
    pad = nw * lay.group - n
    if pad:
        codes = ops.concat([codes, ops.zeros((pad,), "int64")], 0)
    if lay.group == 1:
        words = codes
    else:
        c = ops.reshape(codes, (nw, lay.group))
        words = ops.reshape(ops.sum(c * _const(ops, _powers(symbols, lay.group)), 1), (nw,))
    if lay.bits < 8:
        # Eight words -> one integer of 8*bits <= 56 bits -> ``bits`` bytes.
        w8 = ops.reshape(words, (nw // 8, 8))
        merged = ops.sum(w8 * _const(ops, _pow2(np.arange(8) * lay.bits)), 1)
        out = ops.band(ops.floordiv_by(merged, _const(ops, _pow2(np.arange(lay.bits) * 8))), 0xFF)
        return ops.reshape(out, (nw // 8 * lay.bits,))
    nb = lay.bits // 8
    if nb == 1:
        return words
    w = ops.reshape(words, (nw, 1))
    out = ops.band(ops.floordiv_by(w, _const(ops, _pow2(np.arange(nb) * 8))), 0xFF)
    return ops.reshape(out, (nw * nb,))


def unpack(ops: Ops, data: Array, symbols: int, n: int) -> Array:
    """Inverse of :func:`pack`: int64 byte values -> ``n`` int64 codes in [0, symbols)."""
    lay = layout(symbols)
    nw = lay.words(n)
    if lay.bits < 8:
        rows = ops.reshape(data, (nw // 8, lay.bits))
        merged = ops.sum(rows * _const(ops, _pow2(np.arange(lay.bits) * 8)), 1)
        words = ops.band(ops.floordiv_by(merged, _const(ops, _pow2(np.arange(8) * lay.bits))),
                         (1 << lay.bits) - 1)
        words = ops.reshape(words, (nw,))
    elif lay.bits == 8:
        words = data
    else:
        rows = ops.reshape(data, (nw, lay.bits // 8))
        words = ops.reshape(ops.sum(rows * _const(ops, _pow2(np.arange(lay.bits // 8) * 8)), 1), (nw,))
    if lay.group == 1:
        codes = words
    else:
        w = ops.reshape(words, (nw, 1))
        codes = ops.mod(ops.floordiv_by(w, _const(ops, _powers(symbols, lay.group))), symbols)
        codes = ops.reshape(codes, (nw * lay.group,))
    return codes[:n]


def check_codes(data: NDArray[Any], symbols: int, n: int) -> None:
    """Raise PayloadError if packed ``data`` (NumPy, uint8 or int64 byte values) holds a code
    outside the alphabet. Only layouts of one symbol a word with room to spare (129 to 255
    symbols in a byte, say) can hold one: several symbols a word are digits taken modulo
    ``symbols``, and a power-of-two alphabet fills its word. Such a code would index past the
    table (the reference) or read NaN (the compiled kernels)."""
    lay = layout(symbols)
    if lay.group != 1 or symbols == 1 << lay.bits or n == 0:
        return
    if lay.bits == 8:
        top = int(np.asarray(data[:n]).max())
    else:
        top = int(np.asarray(unpack(NUMPY, np.asarray(data).astype(np.int64), symbols, n)).max())
    if top >= symbols:
        raise PayloadError(
            f"corrupt payload: a code of {top} in an alphabet of {symbols} symbols (valid: 0 .. {symbols - 1})"
        )


def _const(ops: Ops, x: NDArray[Any]) -> Array:
    return ops.i64(ops.from_numpy(x))


def _pow2(shifts: NDArray[Any]) -> NDArray[Any]:
    return np.left_shift(np.int64(1), shifts.astype(np.int64))


def _powers(symbols: int, group: int) -> NDArray[Any]:
    return np.array([symbols**k for k in range(group)], dtype=np.int64)


def pack_lanes(ops: Ops, codes: Array, field_bits: int, fields: int) -> Array:
    """Codes (n,) -> int64 lanes of ``fields`` fields of ``field_bits`` bits (values < 2**31)."""
    n = ops.shape(codes)[0]
    lanes = -(-n // fields)
    pad = lanes * fields - n
    if pad:
        codes = ops.concat([codes, ops.zeros((pad,), "int64")], 0)
    w = _const(ops, _pow2(np.arange(fields) * field_bits))
    return ops.reshape(ops.sum(ops.reshape(codes, (lanes, fields)) * w, 1), (lanes,))


def unpack_lanes(ops: Ops, lanes: Array, field_bits: int, fields: int, n: int) -> Array:
    """Inverse of :func:`pack_lanes` (after the lanes were summed: fields hold sums)."""
    k = ops.shape(lanes)[0]
    w = _const(ops, _pow2(np.arange(fields) * field_bits))
    f = ops.mod(ops.floordiv_by(ops.reshape(ops.i64(lanes), (k, 1)), w), 1 << field_bits)
    return ops.reshape(f, (k * fields,))[:n]


def pack_bits(ops: Ops, v: Array, bits: int) -> Array:
    """Non-negative int64 values < 2**bits -> a bitstream as int64 byte values (LSB first)."""
    k = ops.shape(v)[0]
    total = k * bits
    nbytes = -(-total // 8)
    bitmat = ops.mod(ops.floordiv_by(ops.reshape(v, (k, 1)), _const(ops, _pow2(np.arange(bits)))), 2)
    flat = ops.reshape(bitmat, (total,))
    pad = nbytes * 8 - total
    if pad:
        flat = ops.concat([flat, ops.zeros((pad,), "int64")], 0)
    return ops.reshape(ops.sum(ops.reshape(flat, (nbytes, 8)) * _const(ops, _pow2(np.arange(8))), 1), (nbytes,))


def unpack_bits(ops: Ops, data: Array, bits: int, k: int) -> Array:
    """Inverse of :func:`pack_bits`: int64 byte values -> ``k`` int64 values of ``bits`` bits."""
    nbytes = -(-(k * bits) // 8)
    bitmat = ops.mod(ops.floordiv_by(ops.reshape(ops.i64(data), (nbytes, 1)), _const(ops, _pow2(np.arange(8)))), 2)
    flat = ops.reshape(bitmat, (nbytes * 8,))[: k * bits]
    weights = _const(ops, _pow2(np.arange(bits)))
    return ops.reshape(ops.sum(ops.reshape(flat, (k, bits)) * weights, 1), (k,))
