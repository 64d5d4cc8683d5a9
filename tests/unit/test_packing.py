"""Base-s packing of symbols into bytes (hvd_gradq/wire/packing.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hvd_gradq.errors import SpecError
from hvd_gradq.wire.packing import layout, pack, unpack
from hvd_gradq.xp import NUMPY

ALPHABETS = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 15, 16, 17, 31, 33, 100, 255, 256, 257, 1000, 65535, 65536, 65537,
             1 << 20, (1 << 32) - 1, 1 << 32]


def _lengths(symbols: int) -> list[int]:
    g = layout(symbols).group
    base = {0, 1, 2, 7, 8, 9, 63, 64, 65, 1000, 1001}
    base |= {g - 1, g, g + 1, 8 * g - 1, 8 * g, 8 * g + 1, 8 * g * 3 + 5}
    return sorted(n for n in base if n >= 0)


@pytest.mark.parametrize("symbols", ALPHABETS)
def test_round_trip(symbols):
    rng = np.random.default_rng(symbols % 1000)
    lay = layout(symbols)
    for n in _lengths(symbols):
        codes = rng.integers(0, symbols, size=n, dtype=np.int64)
        if n >= 2:  # make sure both extremes of the alphabet are present
            codes[0], codes[-1] = 0, symbols - 1
        data = pack(NUMPY, codes, symbols)
        assert data.dtype == np.int64
        assert data.ndim == 1
        assert data.shape[0] == lay.nbytes(n), (symbols, n)
        if n:
            assert data.min() >= 0 and data.max() < 256  # byte values
        back = unpack(NUMPY, data.astype(np.uint8).astype(np.int64), symbols, n)
        np.testing.assert_array_equal(back, codes)


@pytest.mark.parametrize("symbols", [2, 3, 5, 9, 256])
def test_all_max_and_all_zero_codes(symbols):
    for n in (1, 5, 41, 513):
        for v in (0, symbols - 1):
            codes = np.full(n, v, np.int64)
            np.testing.assert_array_equal(unpack(NUMPY, pack(NUMPY, codes, symbols), symbols, n), codes)


def test_bits_per_symbol_of_the_paper_alphabets():
    assert layout(2).bits_per_symbol == 1.0
    assert layout(3).bits_per_symbol <= 1.6 + 1e-12
    assert layout(5).bits_per_symbol <= 2.34
    assert layout(9).bits_per_symbol <= 3.2 + 1e-12
    assert layout(256).bits_per_symbol == 8.0
    assert layout(4).bits_per_symbol == 2.0


@pytest.mark.parametrize("symbols", range(2, 300))
def test_layout_is_valid_and_near_entropy(symbols):
    lay = layout(symbols)
    # the group fits in the word, and one more symbol would not be denser in that word
    assert symbols**lay.group <= 1 << lay.bits
    assert lay.bits_per_symbol >= math.log2(symbols) - 1e-12
    # never worse than one symbol per smallest word that holds it (whole bits up to 256 symbols)
    one_per_word = min(b for b in (1, 2, 3, 4, 5, 6, 7, 8, 16, 32) if 1 << b >= symbols)
    assert lay.bits_per_symbol <= one_per_word + 1e-12
    if symbols <= 256:
        assert lay.bits_per_symbol <= math.ceil(math.log2(symbols)) + 1e-12


@pytest.mark.parametrize("symbols", [1, 0, -3, (1 << 32) + 1])
def test_unpackable_alphabets_refused(symbols):
    with pytest.raises(SpecError, match="cannot be packed"):
        layout(symbols)


def test_bytes_are_dense():
    # 3 symbols: 5 to a byte, so 1000 symbols take 200 bytes, padded to 8 words
    assert layout(3).nbytes(1000) == 200
    assert layout(3).nbytes(1001) == 201  # one byte-wide word per 5 symbols, no padding
    assert layout(5).nbytes(3) == 7  # 7-bit words go eight at a time: 1 word -> 8 words = 7 bytes
    assert layout(2).nbytes(9) == 2
    assert layout(9).nbytes(10) == 4  # 2 words of 16 bits
