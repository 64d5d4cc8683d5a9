"""The sorted-level schemes' bucket sort (:mod:`hvd_gradq.kernels._nb_sort`) against an independent
oracle: NumPy's sort of the order-preserving integer keys, mapped back to float bits. Any correct
sort of those keys gives the same bits (equal keys are equal bits), so this pins the output of
every path (the transposed bitonic network, its vector and scalar transposes, the radix sort)
bit for bit, including -0.0 before +0.0 and the infinities."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from engines import require_numba

SPECIALS = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1.17549435e-38, np.inf, -np.inf,
                     3.4028235e38, -3.4028235e38, 1.0, -1.0], np.float32)


def _oracle(x: np.ndarray) -> np.ndarray:
    """Each row sorted in IEEE total order, through int32 keys and np.sort."""
    b = x.view(np.int32)
    keys = b ^ ((b >> 31) & 0x7FFFFFFF)  # signed order = total order; the map is its own inverse
    k = np.sort(keys, axis=1, kind="stable")
    return (k ^ ((k >> 31) & 0x7FFFFFFF)).view(np.float32)


def _rows(rng: np.random.Generator, nrows: int, w: int) -> np.ndarray:
    """Rows of several kinds: normal values, heavy tails, many ties, one repeated value, the
    special values (zeros of both signs, subnormals, infinities, the extremes) among normals."""
    kinds = [lambda: rng.standard_normal(w), lambda: rng.standard_t(1.5, w) * 1e30,
             lambda: rng.integers(-3, 4, w).astype(np.float64), lambda: np.full(w, -2.5),
             lambda: rng.choice(SPECIALS, w), lambda: np.where(rng.random(w) < 0.3, rng.choice(SPECIALS, w),
                                                               rng.standard_normal(w))]
    with np.errstate(over="ignore"):
        return np.stack([kinds[r % len(kinds)]() for r in range(nrows)]).astype(np.float32)


@pytest.mark.parametrize("w", [1, 2, 3, 15, 16, 17, 31, 32, 48, 100, 128, 255, 256, 496, 512, 513, 1000, 1024,
                               2000, 2048, 4096, 8192, 8193])
@pytest.mark.parametrize("nrows", [1, 3, 4, 7, 8, 16, 23, 33, 40])
def test_sort_rows_is_total_order_sort(w: int, nrows: int) -> None:
    """Widths 1 to 8,193 (powers of two and not, multiples of the 16-lane vector and not, both
    sides of the widest bitonic sort), row counts below and above a group of lanes (so full
    groups, padded groups and a radix tail, on both sides of its row thresholds)."""
    require_numba()
    from hvd_gradq.kernels import _nb_sort

    x = _rows(np.random.default_rng([w, nrows]), nrows, w)
    out = np.full_like(x, np.nan)
    _nb_sort.sort_rows(x, out)
    assert out.tobytes() == _oracle(x).tobytes(), (w, nrows)


def test_sort_rows_on_strided_rows() -> None:
    """Rows that are a view with a row stride wider than the row (a column slice) and an output
    that is one too: the vector transposes read and write through the strides."""
    require_numba()
    from hvd_gradq.kernels import _nb_sort

    x = _rows(np.random.default_rng(3), 48, 80)
    out = np.full((48, 96), np.nan, np.float32)
    _nb_sort.sort_rows(x[:, 8:72], out[:, 16:80])
    assert out[:, 16:80].tobytes() == _oracle(x[:, 8:72]).tobytes()
    assert np.isnan(out[:, :16]).all() and np.isnan(out[:, 80:]).all()  # nothing written outside


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_networks_sort_every_zero_one_input(n: int) -> None:
    """The comparator lists the vector steps run: the sort network sorts, and the merge network
    merges two sorted halves (the second reversed: a bitonic sequence), for every 0-1 input,
    which by the 0-1 principle proves them for every input."""
    from hvd_gradq.kernels._nb_simd import merge_pairs, sort_pairs

    def run(pairs: list[tuple[int, int]], v: list[int]) -> list[int]:
        v = list(v)
        for i, j in pairs:
            if v[i] > v[j]:
                v[i], v[j] = v[j], v[i]
        return v

    for bits in itertools.product((0, 1), repeat=n):
        assert run(sort_pairs(n), list(bits)) == sorted(bits), bits
        h = n // 2
        bitonic = sorted(bits[:h]) + sorted(bits[h:], reverse=True)
        assert run(merge_pairs(n), bitonic) == sorted(bits), bits
