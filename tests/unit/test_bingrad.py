"""BinGrad (hvd_gradq/schemes/bingrad.py): -b is the exact 1-D 2-means; -pb's levels are the
exact minimiser of its own objective (stochastic rounding inside [l1, l2], clamping outside),
checked against a brute force over every box of consecutive data points written here."""

from __future__ import annotations

import numpy as np
import pytest
from engines import ENGINES, require_numba, set_engine

import hvd_gradq
from hvd_gradq.kernels import search
from hvd_gradq.spec import parse_scheme
from hvd_gradq.xp import NUMPY

B = parse_scheme("bingrad:variant=b")
PB = parse_scheme("bingrad:variant=pb")

DISTS = {
    "gaussian": lambda rng, n: rng.standard_normal(n),
    "laplace": lambda rng, n: rng.laplace(size=n),
    "student_t2": lambda rng, n: rng.standard_t(2, size=n),
    "lognormal": lambda rng, n: rng.lognormal(size=n),  # one-sided, skewed
    "bimodal": lambda rng, n: np.concatenate([rng.normal(-3, 0.3, n // 3), rng.normal(1, 1, n - n // 3)]),
}


@pytest.fixture(params=ENGINES)
def engine(request, monkeypatch):
    """quantize/dequantize through the NumPy reference, or the compiled fast paths (which fail
    the test without numba rather than run the reference twice)."""
    set_engine(monkeypatch, request.param)
    return request.param


def levels(scheme, x: np.ndarray) -> tuple[float, float]:
    lv = scheme.choose(NUMPY, np.asarray(x, np.float32)[None, :])[0]
    return float(lv[0]), float(lv[1])


def brute_two_means(x: np.ndarray) -> float:
    """min over all splits of the sorted bucket of the within-part squared error."""
    y = np.sort(np.asarray(x, np.float64))
    return min(
        float(np.sum((y[:k] - y[:k].mean()) ** 2) + np.sum((y[k:] - y[k:].mean()) ** 2)) for k in range(1, y.size)
    )


def nearest_error(x: np.ndarray, l1: float, l2: float) -> float:
    x = np.asarray(x, np.float64)
    return float(np.sum(np.minimum((x - l1) ** 2, (x - l2) ** 2)))


def pb_error(x: np.ndarray, l1: float, l2: float) -> float:
    """Expected squared error of the -pb rule: variance (l2-x)(x-l1) inside, clamp^2 outside."""
    x = np.asarray(x, np.float64)
    c = np.clip(x, l1, l2)
    return float(np.sum((l2 - c) * (c - l1) + (c - x) ** 2))


def b_bias(x: np.ndarray, l1: float, l2: float) -> np.ndarray:
    """E[Q(x)] - x of -b: its nearest level minus x (deterministic)."""
    x = np.asarray(x, np.float64)
    return np.where(np.abs(x - l1) <= np.abs(x - l2), l1, l2) - x


def pb_bias(x: np.ndarray, l1: float, l2: float) -> np.ndarray:
    """E[Q(x)] - x of -pb: zero inside [l1, l2], the clamp outside."""
    x = np.asarray(x, np.float64)
    return np.clip(x, l1, l2) - x


@pytest.mark.parametrize("dist", DISTS)
def test_b_error_is_the_exact_two_means(dist, engine):
    rng = np.random.default_rng(list(DISTS).index(dist))
    for w in (2, 3, 7, 16, 33, 64):
        for _ in range(4):
            x = DISTS[dist](rng, w).astype(np.float32)
            best = brute_two_means(x)
            y = hvd_gradq.dequantize(hvd_gradq.quantize(x, B)).astype(np.float64)
            err = float(np.sum((y - x) ** 2))
            assert err == pytest.approx(best, rel=1e-5, abs=1e-9 * float(np.sum(x.astype(np.float64) ** 2)))
            # random two-level placements, each element to its nearer level, never do better
            l1, l2 = levels(B, x)
            assert set(np.unique(y)) <= {np.float32(l1), np.float32(l2)}
            lo, hi = float(x.min()), float(x.max())
            for a, b in rng.uniform(lo - 0.1, hi + 0.1, size=(200, 2)):
                assert nearest_error(x, a, b) >= best * (1 - 1e-9)
            # nor do small moves of its own levels
            for da, db in rng.normal(0, 0.01 * (hi - lo + 1e-9), size=(50, 2)):
                assert nearest_error(x, l1 + da, l2 + db) >= best * (1 - 1e-6)


def test_b_keeps_the_bucket_sum(engine):
    rng = np.random.default_rng(5)
    x = rng.laplace(size=512 * 3 + 100).astype(np.float32)
    y = hvd_gradq.dequantize(hvd_gradq.quantize(x, B)).astype(np.float64)
    for s in range(0, x.size, 512):
        assert np.sum(y[s : s + 512]) == pytest.approx(np.sum(x[s : s + 512].astype(np.float64)), rel=1e-5, abs=1e-3)


def brute_pb(x: np.ndarray) -> float:
    """The minimum of -pb's objective over l1 <= l2 by brute force: on every box
    [y_a, y_a+1] x [y_b, y_b+1] (a <= b) the objective is one quadratic, so its minimum there is
    at a corner, at the vertex of an edge (the other level held at the box's side) or at the
    stationary point; every such point of every box is evaluated by the definition (pb_error),
    with a few extra ones (the mean as both levels, min and max)."""
    y = np.sort(np.asarray(x, np.float64))
    w = y.size
    pts = [(y[0], y[0]), (y[-1], y[-1]), (y.mean(), y.mean()), (y[0], y[-1])]
    for a in range(w - 1):
        for b in range(a, w - 1):
            u0, u1, v0, v1 = y[a], y[a + 1], y[b], y[b + 1]
            below, above = y[: a + 1], y[b + 1 :]
            mid = y[a + 1 : b + 1]
            na, nb, nc = below.size, mid.size, above.size
            sa, sb, sc = below.sum(), mid.sum(), above.sum()
            pts += [(u0, v0), (u0, v1), (u1, v0), (u1, v1)]
            for l1 in (u0, u1):  # dF/dl2 = 2 nc l2 - 2 sc - nb l1 + sb
                if nc:
                    pts.append((l1, min(max((2 * sc + nb * l1 - sb) / (2 * nc), v0), v1)))
            for l2 in (v0, v1):  # dF/dl1 = 2 na l1 - 2 sa - nb l2 + sb
                pts.append((min(max((2 * sa + nb * l2 - sb) / (2 * na), u0), u1), l2))
            m = np.array([[2.0 * na, -nb], [-nb, 2.0 * nc]])
            if np.linalg.det(m) > 0:
                l1, l2 = np.linalg.solve(m, [2 * sa - sb, 2 * sc - sb])
                if u0 <= l1 <= u1 and v0 <= l2 <= v1:
                    pts.append((l1, l2))
    return min(pb_error(x, l1, l2) for l1, l2 in pts if l1 <= l2)


def test_pb_levels_are_the_exact_minimum():
    """-pb's levels against the brute force, on buckets of 2 .. 24 with heavy tails, skew,
    two modes and ties; random level pairs never do better."""
    rng = np.random.default_rng(8)
    worst = 0.0
    for trial in range(240):
        w = int(rng.integers(2, 25))
        x = list(DISTS.values())[trial % len(DISTS)](rng, w).astype(np.float32)
        if trial % 4 == 0:
            x = (np.round(x * 2) / 2).astype(np.float32)  # ties
        x64 = x.astype(np.float64)
        scale = float(np.sum((x64 - x64.mean()) ** 2)) + 1e-30
        lv = search.pb_levels_f64(np.sort(x64)[None, :])[0]
        assert x.min() <= lv[0] <= lv[1] <= x.max()
        got, best = pb_error(x, lv[0], lv[1]), brute_pb(x)
        # float64 rounding of the objective from prefix sums: a few ulp of sum (x - min)^2
        tol = 1e-9 * best + 1e-12 * w * float(x64.max() - x64.min()) ** 2
        assert abs(got - best) <= tol, f"w={w}: {got!r} vs brute force {best!r}"
        worst = max(worst, (got - best) / scale)
        for a, b in rng.uniform(x.min(), x.max(), size=(100, 2)):
            assert pb_error(x, min(a, b), max(a, b)) >= got - tol
    assert worst < 1e-9


def test_pb_random_buckets_against_the_brute_force():
    """The strips' early stop and the one-pointer staircase on buckets that stress them: tight
    clusters beside an outlier (the minimum in a low strip), exact duplicates, two values, a
    1e-20 .. 1e20 spread of magnitudes, one-sided data, and every width from 2 to 40; both the
    compiled search and its Python source."""
    rng = np.random.default_rng(31)
    makers = [
        lambda w: rng.standard_normal(w),
        lambda w: np.concatenate([rng.normal(0.0, 1e-6, w - 1), [50.0]])[rng.permutation(w)],
        lambda w: np.concatenate([[-50.0], rng.normal(0.0, 1e-6, w - 1)])[rng.permutation(w)],
        lambda w: rng.integers(-3, 4, w).astype(np.float64),
        lambda w: np.where(rng.random(w) < 0.8, -1.0, 2.0),
        lambda w: np.sign(rng.standard_normal(w)) * 10.0 ** rng.uniform(-20, 20, w),
        lambda w: rng.exponential(size=w),
        lambda w: -rng.exponential(size=w),
    ]
    for trial in range(320):
        w = 2 + trial % 39
        x = makers[trial % len(makers)](w).astype(np.float32)
        x64 = x.astype(np.float64)
        ys = np.sort(x64)[None, :]
        best = brute_pb(x)
        tol = 1e-9 * best + 1e-12 * w * float(x64.max() - x64.min()) ** 2
        # the levels are found on points shifted to start at 0 and shifted back: a rounding of
        # the bucket's span may cross its ends
        slack = 1e-15 * float(x64.max() - x64.min())
        for compiled in (True, False):
            lv = search.pb_levels_f64(ys, compiled=compiled)[0]
            assert x.min() - slack <= lv[0] <= lv[1] <= x.max() + slack
            got = pb_error(x, lv[0], lv[1])
            assert abs(got - best) <= tol, f"trial {trial}, w={w}, compiled={compiled}: {got!r} vs {best!r}"


def test_pb_full_buckets_against_every_strip():
    """Buckets of 512 (the default) and 200: the search against an O(w^2) sweep written here,
    every box of every strip with all five candidates (no pointer, no early stop)."""

    def sweep(y: np.ndarray) -> float:
        w = y.size
        p = np.concatenate([[0.0], np.cumsum(y)])
        q = np.concatenate([[0.0], np.cumsum(y * y)])
        best = np.inf
        for b in range(w - 1):
            v0, v1 = y[b], y[b + 1]
            a = np.arange(b + 1)
            u0, u1 = y[a], np.where(a < b, y[np.minimum(a + 1, w - 1)], v1)
            na, sa, qa = a + 1.0, p[a + 1], q[a + 1]
            nb, sb, qb = b - a + 0.0, p[b + 1] - sa, q[b + 1] - qa
            nc, sc, qc = w - 1.0 - b, p[w] - p[b + 1], q[w] - q[b + 1]
            pts = []
            for l1 in (u0, u1):
                l2 = (2 * sc + nb * l1 - sb) / (2 * nc) if nc > 0 else np.where(sb - nb * l1 >= 0, v0, v1)
                pts.append((l1, np.clip(l2, v0, v1)))
            for l2 in (v0, v1):
                pts.append((np.clip((2 * sa + nb * l2 - sb) / (2 * na), u0, u1), np.full(a.size, l2)))
            with np.errstate(divide="ignore", invalid="ignore"):
                det = 4 * na * nc - nb * nb
                l1 = (2 * nc * (2 * sa - sb) + nb * (2 * sc - sb)) / det
                l2 = (2 * na * (2 * sc - sb) + nb * (2 * sa - sb)) / det
            ok = (det > 0) & (u0 <= l1) & (l1 <= u1) & (v0 <= l2) & (l2 <= v1)
            pts.append((np.where(ok, l1, u0), np.where(ok, l2, v0)))
            for l1, l2 in pts:
                f = (na * l1 * l1 - 2 * sa * l1 + qa) + (sb * (l1 + l2) - nb * l1 * l2 - qb) + (
                    nc * l2 * l2 - 2 * sc * l2 + qc)
                f = np.where(l1 <= l2, f, np.inf)
                best = min(best, float(f.min()))
        return best

    rng = np.random.default_rng(32)
    for dist, w in zip(DISTS, (512, 200, 512, 200, 512)):
        x = np.stack([DISTS[dist](rng, w) for _ in range(3)]).astype(np.float32)
        ys = np.sort(x, axis=1).astype(np.float64)
        lv = search.pb_levels_f64(ys)
        for r in range(3):
            y = ys[r] - ys[r, 0]
            best = sweep(y)
            got = pb_error(y, lv[r, 0] - ys[r, 0], lv[r, 1] - ys[r, 0])
            tol = 1e-9 * best + 1e-12 * w * float(y[-1]) ** 2
            assert abs(got - best) <= tol, f"{dist} w={w} row {r}: {got!r} vs the sweep's {best!r}"


def test_pb_scheme_sends_the_exact_levels(engine):
    """The levels on the wire are the exact minimiser rounded to float32, through the reference
    and the fused kernels alike (a full bucket of 64 and a tail)."""
    pb = parse_scheme("bingrad:variant=pb,bucket=64")
    x = np.random.default_rng(4).standard_t(2, 64 + 23).astype(np.float32)
    meta = np.asarray(hvd_gradq.quantize(x, pb).parts["meta"], np.float32).reshape(-1, 2)
    for r, s in enumerate(range(0, x.size, 64)):
        ys = np.sort(x[s : s + 64].astype(np.float64))[None, :]
        np.testing.assert_array_equal(meta[r], search.pb_levels_f64(ys)[0].astype(np.float32))


def test_pb_compiled_search_is_the_python_search():
    require_numba()  # else _compiled() is None and this would compare the Python source with itself
    assert search.compiled_available()
    rng = np.random.default_rng(12)
    for dist, w in zip(list(DISTS) * 3, (1, 2, 3, 5, 16, 33, 64, 100, 200, 300, 512, 512, 7, 9, 11)):
        rows = np.stack([DISTS[dist](rng, w) for _ in range(3)]).astype(np.float32)
        ys = np.sort(rows, axis=1).astype(np.float64)
        np.testing.assert_array_equal(search.pb_levels_f64(ys), search.pb_levels_f64(ys, compiled=False))


@pytest.mark.parametrize("dist", DISTS)
def test_pb_improves_its_own_objective_and_has_less_bias(dist):
    rng = np.random.default_rng(10 + list(DISTS).index(dist))
    bias_b = bias_pb = err_b = err_pb = 0.0
    for _ in range(8):
        x = DISTS[dist](rng, 512).astype(np.float32)
        b1, b2 = levels(B, x)
        p1, p2 = levels(PB, x)
        assert x.min() <= p1 <= p2 <= x.max()
        # the exact minimum of its own objective: never above -b's levels' value of it
        assert pb_error(x, p1, p2) <= pb_error(x, b1, b2) * (1 + 1e-6)
        bias_b += float(np.sum(np.abs(b_bias(x, b1, b2))))
        bias_pb += float(np.sum(np.abs(pb_bias(x, p1, p2))))
        err_b += nearest_error(x, b1, b2)
        err_pb += pb_error(x, p1, p2)
    # the trade-off: less bias, more error than -b (-b is the minimum-error binary quantizer)
    assert bias_pb < bias_b
    assert err_pb > err_b


@pytest.mark.parametrize("dist", ["gaussian", "laplace"])
def test_pb_range_is_narrower_than_b_on_light_tails(dist):
    """Minimising -pb's expected squared error does NOT widen the range: for a standard Gaussian
    the optimum a of [-a, a] solves a P(|x|<a) = E(|x|-a)+, a ~ 0.67, inside -b's +-0.80. (The
    review's "wider range" would need a objective weighting the clamp error more than the
    variance; see bench/quality/bingrad_study.py.)"""
    rng = np.random.default_rng(20)
    for _ in range(5):
        x = DISTS[dist](rng, 512).astype(np.float32)
        b1, b2 = levels(B, x)
        p1, p2 = levels(PB, x)
        assert p2 - p1 < b2 - b1


def test_pb_sampled_mean_is_the_clamped_input(engine):
    """Inside [l1, l2] -pb rounds stochastically (unbiased), outside it clamps. (Buckets of 64:
    1000 encodes of a full bucket and a tail stay cheap.)"""
    pb = parse_scheme("bingrad:variant=pb,bucket=64")
    rng = np.random.default_rng(3)
    x = rng.standard_normal(100).astype(np.float32)
    seeds = 1000
    acc = np.zeros(x.size)
    acc2 = np.zeros(x.size)
    for seed in range(seeds):
        y = hvd_gradq.dequantize(hvd_gradq.quantize(x, pb, seed=seed)).astype(np.float64)
        acc += y
        acc2 += y * y
    mean = acc / seeds
    std = np.sqrt(np.maximum(acc2 / seeds - mean**2, 0) * seeds / (seeds - 1))
    target = np.empty(x.size)
    gaps = np.empty(x.size)
    for s in range(0, x.size, 64):
        l1, l2 = levels(pb, x[s : s + 64])
        target[s : s + 64] = np.clip(x[s : s + 64], l1, l2)
        gaps[s : s + 64] = l2 - l1
    bound = 4 * std / np.sqrt(seeds) + 8 * gaps / seeds + 1e-6
    assert np.all(np.abs(mean - target) <= bound)
