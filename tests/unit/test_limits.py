"""Inputs near float32's limit, and what each scheme claims about bias (issue 12).

Every level scheme computes in float32: a bucket's range (hi - lo, x - lo), a sum of |x| (sign)
or of squares (an L2 norm; ``clip`` takes its standard deviation on a row scaled down where it
would overflow, so it adds no limit). Values whose magnitude
would overflow one of those are refused with an error that says so (``scheme.limit``); below
the limit the decoded values are right. Runs with the NumPy reference and the compiled kernels.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from engines import ENGINES, set_engine

import hvd_gradq
from hvd_gradq.errors import GradqError, NonFiniteError
from hvd_gradq.schemes.level import LevelScheme
from hvd_gradq.spec import parse_scheme
from hvd_gradq.xp import NUMPY

F32_MAX = float(np.finfo(np.float32).max)
LEVEL = ["uniform:bits=8", "uniform:bits=2", "qsgd:levels=1", "qsgd:levels=4", "qsgd:norm=l2", "terngrad",
         "terngrad:clip=0", "sign", "bingrad", "bingrad:variant=pb", "orq:levels=2", "orq:levels=3", "orq:levels=5",
         "uniform:clip=2", "orq:levels=3,scales=fp16"]
HUGE = [
    [3e38, -3e38, 1.0],
    [F32_MAX, 1.0, 0.5],
    [-F32_MAX, 1.0, 0.5],
    [F32_MAX, -F32_MAX] * 256,  # a whole bucket of +-3.4e38
    [2.0**127, -1.0],
]


@pytest.fixture(params=ENGINES, autouse=True)
def engine(request, monkeypatch):
    set_engine(monkeypatch, request.param)  # "kernels" fails without numba: never the reference twice
    return request.param


def roundtrip(x: np.ndarray, spec: str, seed: int = 0) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
            p = hvd_gradq.quantize(x, spec, seed=seed)
            return hvd_gradq.dequantize(hvd_gradq.Payload.from_bytes(p.to_bytes()))


@pytest.mark.parametrize("spec", LEVEL)
def test_values_beyond_the_float32_pipeline_are_refused_clearly(spec):
    scheme = parse_scheme(spec)
    assert 0 < scheme.limit <= 2.0**127
    for vals in HUGE:
        x = np.asarray(vals, np.float32)
        sep = "," if ":" in spec else ":"
        for text in (spec, spec + sep + "nonfinite=raise"):  # the default (propagate) and raise
            with pytest.raises(GradqError, match=r"beyond what \w+ quantizes in float32") as e:
                hvd_gradq.quantize(x, text)
            assert not isinstance(e.value, NonFiniteError)  # the values are finite: not "NaN/Inf"
        # nonfinite=skip sends such a tensor uncompressed: exactly
        with pytest.warns(RuntimeWarning, match="range; sent uncompressed"):
            p = hvd_gradq.quantize(x, spec + sep + "nonfinite=skip")
        assert p.scheme.name == "none" and hvd_gradq.dequantize(p).tobytes() == x.tobytes()


@pytest.mark.parametrize("spec", LEVEL)
def test_values_just_below_the_limit_decode_right(spec):
    """At 0.99 of the limit: finite, inside the bucket's [min, max] (stochastic and nearest
    rounding never leave it; the range arithmetic cannot overflow there), the largest
    element's sign kept (QSGD used to flip +max), sign's scale finite."""
    scheme = parse_scheme(spec)
    big = np.float32(scheme.limit * 0.99)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(600).astype(np.float32)
    x[10], x[20], x[550] = big, -big, big
    for seed in range(3):
        y = roundtrip(x, spec, seed=seed)
        assert np.all(np.isfinite(y)), spec
        for sl in (slice(0, 512), slice(512, 600)):
            lo, hi = float(x[sl].min()), float(x[sl].max())
            if spec.startswith(("qsgd", "terngrad", "sign")):
                lo, hi = -max(-lo, hi), max(-lo, hi)
            if "l2" in spec:  # levels are multiples of the bucket's L2 norm
                hi = float(np.sqrt(np.sum(x[sl].astype(np.float64) ** 2)))
                lo = -hi
            if "fp16" in spec:
                lo, hi = max(lo, -65504.0), min(hi, 65504.0)
            tol = 2e-6 * max(-lo, hi)  # uniform's top level is lo + step * (s-1), float32-rounded
            assert lo - tol <= float(y[sl].min()) and float(y[sl].max()) <= hi + tol, spec
        if spec.startswith(("qsgd:levels", "terngrad:clip=0", "orq", "uniform:bits")) and "fp16" not in spec:
            assert y[10] > 0 and y[20] < 0  # the extremes are levels: decoded exactly, signs kept
            assert y[10] == pytest.approx(float(big), rel=2e-6) and y[20] == pytest.approx(-float(big), rel=2e-6)


def test_generic_encoders_mark_such_buckets_nan():
    """What a framework's graph runs (scheme.encode on its namespace; no host check): a bucket
    beyond the limit, or holding NaN/Inf, decodes as NaN, never as a wrong finite value."""
    x = np.ones(1536, np.float32)
    x[5] = 3e38  # bucket 0: beyond every limit
    x[600] = np.nan  # bucket 1
    for spec in LEVEL:
        scheme = parse_scheme(spec)
        assert isinstance(scheme, LevelScheme)
        parts = {k: np.asarray(v) for k, v in scheme.encode(NUMPY, x, 0).items()}
        y = np.asarray(scheme.decode(NUMPY, parts, x.size))
        assert np.all(np.isnan(y[:1024])), spec
        assert np.all(np.isfinite(y[1024:])), spec


def test_float64_beyond_float32_is_named_as_such():
    for spec in ("orq", "none", "fp16", "topk", "qsgd:nonfinite=raise", "sign:nonfinite=skip"):
        with pytest.raises(GradqError, match=r"finite but beyond float32's range \(largest magnitude 1e\+39") as e:
            hvd_gradq.quantize(np.array([1.0, 1e39, -2.0]), spec, name="w")
        assert not isinstance(e.value, NonFiniteError)
        assert "NaN/Inf" not in str(e.value)
    # float64 values inside float32's range are fine, and a real inf in float64 is non-finite
    assert np.isfinite(hvd_gradq.dequantize(hvd_gradq.quantize(np.array([1.0, 3e38, -2.0]), "none"))).all()
    with pytest.raises(NonFiniteError, match="NaN/Inf"):
        hvd_gradq.quantize(np.array([1.0, np.inf]), "orq:nonfinite=raise")


def test_propagate_marks_non_finite_and_huge_buckets_alike():
    x = np.random.default_rng(4).standard_normal(1536).astype(np.float32)
    x[3] = np.inf  # bucket 0: non-finite
    x[700] = 3e38  # bucket 1: finite, beyond the limit; the tensor holds an inf, so it is not refused
    for spec in ("qsgd", "orq:levels=3", "sign", "uniform"):
        y = roundtrip(x, spec)
        assert np.all(np.isnan(y[:1024])) and np.all(np.isfinite(y[1024:])), spec


# -- what each scheme claims about bias ----------------------------------------------------------
def test_unbiased_flag_accounts_for_clipping():
    assert parse_scheme("terngrad").clip == 2.5
    assert not parse_scheme("terngrad").unbiased  # the paper's default clipping biases outliers
    assert parse_scheme("terngrad:clip=0").unbiased
    for spec in ("qsgd", "orq:levels=5", "orq:levels=3", "none"):
        assert parse_scheme(spec).unbiased, spec
    for spec in ("qsgd:clip=2", "orq:levels=5,clip=2.5", "bingrad", "sign", "uniform", "fp16", "topk"):
        assert not parse_scheme(spec).unbiased, spec


def test_terngrad_default_is_biased_on_outliers():
    """The evidence behind the flag: over many seeds, an outlier's mean decoded value under the
    default clip=2.5 sits at the clipping bound, far from the input; with clip=0 it is the input."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(512).astype(np.float32)
    x[7] = 12.0  # beyond mean + 2.5 std of this bucket
    bound = float(x.mean() + 2.5 * x.std())
    for spec, target in (("terngrad", bound), ("terngrad:clip=0", 12.0)):
        ys = np.stack([hvd_gradq.dequantize(hvd_gradq.quantize(x, spec, seed=s)) for s in range(400)])
        mean = float(ys[:, 7].mean())
        stderr = float(ys[:, 7].std()) / np.sqrt(400) + 1e-6
        assert abs(mean - target) < 6 * stderr + 1e-3 * abs(target), (spec, mean, target)
    assert 12.0 - bound > 5.0


CLIPPED = ["terngrad", "uniform:clip=2", "orq:levels=3,clip=2.5", "qsgd:clip=1", "bingrad:clip=3"]


@pytest.mark.parametrize("spec", CLIPPED)
def test_clipping_huge_rows_matches_a_float64_oracle(spec):
    """Clipping takes a row's mean and standard deviation, whose float32 sum of squares would
    overflow from ~1e17 on: such rows are scaled by a power of two first. The clipped row must be
    what float64 arithmetic gives (mean +- clip*std, relative 1e-5: float32 sums of 512 terms),
    and the compiled kernels must agree with the reference to the bit (test_kernels' rule)."""
    from hvd_gradq import kernels

    scheme = parse_scheme(spec)
    rng = np.random.default_rng(11)
    for mag in (1e3, 5e16, 6e18, 1e30, 1e37):  # below, at and far beyond the old square limit
        x = np.clip(rng.standard_normal((4, 512)) * mag, -1.6e38, 1.6e38).astype(np.float32)
        x[1, 9] = np.float32(min(40 * mag, 1.7e38))  # an outlier clipping must pull in
        x[2] = np.float32(mag)  # a constant row: std 0, nothing moves
        with np.errstate(over="raise", invalid="raise"):
            got = np.asarray(scheme.clip_rows(NUMPY, x), np.float64)
        x64 = x.astype(np.float64)
        mean = x64.mean(axis=1, keepdims=True)
        std = x64.std(axis=1, keepdims=True)
        want = np.clip(x64, mean - scheme.clip * std, mean + scheme.clip * std)
        assert np.all(np.isfinite(got)), (spec, mag)
        assert np.allclose(got, want, rtol=1e-5, atol=0), (spec, mag, np.abs(got - want).max())
        assert got[1, 9] < 0.5 * float(x[1, 9]), (spec, mag)  # the outlier was pulled in
        assert np.array_equal(got[2], x64[2]), (spec, mag)
        if kernels.available():
            flat = x.reshape(-1)
            ref = scheme.encode(NUMPY, flat, 7)
            ker = kernels.encode(scheme, flat, 7)
            assert ker is not None, spec
            meta_r, meta_k = (np.asarray(p["meta"], np.float32).view(np.uint32) for p in (ref, ker))
            assert np.array_equal(meta_r, meta_k), (spec, mag)
            assert np.array_equal(np.asarray(ref["codes"]).astype(np.int64), ker["codes"].astype(np.int64)), (spec, mag)
