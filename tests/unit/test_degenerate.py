"""Degenerate input: empty, tiny, ragged, constant, zero, denormal, near fp16's limits, and
non-finite (NaN/Inf) under each ``nonfinite`` policy. Every test runs through the NumPy reference
and through the compiled fast paths (``hvd_gradq.kernels``, which fall back to the reference
where they have no kernel), with NumPy floating-point errors raised and warnings as errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from engines import ENGINES, set_engine

import hvd_gradq
from hvd_gradq.errors import GradqError, NonFiniteError
from hvd_gradq.schemes.level import LevelScheme
from hvd_gradq.spec import parse_scheme

ALL = [
    "none", "fp16", "uniform:bits=8", "uniform:bits=2", "qsgd:levels=1", "qsgd:levels=4",
    "qsgd:norm=l2", "terngrad", "terngrad:clip=0", "sign", "topk", "topk:values=orq",
    "bingrad", "bingrad:variant=pb", "orq:levels=2", "orq:levels=3", "orq:levels=5", "orq:levels=9",
    "uniform:scales=fp16", "orq:levels=5,scales=fp16",
]
LEVEL = [s for s in ALL if isinstance(parse_scheme(s), LevelScheme)]


@pytest.fixture(params=ENGINES, autouse=True)
def engine(request, monkeypatch):
    set_engine(monkeypatch, request.param)  # "kernels" fails without numba: never the reference twice
    return request.param


def roundtrip(x: np.ndarray, spec: str, seed: int = 0, **kw) -> np.ndarray:
    """quantize -> bytes -> parse -> dequantize, with FP errors raised (underflow aside:
    denormal arithmetic underflows by design) and every warning an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
            p = hvd_gradq.quantize(x, spec, seed=seed, **kw)
            raw = p.to_bytes()
            assert len(raw) == p.nbytes
            y = hvd_gradq.dequantize(hvd_gradq.Payload.from_bytes(raw))
    assert y.shape == np.shape(x) and y.dtype == np.asarray(x).dtype
    return y


@pytest.mark.parametrize("spec", ALL)
def test_empty(spec):
    for shape in [(0,), (0, 3), (4, 0, 2)]:
        for dt in (np.float16, np.float32, np.float64):
            assert roundtrip(np.zeros(shape, dt), spec).size == 0


@pytest.mark.parametrize("spec", ALL)
def test_one_element_is_exact(spec):
    for v in (1.5, -0.25, 0.0, 3.0):
        for shape in [(1,), (), (1, 1, 1)]:
            x = np.full(shape, v, np.float32)
            np.testing.assert_array_equal(roundtrip(x, spec, seed=7), x)


def _bucket_ranges(x: np.ndarray, d: int):
    for s in range(0, x.size, d):
        yield slice(s, min(s + d, x.size)), x[s : s + d]


@pytest.mark.parametrize("n", [1, 2, 511, 513, 1000, 1536, 1537])
def test_ragged_sizes_and_per_bucket_ranges(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * np.repeat(rng.uniform(0.1, 10, n // 512 + 1), 512)[:n]).astype(np.float32)
    # uniform: nearest of 2**bits levels from each bucket's min to max -> error <= step/2
    y = roundtrip(x, "uniform:bits=4")
    for sl, b in _bucket_ranges(x, 512):
        step = (float(b.max()) - float(b.min())) / 15
        assert np.all(np.abs(y[sl] - b) <= step / 2 * (1 + 1e-5) + 1e-6)
    # orq and bingrad decode inside their bucket's [min, max]; qsgd and terngrad inside +-max|x|
    for spec in ("orq:levels=3", "orq:levels=5", "bingrad", "bingrad:variant=pb"):
        y = roundtrip(x, spec, seed=1)
        for sl, b in _bucket_ranges(x, 512):
            assert b.min() <= y[sl].min() and y[sl].max() <= b.max(), spec
    for spec in ("qsgd:levels=2", "terngrad:clip=0"):
        y = roundtrip(x, spec, seed=1)
        for sl, b in _bucket_ranges(x, 512):
            assert np.all(np.abs(y[sl]) <= np.abs(b).max() * (1 + 1e-6)), spec


@pytest.mark.parametrize("spec", ALL)
def test_all_zero_buckets_come_back_zero(spec):
    rng = np.random.default_rng(1)
    np.testing.assert_array_equal(roundtrip(np.zeros(1000, np.float32), spec), np.zeros(1000, np.float32))
    # a zero bucket between two others
    x = rng.standard_normal(1536).astype(np.float32)
    x[512:1024] = 0.0
    y = roundtrip(x, spec, seed=2)
    if spec.startswith("topk"):
        return  # top-k keeps a share of the whole tensor, not of a bucket
    assert np.all(y[512:1024] == 0.0), spec


CONSTANT_EXACT = ["uniform:bits=8", "uniform:bits=2", "qsgd:levels=1", "qsgd:levels=4", "terngrad", "terngrad:clip=0",
                  "bingrad", "bingrad:variant=pb", "orq:levels=2", "orq:levels=3", "orq:levels=5", "orq:levels=9",
                  "none"]


@pytest.mark.parametrize("spec", CONSTANT_EXACT)
def test_constant_buckets_come_back_exactly(spec):
    for c in (0.375, -3.0, 1e-3, 1234.5):
        x = np.full(1000, c, np.float32)  # a full bucket and a tail, both constant
        np.testing.assert_array_equal(roundtrip(x, spec, seed=3), x, err_msg=f"{spec} c={c}")


def test_constant_zero_is_exact_for_qsgd_l2_and_sign():
    for spec in ("qsgd:norm=l2", "sign"):
        np.testing.assert_array_equal(roundtrip(np.zeros(700, np.float32), spec), np.zeros(700, np.float32))
    # sign keeps the L1 mass of a constant bucket (to float32 rounding)
    x = np.full(1000, 0.375, np.float32)
    np.testing.assert_allclose(roundtrip(x, "sign"), x, rtol=1e-6)


@pytest.mark.parametrize("spec", ALL)
def test_denormals(spec):
    rng = np.random.default_rng(5)
    tiny = np.finfo(np.float32).smallest_subnormal
    x = (rng.standard_normal(700) * 1000 * tiny).astype(np.float32)
    x[3] = tiny
    x[4] = -tiny
    assert np.any((x != 0) & (np.abs(x) < np.finfo(np.float32).tiny))
    y = roundtrip(x, spec, seed=4)
    assert np.all(np.isfinite(y))
    # nothing blows up: decoded magnitudes stay at the scale of the input
    assert np.abs(y).max() <= np.abs(x).max() * 2 + tiny * 4


def test_fp16_limits():
    big = np.array([65504.0, -65504.0, 1.0, 6e-8, 0.0], np.float32)
    np.testing.assert_array_equal(roundtrip(big, "fp16"), big.astype(np.float16).astype(np.float32))
    for v in (65505.0, 70000.0, -1e6, 3e38):
        x = np.array([1.0, v, 2.0], np.float32)
        with pytest.raises(GradqError, match="65504"):
            hvd_gradq.quantize(x, "fp16:overflow=raise")
        y = roundtrip(x, "fp16:overflow=saturate")
        assert np.all(np.isfinite(y))
        assert y[1] == np.copysign(65504.0, v)
        assert (y[0], y[2]) == (1.0, 2.0)


def test_fp16_default_overflow_is_the_ieee_cast():
    """Horovod's Compression.fp16 casts, and torch's GradScaler relies on the resulting inf to
    lower its scale: a loss-scaled gradient of 2**18 must not stop training."""
    x = np.array([1.0, 262144.0, -70000.0, 65519.0, 65520.0, 2.0], np.float32)
    want = np.array([1.0, np.inf, -np.inf, 65504.0, np.inf, 2.0], np.float32)  # IEEE round-to-nearest
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning for the cast either
        for spec in ("fp16", "topk:ratio=1"):
            p = hvd_gradq.quantize(x, spec)
            y = hvd_gradq.dequantize(hvd_gradq.Payload.from_bytes(p.to_bytes()))
            np.testing.assert_array_equal(y, want, err_msg=spec)
    assert parse_scheme("fp16").overflow == "inf"


@pytest.mark.parametrize("spec", ["uniform:scales=fp16", "qsgd:scales=fp16", "terngrad:clip=0,scales=fp16",
                                  "sign:scales=fp16", "bingrad:scales=fp16", "bingrad:variant=pb,scales=fp16",
                                  "orq:levels=3,scales=fp16", "orq:levels=5,scales=fp16"])
def test_fp16_scales_saturate_never_inf(spec):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(1000) * 3e4).astype(np.float32)
    x[5] = 9e4
    x[700] = -2e5
    y = roundtrip(x, spec, seed=8)
    assert np.all(np.isfinite(y)), spec
    assert np.abs(y).max() <= 65504.0 * (1 + 1e-6)  # (levels from saturated scales, float32 arithmetic)


def _with(spec: str, option: str) -> str:
    return spec + ("," if ":" in spec else ":") + option


@pytest.mark.parametrize("spec", ALL)
def test_nonfinite_raise_names_the_tensor(spec):
    x = np.ones(100, np.float32)
    for bad in (np.nan, np.inf, -np.inf):
        x[17] = bad
        with pytest.raises(NonFiniteError, match=r"layer3\.conv\.weight: 1 non-finite"):
            hvd_gradq.quantize(x, _with(spec, "nonfinite=raise"), name="layer3.conv.weight")


@pytest.mark.parametrize("spec", ALL)
def test_nonfinite_skip_sends_it_uncompressed(spec):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 50)).astype(np.float32)
    x[0, 1], x[2, 3], x[1, 7] = np.nan, np.inf, -np.inf
    sp = spec + ("," if ":" in spec else ":") + "nonfinite=skip"
    with pytest.warns(RuntimeWarning, match="grad.b: non-finite"):
        p = hvd_gradq.quantize(x, sp, name="grad.b")
    assert p.scheme.name == "none"
    q = hvd_gradq.Payload.from_bytes(p.to_bytes())
    y = hvd_gradq.dequantize(q)
    assert y.tobytes() == x.tobytes()  # bit for bit, NaN and Inf included


@pytest.mark.parametrize("spec", LEVEL)
def test_nonfinite_propagate(spec):
    rng = np.random.default_rng(10)
    x = rng.standard_normal(1300).astype(np.float32)
    x[600] = np.nan  # second bucket
    x[1299] = -np.inf  # the tail bucket
    sp = _with(spec, "nonfinite=propagate")
    y = roundtrip(x, sp, seed=11)
    assert np.all(np.isnan(y[512:])), "buckets holding NaN/Inf decode to NaN"
    assert np.all(np.isfinite(y[:512]))
    # the clean bucket is what a clean encode gives, whatever finite values the others hold
    clean = x.copy()
    clean[512:] = rng.standard_normal(1300 - 512).astype(np.float32)
    np.testing.assert_array_equal(y[:512], roundtrip(clean, spec, seed=11)[:512])


def test_nonfinite_default_is_propagate():
    for name in hvd_gradq.names():
        assert hvd_gradq.parse(name).policy.nonfinite.value == "propagate", name


@pytest.mark.parametrize("spec", ALL)
def test_nonfinite_default_never_crashes_nor_hides(spec):
    """The default policy on every scheme: finite in -> finite out; NaN or Inf anywhere in ->
    NaN/Inf in the output (never an error, never a silently finite result). Bucketed schemes:
    exactly the buckets that held one are NaN; none/fp16: the same values; topk: kept first."""
    rng = np.random.default_rng(12)
    base = rng.standard_normal(1300).astype(np.float32)
    assert np.all(np.isfinite(roundtrip(base, spec, seed=3)))
    level = isinstance(parse_scheme(spec), LevelScheme)
    for where in ([0], [1299], [5, 700], list(range(1300))):
        for bad in (np.nan, np.inf, -np.inf):
            x = base.copy()
            x[where] = bad
            y = roundtrip(x, spec, seed=3)
            assert not np.all(np.isfinite(y)), (spec, where, bad)
            if level:
                hit = np.zeros(1300, bool)
                for i in where:
                    hit[i // 512 * 512 : i // 512 * 512 + 512] = True
                assert np.all(np.isnan(y[hit])) and np.all(np.isfinite(y[~hit])), (spec, where, bad)
            elif spec in ("none", "fp16"):
                np.testing.assert_array_equal(y[where], x[where])
            else:  # topk: every kept slot goes to a non-finite input first
                k = parse_scheme(spec).kept(1300)
                assert np.count_nonzero(~np.isfinite(y)) == min(k, len(where)) or spec == "topk:values=orq"


def test_non_float_input_refused():
    for bad in (np.arange(5), np.array([True, False]), np.array(["a"])):
        with pytest.raises(GradqError, match="float"):
            hvd_gradq.quantize(bad, "orq")
