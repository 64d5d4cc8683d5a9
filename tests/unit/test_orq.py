"""ORQ's levels (hvd_gradq/schemes/orq.py) against the exact optimum of a dynamic program.

The variance of stochastic rounding onto sorted levels l_0 < ... < l_{s-1} is
sum_x (l_{j+1} - x)(x - l_j) for x in [l_j, l_{j+1}]; it is computed here from the levels
themselves (expected variance), not from samples.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import hvd_gradq
from hvd_gradq.schemes.orq import choose_levels
from hvd_gradq.xp import NUMPY

DISTS = {
    "gaussian": lambda rng, shape: rng.standard_normal(shape),
    "laplace": lambda rng, shape: rng.laplace(size=shape),
    "student_t2": lambda rng, shape: rng.standard_t(2, size=shape),
}


def expected_variance(x: np.ndarray, levels: np.ndarray) -> float:
    """sum (l_{j+1}-x)(x-l_j) over x, each in its interval of the sorted ``levels``."""
    x = np.asarray(x, np.float64)
    lev = np.asarray(levels, np.float64)
    assert lev[0] <= x.min() and x.max() <= lev[-1], "levels must cover the data"
    j = np.clip(np.searchsorted(lev, x, side="right") - 1, 0, lev.size - 2)
    return float(np.sum((lev[j + 1] - x) * (x - lev[j])))


def segment_costs(y: np.ndarray) -> np.ndarray:
    """C[i, j] = sum_{i<=k<=j} (y_j - y_k)(y_k - y_i) for sorted y, by prefix sums (O(1) each);
    +inf where j <= i."""
    w = y.size
    s1 = np.concatenate([[0.0], np.cumsum(y)])
    s2 = np.concatenate([[0.0], np.cumsum(y * y)])
    i = np.arange(w)[:, None]
    j = np.arange(w)[None, :]
    n = (j - i + 1).astype(np.float64)
    jj = np.maximum(j, i)
    S1 = s1[jj + 1] - s1[i]
    S2 = s2[jj + 1] - s2[i]
    a, b = y[:, None], y[None, :]
    c = b * S1 - S2 - a * b * n + a * S1
    return np.where(j > i, c, np.inf)


def optimal_levels(x: np.ndarray, s: int) -> tuple[np.ndarray, float]:
    """The exact optimum over levels at data points with l_0 = min, l_{s-1} = max: an O(s w^2)
    dynamic program, f_t(j) = min_{i<j} f_{t-1}(i) + C(i, j). Returns the levels and the DP's
    value."""
    y = np.sort(np.asarray(x, np.float64))
    w = y.size
    assert w >= s
    c = segment_costs(y)
    f = np.full(w, np.inf)
    f[0] = 0.0
    args = []
    for _ in range(s - 1):
        tot = f[:, None] + c
        a = np.argmin(tot, axis=0)
        args.append(a)
        f = tot[a, np.arange(w)]
    idx = [w - 1]
    for a in reversed(args):
        idx.append(int(a[idx[-1]]))
    return y[idx[::-1]], float(f[w - 1])


@pytest.mark.parametrize("s", [3, 4, 5])
def test_dynamic_program_is_the_brute_force_optimum(s):
    rng = np.random.default_rng(s)
    for trial in range(12):
        x = rng.standard_t(3, size=9 if trial % 2 else 8)
        y = np.sort(x)
        brute = min(
            expected_variance(x, np.concatenate([[y[0]], y[list(c)], [y[-1]]]))
            for c in itertools.combinations(range(1, y.size - 1), s - 2)
        )
        levels, value = optimal_levels(x, s)
        assert value == pytest.approx(brute, rel=1e-9, abs=1e-12)
        assert expected_variance(x, levels) == pytest.approx(brute, rel=1e-9, abs=1e-12)
        # levels off the data points do no better (the optimum lies on data points)
        for _ in range(50):
            inner = np.sort(rng.uniform(y[0], y[-1], s - 2))
            assert expected_variance(x, np.concatenate([[y[0]], inner, [y[-1]]])) >= brute * (1 - 1e-12)


@pytest.mark.parametrize("s", [2, 3, 4, 5, 9, 17, 18])
def test_levels_are_sorted_data_points_from_min_to_max(s):
    rng = np.random.default_rng(100 + s)
    x = rng.laplace(size=(6, 128)).astype(np.float32)
    x[1] = np.round(x[1])  # many ties
    x[2] = 0.25  # constant
    lev = choose_levels(NUMPY, x.astype(np.float64), s)
    assert lev.shape == (6, s)
    assert np.all(np.diff(lev, axis=1) >= 0)
    np.testing.assert_array_equal(lev[:, 0], x.min(1))
    np.testing.assert_array_equal(lev[:, -1], x.max(1))
    for r in range(6):
        assert np.isin(lev[r], x[r]).all()


@pytest.mark.parametrize("s", [3, 5, 9])
@pytest.mark.parametrize("dist", DISTS)
def test_variance_within_one_percent_of_the_optimum(dist, s):
    rng = np.random.default_rng([s, len(dist)])
    x = DISTS[dist](rng, (20, 128)).astype(np.float32)
    lev = choose_levels(NUMPY, x[:, :].astype(np.float64), s)
    excess = []
    for r in range(x.shape[0]):
        # as the brief has it: one bucket at a time, x[None, :]
        one = choose_levels(NUMPY, x[r][None, :], s)[0]
        np.testing.assert_array_equal(one, lev[r])  # buckets are independent
        v = expected_variance(x[r], one)
        opt_levels, opt = optimal_levels(x[r], s)
        assert expected_variance(x[r], opt_levels) == pytest.approx(opt, rel=1e-9)
        assert v >= opt * (1 - 1e-9), "nothing beats the exact optimum"
        excess.append(v / opt - 1)
    assert max(excess) <= 0.01, f"ORQ-{s} on {dist}: worst excess {max(excess):.2%} over the optimum"


@pytest.mark.parametrize("s,q", [(3, 1), (5, 2), (9, 4)])
@pytest.mark.parametrize("dist", DISTS)
def test_variance_below_qsgd_with_as_many_symbols(dist, s, q):
    """ORQ-s against QSGD (max norm) with q = (s-1)/2 magnitudes, i.e. the same s symbols; the
    QSGD variance follows from its table the same way."""
    rng = np.random.default_rng([q, 7, len(dist)])
    x = DISTS[dist](rng, (12, 512)).astype(np.float32)
    orq = hvd_gradq.parse(f"orq:levels={s}")
    qsgd = hvd_gradq.parse(f"qsgd:levels={q},norm=max")
    assert orq.symbols == qsgd.symbols == s
    v_orq = v_qsgd = 0.0
    for r in range(x.shape[0]):
        row = x[r][None, :]
        lo = orq.table(NUMPY, orq.choose(NUMPY, row))[0]  # the levels as sent (float32)
        lq = qsgd.table(NUMPY, qsgd.choose(NUMPY, row))[0]
        a, b = expected_variance(x[r], lo), expected_variance(x[r], lq)
        assert a <= b, f"bucket {r}: ORQ-{s} {a:.4g} > QSGD-{q} {b:.4g}"
        v_orq += a
        v_qsgd += b
    assert v_orq < v_qsgd


@pytest.mark.parametrize("s", [5, 9])
def test_variance_within_one_percent_of_the_optimum_at_512(s):
    """The paper's bucket size (the multi-start programs; buckets of 128 above take them too)."""
    for i, dist in enumerate(DISTS):
        x = DISTS[dist](np.random.default_rng([s, i, 512]), (4, 512)).astype(np.float32)
        lev = choose_levels(NUMPY, x, s)
        for r in range(x.shape[0]):
            _, opt = optimal_levels(x[r], s)
            v = expected_variance(x[r], lev[r])
            assert opt * (1 - 1e-9) <= v <= opt * 1.01, f"ORQ-{s} on {dist}: {v / opt - 1:.2%} over the optimum"


@pytest.mark.parametrize("w", [5, 9, 33, 64])
def test_small_buckets_get_the_exact_optimum(w):
    rng = np.random.default_rng(w)
    for s in (4, 5, 9):
        if s > w:
            continue
        x = rng.standard_t(2, size=(6, w)).astype(np.float32)
        lev = choose_levels(NUMPY, x, s)
        for r in range(6):
            _, opt = optimal_levels(x[r], s)
            assert expected_variance(x[r], lev[r]) == pytest.approx(opt, rel=1e-9, abs=1e-12)


def test_fewer_points_than_levels():
    x = np.array([[0.5, -1.0, 2.0]], np.float32)
    lev = choose_levels(NUMPY, x, 9)
    assert lev.shape == (1, 9)
    assert set(lev[0]) <= {-1.0, 0.5, 2.0} and lev[0, 0] == -1.0 and lev[0, -1] == 2.0
    assert expected_variance(x[0], lev[0]) == 0.0
