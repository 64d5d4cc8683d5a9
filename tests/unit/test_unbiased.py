"""Unbiased schemes are unbiased, and seeds behave: E[dequantize(quantize(x, seed))] = x over
many seeds, the same seed gives the same bytes, and deterministic schemes ignore the seed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from engines import ENGINES, set_engine

import hvd_gradq
from hvd_gradq.schemes.level import LevelScheme
from hvd_gradq.spec import parse_scheme
from hvd_gradq.xp import NUMPY

SEEDS = 1000

# (spec, elements): one full bucket (the default 512) and a tail. ORQ-5 and ORQ-9 run at their
# default bucket too: their exact level search is compiled (kernels/orq_levels.py), 1-4 ms a
# call here on either engine, so 1000 seeds no longer need the buckets of 64 they once ran on.
UNBIASED = [
    ("qsgd:levels=4,norm=max", 600),
    ("qsgd:levels=3,norm=max", 600),  # a step that is not a power of two
    ("qsgd:levels=2,norm=l2", 600),
    ("terngrad:clip=0", 600),
    ("orq:levels=3", 600),
    ("orq:levels=5", 600),
    ("orq:levels=9", 600),
    ("uniform:bits=4,rounding=stochastic", 600),  # the scatter pattern's second phase
    ("uniform:bits=3,rounding=stochastic", 600),
]


def _x(n: int = 600) -> np.ndarray:
    rng = np.random.default_rng(42)
    x = rng.laplace(size=n).astype(np.float32)
    x[7] = 0.0
    x[n - 5] = 5 * float(np.abs(x).max())  # an outlier in the tail bucket
    return x


def _neighbours(scheme: LevelScheme, payload: hvd_gradq.Payload, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two table levels around each element (its only possible decoded values)."""
    meta = np.asarray(payload.parts["meta"], np.float32).reshape(-1, scheme.meta_width)
    table = np.asarray(scheme.table(NUMPY, meta), np.float64)
    d = scheme.bucket
    lo = np.empty(x.size)
    hi = np.empty(x.size)
    for b in range(table.shape[0]):
        t = table[b]
        seg = x[b * d : (b + 1) * d].astype(np.float64)
        j = np.clip(np.searchsorted(t, seg, side="right") - 1, 0, t.size - 2)
        lo[b * d : (b + 1) * d], hi[b * d : (b + 1) * d] = t[j], t[j + 1]
    return lo, hi


def _engine(monkeypatch, engine: str) -> None:
    """The NumPy reference, or the compiled fast paths (hvd_gradq.kernels); "kernels" fails
    (never skips) without numba, which would turn it into a second reference run."""
    set_engine(monkeypatch, engine)


# Every scheme runs on both engines: the kernels have a fused compiled encoder and decoder for
# every level scheme here, ORQ at any level count included. What "reference" means for ORQ-5/9:
# the rounding, packing and decoding are the NumPy reference's, while the level search (s >= 4)
# runs compiled on both engines (HVD_GRADQ_KERNELS does not switch it; its Python source is
# checked against the compiled one in test_orq.py). Unbiasedness holds for any levels, so the
# search is not what this test is about.
CASES = [(s, n, e) for s, n in UNBIASED for e in ENGINES]


@pytest.mark.parametrize("spec,n,engine", CASES)
def test_mean_over_seeds_is_the_input(spec, n, engine, monkeypatch):
    _engine(monkeypatch, engine)
    scheme = parse_scheme(spec)
    assert scheme.unbiased
    assert scheme.bucket < n < 2 * scheme.bucket
    x = _x(n)
    acc = np.zeros(n)
    acc2 = np.zeros(n)
    first = None
    for seed in range(SEEDS):
        p = hvd_gradq.quantize(x, scheme, seed=seed)
        if first is None:
            first = p
        y = hvd_gradq.dequantize(p).astype(np.float64)
        acc += y
        acc2 += y * y
    mean = acc / SEEDS
    var = np.maximum(acc2 / SEEDS - mean**2, 0.0) * SEEDS / (SEEDS - 1)
    sigma = np.sqrt(var)
    assert first is not None
    lo, hi = _neighbours(scheme, first, x)
    xd = x.astype(np.float64)
    gap = hi - lo
    scale = float(np.abs(xd).max())
    # 4 sigma of the mean (sample std), plus a resolution term: with SEEDS draws a probability
    # below ~8/SEEDS can show no hit at all (then the sample std is 0), plus float32 rounding
    bound = 4 * sigma / np.sqrt(SEEDS) + 8 * gap / SEEDS + 4e-7 * scale
    bad = np.flatnonzero(np.abs(mean - xd) > bound)
    assert bad.size == 0, f"{spec}: biased at {bad[:5]}: mean {mean[bad[:5]]}, x {xd[bad[:5]]}"
    # the sample variance is the analytic one, (hi - x)(x - lo), bucket by bucket
    expected = (hi - xd) * (xd - lo)
    assert np.all(expected >= -1e-6 * scale**2)
    d = scheme.bucket
    for s in (slice(0, d), slice(d, n)):
        assert var[s].sum() == pytest.approx(expected[s].sum(), rel=0.08)
    # no systematic drift across elements either: where the rounding probability p is well
    # inside (0, 1) (p N and (1-p) N >= 10), the z-scores average to ~ N(0, 1/count)
    p_up = np.where(gap > 0, (xd - lo) / np.where(gap > 0, gap, 1.0), 0.0)
    ok = (p_up * SEEDS >= 10) & ((1 - p_up) * SEEDS >= 10)
    assert ok.sum() >= n // 4
    z = (mean[ok] - xd[ok]) / np.sqrt(expected[ok] / SEEDS)
    assert abs(z.mean()) < 4 / np.sqrt(ok.sum())


def _codes(p: hvd_gradq.Payload) -> bytes:
    return b"".join(np.asarray(v).tobytes() for k, v in sorted(p.parts.items()) if k != "meta")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", hvd_gradq.names())
def test_seeds(name, engine, monkeypatch):
    _engine(monkeypatch, engine)
    scheme = parse_scheme(name)
    x = _x()
    a = hvd_gradq.quantize(x, scheme, seed=1).to_bytes()
    assert hvd_gradq.quantize(x, scheme, seed=1).to_bytes() == a  # same seed, same bytes
    stochastic = scheme.draws if isinstance(scheme, LevelScheme) else False
    others = [hvd_gradq.quantize(x, scheme, seed=s) for s in (2, 3, 1 << 40, (1 << 64) - 1)]
    if stochastic:
        for o in others:
            assert _codes(o) != _codes(hvd_gradq.quantize(x, scheme, seed=1))
            assert o.to_bytes() != a
    else:  # deterministic schemes ignore the seed
        for o in others:
            assert o.to_bytes() == a


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("spec", ["bingrad:variant=pb", "topk:values=orq,ratio=0.2", "orq:levels=2"])
def test_seeds_of_stochastic_variants(spec, engine, monkeypatch):
    _engine(monkeypatch, engine)
    x = _x()
    a = hvd_gradq.quantize(x, spec, seed=5).to_bytes()
    assert hvd_gradq.quantize(x, spec, seed=5).to_bytes() == a
    assert hvd_gradq.quantize(x, spec, seed=6).to_bytes() != a


def test_nearby_seeds_give_uncorrelated_draws():
    """Codes of seeds s and s+1 agree no more often than independent draws would."""
    x = np.full(4096, 0.5, np.float32)
    x[0], x[1] = -1.0, 1.0  # levels -1, 0, 1 (qsgd levels=1): x = 0.5 rounds up with p = 1/2
    ups = [hvd_gradq.dequantize(hvd_gradq.quantize(x, "qsgd:levels=1,bucket=4096", seed=s))[2:] > 0.75
           for s in range(4)]
    for u in ups:
        assert abs(u.mean() - 0.5) < 4 * 0.5 / np.sqrt(u.size)
    for a, b in itertools.pairwise(ups):
        agree = (a == b).mean()
        assert abs(agree - 0.5) < 4 * 0.5 / np.sqrt(a.size)
