"""ORQ's levels (hvd_gradq/schemes/orq.py, hvd_gradq/kernels/orq_levels.py) at the exact optimum.

The variance of stochastic rounding onto sorted levels l_0 <= ... <= l_{s-1} is
sum_x (l_{j+1} - x)(x - l_j) for x in [l_j, l_{j+1}]; it is computed here, in float64, from the
levels themselves (expected variance), not from samples. The oracle is an O(s w^2) dynamic
program over every pair of points, written here with no code shared with the library (whose
search is a divide and conquer with monotone argmin).

Tolerance: both sides are float64 objectives of float32 data; the library ranks candidate level
sets by segment costs from prefix sums, whose cancellation leaves an absolute error of a few ulp
of w * range^2 per comparison, so it can only pick a set whose true objective exceeds the optimum
by that much: rel 1e-9 of the optimum plus 1e-12 * w * range^2 (about 4,500 ulp of the largest
prefix sum), far below any real difference (the old heuristic was 1e-4 .. 6e-1 above).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from engines import require_numba

import hvd_gradq
from hvd_gradq.kernels import search
from hvd_gradq.schemes.orq import choose_levels
from hvd_gradq.spec import parse_scheme
from hvd_gradq.xp import NUMPY

DISTS = {
    "gaussian": lambda rng, shape: rng.standard_normal(shape),
    "laplace": lambda rng, shape: rng.laplace(size=shape),
    "student_t2": lambda rng, shape: rng.standard_t(2, size=shape),
    # runs of equal values (many duplicates) among a few distinct ones, and a constant stretch
    "constant_runs": lambda rng, shape: np.where(
        rng.random(shape) < 0.3, 0.75, np.round(rng.standard_normal(shape) * 2.0) / 2.0
    ),
}
LEVELS = [2, 3, 4, 5, 6, 7, 8, 9, 16, 17]


def expected_variance(x: np.ndarray, levels: np.ndarray) -> float:
    """sum (l_{j+1}-x)(x-l_j) over x, each in its interval of the sorted ``levels``."""
    x = np.asarray(x, np.float64)
    lev = np.asarray(levels, np.float64)
    assert lev[0] <= x.min() and x.max() <= lev[-1], "levels must cover the data"
    assert np.all(np.diff(lev) >= 0), "levels must be sorted"
    j = np.clip(np.searchsorted(lev, x, side="right") - 1, 0, lev.size - 2)
    return float(np.sum((lev[j + 1] - x) * (x - lev[j])))


def segment_costs(y: np.ndarray) -> np.ndarray:
    """C[i, j] = sum_{i<=k<=j} (y_j - y_k)(y_k - y_i) for sorted y by prefix sums; 0 on the
    diagonal (a repeated level), +inf below it."""
    w = y.size
    s1 = np.concatenate([[0.0], np.cumsum(y)])
    s2 = np.concatenate([[0.0], np.cumsum(y * y)])
    i = np.arange(w)[:, None]
    j = np.arange(w)[None, :]
    jj = np.maximum(j, i)
    n = (jj - i + 1).astype(np.float64)
    big1 = s1[jj + 1] - s1[i]
    big2 = s2[jj + 1] - s2[i]
    a, b = y[:, None], y[None, :]
    c = b * big1 - big2 - a * b * n + a * big1
    return np.where(j > i, c, np.where(j == i, 0.0, np.inf))


def optimal_levels(x: np.ndarray, s: int) -> tuple[np.ndarray, float]:
    """The exact optimum over levels at data points with l_0 = min, l_{s-1} = max (repeats
    allowed, so any w >= 1): f_t(j) = min_{i<=j} f_{t-1}(i) + C(i, j), every i for every j.
    Returns the levels and the program's value."""
    y = np.sort(np.asarray(x, np.float64))
    w = y.size
    y0 = y - y[0]
    c = segment_costs(y0)
    f = c[0].copy()
    args = [np.zeros(w, np.int64)]
    for _ in range(s - 2):
        tot = f[:, None] + c
        a = np.argmin(tot, axis=0)
        args.append(a)
        f = tot[a, np.arange(w)]
    idx = [w - 1]
    for a in reversed(args):
        idx.append(int(a[idx[-1]]))
    return y[idx[::-1]], float(f[w - 1])


def tolerance(x: np.ndarray, opt: float) -> float:
    """See the module docstring."""
    x = np.asarray(x, np.float64)
    return 1e-9 * opt + 1e-12 * x.size * float(x.max() - x.min()) ** 2


def assert_optimal(x: np.ndarray, levels: np.ndarray, s: int, what: str) -> None:
    x = np.asarray(x, np.float32)
    lev = np.asarray(levels)
    assert lev.shape == (s,)
    assert lev[0] == x.min() and lev[-1] == x.max(), f"{what}: levels must run from min to max"
    assert np.isin(lev, x).all(), f"{what}: levels are data points"
    opt_levels, opt = optimal_levels(x, s)
    best = expected_variance(x, opt_levels)
    assert best == pytest.approx(opt, rel=1e-9, abs=tolerance(x, 0.0))
    got = expected_variance(x, lev)
    assert abs(got - best) <= tolerance(x, best), f"{what}: {got!r} vs the optimum {best!r} ({got / best - 1:.3g})"


@pytest.mark.parametrize("s", [3, 4, 5])
def test_oracle_is_the_brute_force_optimum(s: int) -> None:
    rng = np.random.default_rng(s)
    for trial in range(12):
        x = rng.standard_t(3, size=9 if trial % 2 else 8)
        if trial % 3 == 0:
            x[:3] = x[3]  # duplicates
        y = np.sort(x)
        brute = min(
            expected_variance(x, np.concatenate([[y[0]], y[list(c)], [y[-1]]]))
            for c in itertools.combinations_with_replacement(range(y.size), s - 2)
        )
        levels, value = optimal_levels(x, s)
        assert value == pytest.approx(brute, rel=1e-9, abs=1e-12)
        assert expected_variance(x, levels) == pytest.approx(brute, rel=1e-9, abs=1e-12)
        # levels off the data points do no better (the optimum lies on data points)
        for _ in range(50):
            inner = np.sort(rng.uniform(y[0], y[-1], s - 2))
            assert expected_variance(x, np.concatenate([[y[0]], inner, [y[-1]]])) >= brute * (1 - 1e-12)


@pytest.mark.parametrize("s", LEVELS)
@pytest.mark.parametrize("dist", DISTS)
def test_levels_are_the_exact_optimum(dist: str, s: int) -> None:
    """Buckets of 512 (the paper's) and 128, through the scheme's own ``choose`` (float32 levels
    as sent); every bucket of a block separately equals the block's row."""
    for w, rows in ((512, 3), (128, 4)):
        rng = np.random.default_rng([s, len(dist), w])
        x = DISTS[dist](rng, (rows, w)).astype(np.float32)
        scheme = parse_scheme(f"orq:levels={s},bucket={w}")
        lev = np.asarray(scheme.choose(NUMPY, x))
        assert lev.dtype == np.float32 and lev.shape == (rows, s)
        for r in range(rows):
            np.testing.assert_array_equal(np.asarray(scheme.choose(NUMPY, x[r : r + 1]))[0], lev[r])
            assert_optimal(x[r], lev[r], s, f"ORQ-{s} on {dist}, w={w}, bucket {r}")


@pytest.mark.parametrize("s", [3, 4, 5, 6, 7, 9, 13])
def test_random_buckets_against_the_program(s: int) -> None:
    """Hundreds of small buckets of every width from 1 to 64, from distributions that stress the
    closed-form middle level (tight clusters beside an outlier, exact duplicates, two values,
    a 1e-30 .. 1e30 spread of magnitudes) and the divide and conquer's argmin bounds."""
    rng = np.random.default_rng([s, 99])
    makers = [
        lambda w: rng.standard_normal(w),
        lambda w: np.concatenate([rng.normal(0.0, 1e-6, w - 1), [50.0]])[rng.permutation(w)],
        lambda w: rng.integers(-3, 4, w).astype(np.float64),
        lambda w: np.where(rng.random(w) < 0.5, -1.0, 2.0),
        lambda w: rng.standard_t(1, w),
        lambda w: np.sign(rng.standard_normal(w)) * 10.0 ** rng.uniform(-30, 30, w),
    ]
    for trial in range(240):
        w = 1 + trial % 64
        x = makers[trial % len(makers)](w).astype(np.float32)
        lev = choose_levels(NUMPY, x.reshape(1, w), s)[0]
        assert_optimal(x, lev, s, f"ORQ-{s}, trial {trial}, w={w}")


@pytest.mark.parametrize("s", range(6, 17))
def test_divide_and_conquer_layers_against_the_program(s: int) -> None:
    """Every level count with divide-and-conquer layers (6 .. 16), on full buckets of 512 and on
    widths around the short-range path (argmin ranges of 1 .. 4 candidates, the common case at
    the finest strides, and longer ones): heavy tails, runs of equal values (ties between
    candidates), two values, clusters beside an outlier; the compiled search and its source
    pick the same indices, and both are the program's optimum."""
    rng = np.random.default_rng([s, 7])
    makers = [
        lambda w: rng.standard_t(2, w),
        lambda w: np.round(rng.standard_normal(w) * 2.0) / 2.0,
        lambda w: np.where(rng.random(w) < 0.7, -0.25, 1.0),
        lambda w: np.concatenate([rng.normal(0.0, 1e-3, w - 2), [-30.0, 40.0]]),
        lambda w: rng.laplace(size=w),
    ]
    widths = [512, 512, 2, 3, 5, s - 1, s, s + 1, 2 * s + 3, 33, 100, 257, 128, 64] * 3
    for trial, w in enumerate(widths):
        x = makers[trial % len(makers)](w).astype(np.float32)
        ys = np.sort(x.astype(np.float64))[None, :]
        idx = search.level_indices(ys, s)
        np.testing.assert_array_equal(idx, search.level_indices(ys, s, compiled=False), f"w={w}")
        assert idx[0, 0] == 0 and idx[0, -1] == w - 1 and np.all(np.diff(idx[0]) >= 0)
        assert_optimal(x, ys[0, idx[0]].astype(np.float32), s, f"ORQ-{s}, w={w}, trial {trial}")


@pytest.mark.parametrize("s", [33, 64, 256])
def test_many_levels_are_the_exact_optimum(s: int) -> None:
    """More levels than the paper uses, up to the scheme's limit (256)."""
    rng = np.random.default_rng(s)
    for dist in ("student_t2", "constant_runs"):
        x = DISTS[dist](rng, (1, 512)).astype(np.float32)
        assert_optimal(x[0], choose_levels(NUMPY, x, s)[0], s, f"ORQ-{s} on {dist}")


@pytest.mark.parametrize("w", [1, 2, 3, 4, 7, 16])
def test_tiny_buckets(w: int) -> None:
    """Fewer points than levels (repeated levels, zero variance) and a few more."""
    rng = np.random.default_rng(w)
    for s in LEVELS + [256]:
        x = rng.standard_t(2, size=(3, w)).astype(np.float32)
        x[2] = np.float32(-0.5)  # constant
        lev = choose_levels(NUMPY, x, s)
        for r in range(3):
            assert_optimal(x[r], lev[r], s, f"ORQ-{s}, w={w}, bucket {r}")
            if w <= s:
                assert expected_variance(x[r], lev[r]) == 0.0


def test_compiled_search_is_the_python_search() -> None:
    """The numba-compiled search and its Python source pick the same indices (bit-identical
    levels), duplicates and tiny buckets included."""
    require_numba()  # else _compiled() is None and this would compare the Python source with itself
    assert search.compiled_available()
    rng = np.random.default_rng(5)
    for dist, w in itertools.product(DISTS, (1, 3, 70, 512)):
        ys = np.sort(DISTS[dist](rng, (2, w)).astype(np.float32), axis=1).astype(np.float64)
        for s in (2, 3, 4, 9, 17):
            np.testing.assert_array_equal(
                search.level_indices(ys, s), search.level_indices(ys, s, compiled=False), f"{dist} w={w} s={s}"
            )


def test_host_primitive_in_every_namespace() -> None:
    """``Ops.host`` hands a NumPy function the data and gives back its result in each namespace
    (torch tensors, TF eager and inside tf.function with a static shape): ORQ's choose through
    it equals NumPy's, bit for bit."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("tensorflow")
    from hvd_gradq.tensorflow.ops import TF
    from hvd_gradq.torch.ops import TorchOps

    x = np.random.default_rng(9).laplace(size=(5, 96)).astype(np.float32)
    scheme = parse_scheme("orq:levels=9,bucket=96")
    ref = np.asarray(scheme.choose(NUMPY, x))
    got_torch = scheme.choose(TorchOps(), torch.from_numpy(x))
    assert isinstance(got_torch, torch.Tensor) and got_torch.dtype == torch.float32
    np.testing.assert_array_equal(got_torch.numpy(), ref)
    np.testing.assert_array_equal(scheme.choose(TF, tf.constant(x)).numpy(), ref)
    fn = tf.function(lambda v: scheme.choose(TF, v), input_signature=[tf.TensorSpec((5, 96), tf.float32)])
    out = fn(tf.constant(x))
    assert tuple(fn.get_concrete_function().structured_outputs.shape) == (5, 9)
    np.testing.assert_array_equal(out.numpy(), ref)
    with pytest.raises(hvd_gradq.errors.GradqError, match="promised"):
        NUMPY.host(lambda v: v, x, (5, 9))


@pytest.mark.parametrize("s,q", [(3, 1), (5, 2), (9, 4)])
@pytest.mark.parametrize("dist", ["gaussian", "laplace", "student_t2"])
def test_variance_below_qsgd_with_as_many_symbols(dist: str, s: int, q: int) -> None:
    """ORQ-s against QSGD (max norm) with q = (s-1)/2 magnitudes, i.e. the same s symbols; the
    QSGD variance follows from its table the same way."""
    rng = np.random.default_rng([q, 7, len(dist)])
    x = DISTS[dist](rng, (12, 512)).astype(np.float32)
    orq = parse_scheme(f"orq:levels={s}")
    qsgd = parse_scheme(f"qsgd:levels={q},norm=max")
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


def test_vector_passes_are_the_python_passes() -> None:
    """The closed-form passes and the first-minimum that ``_nb_search`` runs 8 lanes at a time
    (LLVM IR vector steps, a permute where the 8 middle levels lie close, scalar loads where
    not, the source's loop for the last w mod 8) give the source's bits: every width from 1 to
    40 (tails, rows too short for the permute) and 512, sorted data with runs and outliers (far
    middle levels), and first-minimum inputs with ties, signed zeros, infinities and NaNs."""
    require_numba()
    from numba import njit

    from hvd_gradq.kernels import _nb_search, orq_levels  # noqa: F401  (registers the vector passes)

    mid = njit(lambda *a: orq_levels.mid_level_pass(*a))
    last = njit(lambda *a: orq_levels.last_pair_pass(*a))
    first = njit(lambda *a: orq_levels.first_min(*a))
    rng = np.random.default_rng(11)
    for w in [*range(1, 41), 512]:
        for dist in ("gaussian", "student_t2", "constant_runs"):
            y = np.sort(DISTS[dist](rng, w).astype(np.float32)).astype(np.float64)
            y -= y[0]
            p1 = np.concatenate([[0.0], np.cumsum(y)])
            p2 = np.concatenate([[0.0], np.cumsum(y * y)])
            f0 = rng.standard_normal(w)
            got = [np.zeros(w), np.zeros(w, np.int64), np.zeros(w), np.zeros(w, np.int64)]
            want = [a.copy() for a in got]
            for args, fn in (((got, 0), mid), ((want, 0), orq_levels.mid_level_pass)):
                fn(y, p1, p2, args[0][0], args[0][1], 0, w)
            for args, fn in (((got,), last), ((want,), orq_levels.last_pair_pass)):
                fn(y, p1, p2, f0, args[0][2], args[0][3], w, 0, w)
            for g, e, what in zip(got, want, ("mid f", "mid m", "last f", "last m")):
                np.testing.assert_array_equal(g, e, f"{what}: {dist} w={w}")
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0])
    for w in (1, 2, 7, 8, 9, 33, 512):
        for _ in range(40):
            v = rng.choice(specials, w) if rng.random() < 0.7 else rng.integers(-3, 4, w).astype(np.float64)
            i0 = int(rng.integers(0, w))
            assert first(v, i0, w) == orq_levels.first_min(v, i0, w), (v.tolist(), i0)
