"""The compiled fast paths (hvd_gradq/kernels) against the NumPy reference: bit-identical metas,
packed bytes and decoded floats for every level scheme, on inputs with tails, zero and constant
buckets, outliers, clipping and fp16 scales."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from engines import require_numba

from hvd_gradq import dequantize, kernels, quantize
from hvd_gradq.spec import parse_scheme
from hvd_gradq.xp import NUMPY


# numba is a dependency of the tests (scripts/setup.sh installs it): without it every test here
# fails, saying so, rather than skip. HVD_GRADQ_KERNELS=0 in the environment does not skip
# either: the fixture below turns the kernels on, so a comparison can never silently run the
# reference against itself.
@pytest.fixture(autouse=True)
def _kernels_on(monkeypatch: pytest.MonkeyPatch) -> None:
    require_numba()
    monkeypatch.setenv("HVD_GRADQ_KERNELS", "1")

SCHEMES = (
    [f"uniform:bits={b}" for b in range(1, 9)]
    + [f"uniform:bits={b},rounding=stochastic" for b in (1, 3, 4, 8)]
    + [f"qsgd:levels={q},norm={nm}" for q in (1, 2, 4) for nm in ("max", "l2")]
    + ["terngrad", "terngrad:clip=0", "sign", "bingrad", "bingrad:variant=pb"]
    + [f"orq:levels={s}" for s in range(2, 10)]
    + ["orq:levels=17"]  # the most levels the dynamic programs choose
    + ["orq:levels=18", "orq:levels=33"]  # the greedy levels (beyond the dynamic programs)
)
OPTIONS = ["", "clip=2.5", "scales=fp16", "clip=0.7,scales=fp16", "bucket=100", "bucket=37,clip=1"]


def _with(spec: str, opt: str) -> str:
    if not opt:
        return spec
    if "clip=" in spec and "clip=" in opt:
        opt = ",".join(o for o in opt.split(",") if not o.startswith("clip="))
        if not opt:
            return spec
    return spec + ("," if ":" in spec else ":") + opt


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    mixed = rng.standard_normal(2600).astype(np.float32)
    mixed[512:1024] = 0.0  # a zero bucket
    mixed[1024:1536] = -1.5  # a constant bucket
    mixed[1700] = 3e4  # an outlier
    mixed[1800:1810] = 1e-30  # tiny values next to large ones
    heavy = rng.standard_cauchy(1031).astype(np.float32)
    return [mixed, heavy, rng.standard_normal(7).astype(np.float32), np.float32([0.25]), np.zeros(0, np.float32)]


INPUTS = _inputs()


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind == "f":
        return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return a.astype(np.int64)


def _assert_same(a: np.ndarray, b: np.ndarray, what: str) -> None:
    a, b = _bits(a), _bits(b)
    assert a.shape == b.shape, f"{what}: shapes {a.shape} != {b.shape}"
    bad = np.nonzero(a != b)[0]
    assert bad.size == 0, f"{what}: {bad.size} differ, first at {bad[:5]}"


def _check(spec: str, x: np.ndarray, seed: int = 12345) -> None:
    scheme = parse_scheme(spec)
    got = kernels.encode(scheme, x, seed)
    assert got is not None, spec
    ref = scheme.encode(NUMPY, x, seed)
    what = f"{spec} n={x.size}"
    _assert_same(ref["meta"], got["meta"], what + " meta")
    assert got["codes"].dtype == np.uint8
    _assert_same(ref["codes"], got["codes"], what + " codes")
    dref = scheme.decode(NUMPY, {k: np.asarray(v) for k, v in ref.items()}, x.size)
    dgot = kernels.decode(scheme, got, x.size)
    assert dgot is not None and dgot.dtype == np.float32
    _assert_same(dref, dgot, what + " decoded")


@pytest.mark.parametrize("base", SCHEMES)
def test_bit_identical_to_reference(base: str) -> None:
    for opt in OPTIONS:
        spec = _with(base, opt)
        for x in INPUTS:
            _check(spec, x)


def _dp_inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(19)
    const = rng.standard_normal(700).astype(np.float32)
    const[:130] = 0.75  # constant buckets (and parts of buckets) at every bucket width below
    const[300:420] = 0.0
    const[600:700] = -2.0
    # a few distinct values (+ 0.0: no -0.0, which the kernels' and the reference's sorts may put
    # at different places among the +0.0s, so that a zero level can differ in its sign)
    ties = np.round(rng.standard_normal(650) * 2.0).astype(np.float32) + np.float32(0.0)
    t2 = rng.standard_t(2, 1100).astype(np.float32)  # heavy tails
    return [rng.standard_normal(902).astype(np.float32), const, ties, t2, (t2[:303] * 1e-3).astype(np.float32)]


DP_INPUTS = _dp_inputs()


@pytest.mark.parametrize(
    "spec",
    [
        # the exact level search (orq_levels) in the fused kernel against the reference's host
        # call, at several buckets and levels; tails of n % bucket points, some shorter than s
        "orq:levels=9,bucket=8",
        "orq:levels=9,bucket=37",
        "orq:levels=9,bucket=64",
        "orq:levels=9,bucket=65",
        "orq:levels=9,bucket=100",
        "orq:levels=9,bucket=300",
        "orq:levels=4,bucket=65",
        "orq:levels=5,bucket=64,clip=1.5",
        "orq:levels=6,bucket=130,scales=fp16",
        "orq:levels=17,bucket=64",
        "orq:levels=17,bucket=65",
        "orq:levels=17,bucket=200,clip=2,scales=fp16",
        "orq:levels=12,bucket=97,clip=0.5",
    ],
)
def test_dynamic_program_levels_bit_identical(spec: str) -> None:
    d = parse_scheme(spec).bucket
    for x in DP_INPUTS:
        _check(spec, x)
    # tails of 1, 2, 3 and s-1 points after two full buckets
    base = DP_INPUTS[3]
    for tail in (1, 2, 3, parse_scheme(spec).symbols - 1):
        if 2 * d + tail <= base.size:
            _check(spec, base[: 2 * d + tail], seed=tail)


def test_many_buckets_and_seeds() -> None:
    # several full buckets, a long code stream (units straddle buckets), other seeds
    x = (np.random.default_rng(3).standard_normal(40 * 512 + 333) * 1e-3).astype(np.float32)
    for spec in ("qsgd", "terngrad", "orq:levels=3", "bingrad:variant=pb", "uniform:bits=3", "qsgd:levels=2"):
        scheme = parse_scheme(spec)
        for seed in (0, 2**40 + 17):
            ref = scheme.encode(NUMPY, x, seed)
            got = kernels.encode(scheme, x, seed)
            assert got is not None
            _assert_same(ref["meta"], got["meta"], spec)
            _assert_same(ref["codes"], got["codes"], spec)


def test_out_buffers_and_wire_dtypes() -> None:
    x = np.random.default_rng(5).standard_normal(1500).astype(np.float32)
    scheme = parse_scheme("qsgd:scales=fp16")
    sec = {s.name: s for s in scheme.sections(x.size)}
    out = {"meta": np.empty(sec["meta"].count, np.float32), "codes": np.empty(sec["codes"].count, np.uint8)}
    got = kernels.encode(scheme, x, 1, out=out)
    assert got is not None and got["meta"] is out["meta"] and got["codes"] is out["codes"]
    # decode takes the wire's float16 meta and int64 byte values as the reference returns them
    ref = scheme.encode(NUMPY, x, 1)
    wire = {"meta": np.asarray(ref["meta"]).astype(np.float16), "codes": np.asarray(ref["codes"])}
    dst = np.empty(x.size, np.float32)
    assert kernels.decode(scheme, wire, x.size, out=dst) is dst
    _assert_same(scheme.decode(NUMPY, {k: np.asarray(v) for k, v in ref.items()}, x.size), dst, "decode")
    with pytest.raises(ValueError):
        kernels.encode(scheme, x, 1, out={"meta": np.empty(7, np.float32)})


def test_no_fast_path_for_other_schemes() -> None:
    x = np.ones(10, np.float32)
    for spec in ("none", "fp16", "topk"):
        assert kernels.encode(parse_scheme(spec), x, 0) is None
    assert kernels.decode(parse_scheme("qsgd"), {"meta": np.zeros(5, np.float32), "codes": np.zeros(1, np.uint8)}, 10) is None


def test_api_uses_the_fast_path_with_the_same_bytes() -> None:
    x = np.random.default_rng(9).standard_normal((37, 41)).astype(np.float32)
    for spec in ("orq:levels=3", "qsgd:levels=2,scales=fp16", "bingrad"):
        p = quantize(x, spec, seed=4)
        scheme = parse_scheme(spec)
        ref = scheme.encode(NUMPY, x.reshape(-1), 4)
        _assert_same(ref["codes"], p.parts["codes"], spec)
        back = dequantize(p)
        want = scheme.decode(NUMPY, {k: np.asarray(v) for k, v in ref.items()}, x.size)
        _assert_same(want, back.reshape(-1), spec)


def test_fp16_scales_round_like_the_reference() -> None:
    from hvd_gradq.kernels import _numba

    bits = np.arange(0, 1 << 32, 65537, dtype=np.uint64).astype(np.uint32)
    edge = np.float32([0.0, -0.0, 65504, 65519.996, 65520, -65520, 6.1035156e-05, 6.097555e-05, 2.9802322e-08,
                       2.9802326e-08, 5.9604645e-08, 1e-45, 3e38, np.inf, -np.inf])
    vals = np.concatenate([bits.view(np.float32), edge])
    vals = vals[~np.isnan(vals)]
    vals = vals[:: max(1, vals.size // 20000)]
    want = np.asarray(parse_scheme("qsgd:scales=fp16").round_meta(NUMPY, vals), np.float32)
    got = np.array([_numba.f16_round(v) for v in vals], np.float32)
    _assert_same(want, got, "fp16 scales")


def test_imports_without_numba() -> None:
    code = ("import sys; sys.modules['numba'] = None; import numpy as np, hvd_gradq; "
            "from hvd_gradq import kernels; assert not kernels.available(); "
            "p = hvd_gradq.quantize(np.arange(9, dtype=np.float32), 'qsgd'); print(hvd_gradq.dequantize(p)[0])")
    env = dict(os.environ)
    subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)


def test_disabled_block_runs_the_reference() -> None:
    x = np.random.default_rng(3).standard_normal(700).astype(np.float32)
    scheme = parse_scheme("orq:levels=3")
    assert kernels.available()
    with kernels.disabled():
        assert not kernels.available()
        assert kernels.encode(scheme, x, 0) is None
        with kernels.disabled():  # nests
            pass
        assert not kernels.available()
    assert kernels.available() and kernels.encode(scheme, x, 0) is not None


NAN_SPECS = ["uniform:bits=8", "uniform:bits=2", "qsgd:levels=1", "qsgd:levels=4", "qsgd:norm=l2", "terngrad",
             "terngrad:clip=0", "sign", "bingrad", "bingrad:variant=pb", "orq:levels=2", "orq:levels=3",
             "orq:levels=5", "uniform:clip=2", "orq:levels=3,scales=fp16", "qsgd:levels=100", "orq:levels=200",
             "uniform:bits=4,scales=fp16"]


@pytest.mark.parametrize("spec", NAN_SPECS)
def test_nan_buckets_decode_bit_identically(spec):
    """Buckets marked NaN (nonfinite=propagate) decode to the same bits in the NumPy reference
    and the compiled kernels (qsgd's -m flips a NaN's sign: both paths write one canonical NaN)."""
    rng = np.random.default_rng(6)
    scheme = parse_scheme(spec)
    xs = [rng.standard_normal(1300).astype(np.float32) for _ in range(3)]
    xs[0][3], xs[1][700], xs[2][1299] = np.nan, -np.inf, np.inf
    ps = [quantize(x, scheme, seed=i) for i, x in enumerate(xs)]
    ref = [np.asarray(scheme.decode(NUMPY, {k: (v.astype(np.int64) if v.dtype == np.uint8 else v)
                                              for k, v in p.parts.items()}, 1300), np.float32) for p in ps]
    for p, r in zip(ps, ref):
        fast = kernels.decode(scheme, p.parts, 1300)
        assert fast is not None and fast.tobytes() == r.tobytes(), spec


@pytest.mark.parametrize("nrows", [5, 8, 45, 67])
@pytest.mark.parametrize("w", [1, 2, 7, 128, 512, 1000, 2049])
def test_bucket_sort_is_a_sort(w, nrows):
    """The sorted-level schemes' bucket sort (bitonic over 32 buckets at once, or an LSD radix
    sort for a few buckets and wide ones) against NumPy's sort: the same values in the same
    order, with -0.0 before +0.0 (IEEE total order). ``nrows`` covers both paths and a partial
    group of lanes."""
    from hvd_gradq.kernels import _nb_sort

    rng = np.random.default_rng([w, nrows])
    makers = [lambda: rng.standard_normal(w), lambda: rng.standard_t(2, w) * 1e30,
              lambda: rng.integers(-3, 4, w).astype(np.float64), lambda: np.full(w, 2.5),
              lambda: rng.choice([0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38], w)]
    x = np.stack([makers[r % len(makers)]() for r in range(nrows)]).astype(np.float32)
    out = np.empty_like(x)
    _nb_sort.sort_rows(x, out)
    radix = np.empty_like(x)
    _nb_sort._sort_radix(x, radix)
    assert out.tobytes() == radix.tobytes()  # both sorts: the same bits
    for src, got in zip(x, out):
        want = np.sort(src)
        assert np.array_equal(got, want), (w, src)  # as floats: -0.0 == +0.0
        bits = got.view(np.int32).astype(np.int64)
        keys = np.where(bits < 0, -(bits & 0x7FFFFFFF) - 1, bits)  # total order: -0.0 is -1, +0.0 is 0
        assert np.all(np.diff(keys) >= 0)
        assert sorted(src.view(np.uint32).tolist()) == sorted(got.view(np.uint32).tolist())  # a permutation


def test_input_scan_is_numpys():
    """quantize's input check in one compiled pass (kernels.scan) against NumPy's min/max."""
    require_numba()
    lim = float(np.float32(2.0**126))
    cases = [np.zeros(0), np.array([-0.0, 0.0]), np.array([1.0, np.nan, 2.0]), np.array([np.inf, 1.0]),
             np.array([-np.inf]), np.array([lim, 0.0]), np.array([-np.nextafter(np.float32(lim), np.float32(0))]),
             np.array([1e-45, -1e-45]), np.random.default_rng(0).standard_normal(1001) * 1e30]
    for c in cases:
        x = np.asarray(c, np.float32)
        with np.errstate(invalid="ignore"):
            want = (True, True) if x.size == 0 else (
                bool(np.isfinite(x).all()), bool(np.isfinite(x).all() and np.abs(x).max() < lim))
        assert kernels.scan(x, lim) == want, x[:4]


@pytest.mark.parametrize("spec", NAN_SPECS + ["orq:levels=9", "bingrad:bucket=100"])
def test_accumulating_decode_is_numpys_sum(spec):
    """``decode(..., out=total, acc=True)`` adds the decoded values to ``total`` in place with the
    bits of NumPy's ``total + decoded`` (the sum over ranks in one buffer: reduce/codec.py),
    NaN/Inf buckets and several threads' ranges included; without ``out`` it refuses."""
    rng = np.random.default_rng(11)
    scheme = parse_scheme(spec)
    n = 2 * 65536 + 777  # two threads' ranges and a tail
    xs = [rng.standard_normal(n).astype(np.float32) * np.float32(10.0 ** k) for k in range(3)]
    xs[1][5], xs[2][70000] = np.nan, np.inf  # NaN buckets in two payloads, one shared position apart
    ps = [quantize(x, scheme, seed=i) for i, x in enumerate(xs)]
    decoded = [kernels.decode(scheme, p.parts, n) for p in ps]
    assert all(d is not None for d in decoded)
    want = decoded[0].copy()
    for d in decoded[1:]:
        want = want + d
    for threads in (1, 2):
        total = decoded[0].copy()
        for p in ps[1:]:
            assert kernels.decode(scheme, p.parts, n, out=total, acc=True, threads=threads) is total
        assert total.tobytes() == want.tobytes(), (spec, threads)
    with pytest.raises(ValueError, match="acc=True adds to out"):
        kernels.decode(scheme, ps[0].parts, n, acc=True)
