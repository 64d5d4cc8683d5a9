"""Error feedback inside the encoders (``kernels.encode_fed``) against the rule written out in
NumPy over the reference codec: ``p = x + e * S``, the payload of ``scheme.encode(NUMPY, p)``
with the kernels off, and the residual ``(p - decoded) / S``, the old one (0 without one) where
that is not finite. Same meta, same codes, same residual bits, for every level scheme, with and
without a residual, scaled and unscaled, on one thread and on several; and None (nothing to
keep) where the compensated gradient fails the input check."""

from __future__ import annotations

import numpy as np
import pytest
from engines import require_numba

from hvd_gradq import kernels
from hvd_gradq.spec import parse_scheme
from hvd_gradq.xp import NUMPY

SCHEMES = (
    ["uniform:bits=2", "uniform:bits=4,rounding=stochastic", "uniform:bits=8", "qsgd:levels=4,norm=l2",
     "qsgd:levels=2,norm=max", "terngrad", "sign", "bingrad", "bingrad:variant=pb"]
    + [f"orq:levels={s}" for s in (2, 3, 5, 9)]
)
OPTIONS = ["", "clip=2.5,scales=fp16", "bucket=37"]


@pytest.fixture(autouse=True)
def _kernels_on(monkeypatch: pytest.MonkeyPatch) -> None:
    require_numba()  # a dependency of the tests: fail, saying so, rather than skip
    monkeypatch.setenv("HVD_GRADQ_KERNELS", "1")


def _same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """The same float32 bits, but for the sign of a zero: a level or a min/max that is a zero may
    take the other sign than the reference's sort or reduction gives (the kernels' one documented
    corner, :mod:`hvd_gradq.kernels._numba`; subnormals flushed make such buckets), and so may a
    residual against it."""
    g, w = np.asarray(got, np.float32), np.asarray(want, np.float32)
    bad = (g.view(np.uint32) != w.view(np.uint32)) & ~((g == 0) & (w == 0))
    assert not bad.any(), f"{what}: {int(bad.sum())} differ, first at {np.nonzero(bad)[0][:5]}"


def _spec(spec: str, opt: str) -> str:
    return spec if not opt else spec + ("," if ":" in spec else ":") + opt


TINY = np.float32(np.finfo(np.float32).tiny)


def _ftz(a: np.ndarray) -> np.ndarray:
    """Subnormals as zeros of their sign: what TensorFlow's CPU kernels compute (FTZ/DAZ)."""
    a = np.asarray(a, np.float32)
    return np.where(np.abs(a) < TINY, np.copysign(np.float32(0.0), a), a).astype(np.float32)


def _oracle(scheme: object, x: np.ndarray, e: np.ndarray | None, scale: float | None,
            seed: int, flush: bool = False) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The unfused rule in NumPy over the reference codec (the kernels off); ``flush``: every
    operand and result of the rule's arithmetic with subnormals as zeros."""
    f = _ftz if flush else (lambda a: np.asarray(a, np.float32))
    s = f(np.float32(1.0 if scale is None else scale))  # a subnormal scale: a zero under DAZ
    with np.errstate(all="ignore"):
        p = x if e is None else f(f(x) + (f(f(e) * s) if scale is not None else f(e)))
    with kernels.disabled():
        parts = scheme.encode(NUMPY, p, seed)  # type: ignore[attr-defined]
        dec = np.asarray(scheme.decode(NUMPY, parts, p.shape[0]), np.float32)  # type: ignore[attr-defined]
    with np.errstate(all="ignore"):
        r = f(f(p) - f(dec))
        if scale is not None:
            r = f(r / s)
    old = np.zeros_like(x) if e is None else e
    return parts, np.where(np.isfinite(r), r, old).astype(np.float32)


def _inputs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    x[n // 3: n // 3 + 40] = 0.0  # zeros: their sign must survive a first step unchanged
    x[n // 2] = -0.0
    e = (0.1 * rng.standard_normal(n)).astype(np.float32)
    sub = rng.random(n) < 0.05  # subnormals: flushed or not, by the rule's arithmetic
    x[sub] = np.float32(3e-39) * np.sign(x[sub])
    e[rng.random(n) < 0.05] = np.float32(-2e-39)
    return x, e


@pytest.mark.parametrize("flush", [False, True])
@pytest.mark.parametrize("opt", OPTIONS)
@pytest.mark.parametrize("spec", SCHEMES)
def test_fed_encode_is_the_rule_over_the_reference(spec: str, opt: str, flush: bool) -> None:
    scheme = parse_scheme(_spec(spec, opt))
    for n in (1, 300, 2600):
        x, e = _inputs(n, n)
        for has_e, scale in ((False, None), (True, None), (True, 1024.0), (True, 0.5), (True, 1e-39)):
            ev = e if has_e else None
            out = np.full(n, np.nan, np.float32)
            got = kernels.encode_fed(scheme, x, ev, scale, 11, out, flush=flush, threads=1)
            parts, want = _oracle(scheme, x, ev, None if scale is None else float(np.float32(scale)), 11, flush)
            what = f"{scheme.spec} n={n} e={has_e} scale={scale} flush={flush}"
            assert got is not None, what
            _same(got["meta"], np.asarray(parts["meta"]), what + " meta")
            np.testing.assert_array_equal(got["codes"], np.asarray(parts["codes"]).astype(np.uint8), err_msg=what)
            _same(out, want, what + " residual")


@pytest.mark.parametrize("spec", ["uniform:bits=4", "sign", "bingrad", "orq:levels=3", "orq:levels=5"])
def test_fed_encode_same_bits_on_several_threads(spec: str) -> None:
    scheme = parse_scheme(spec)
    n = 300_001  # ranges on two or three threads, a tail bucket
    x, e = _inputs(n, 5)
    outs, payloads = [], []
    for threads in (1, 3):
        out = np.empty(n, np.float32)
        got = kernels.encode_fed(scheme, x, e, 8.0, 3, out, threads=threads)
        assert got is not None
        outs.append(out)
        payloads.append(got)
    np.testing.assert_array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    for k in ("meta", "codes"):
        np.testing.assert_array_equal(payloads[0][k].view(np.uint8), payloads[1][k].view(np.uint8))
    parts, want = _oracle(scheme, x, e, 8.0, 3)
    np.testing.assert_array_equal(outs[0].view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(payloads[0]["codes"], np.asarray(parts["codes"]).astype(np.uint8))


@pytest.mark.parametrize("spec", ["uniform:bits=4", "sign", "bingrad", "orq:levels=3", "orq:levels=5"])
def test_fed_encode_declines_what_the_input_check_refuses(spec: str) -> None:
    """NaN/Inf and values beyond the scheme's float32 range (in x, or made by adding e) are left
    to the unfused path, which applies the policy's ``nonfinite``: None, whatever the bucket."""
    scheme = parse_scheme(spec)
    x, e = _inputs(5000, 1)
    for at in (0, 2600, 4999):
        for bad_x, bad_e in ((np.nan, 0.0), (np.inf, 0.0), (0.0, np.nan), (3e38, 3e38)):
            xb, eb = x.copy(), e.copy()
            xb[at] += np.float32(bad_x)
            eb[at] = np.float32(bad_e)
            assert kernels.encode_fed(scheme, xb, eb, None, 0, np.empty_like(x), threads=1) is None, (at, bad_x)
    big = x.copy()
    big[10] = np.float32(scheme.limit) if np.isfinite(scheme.limit) else np.float32(np.inf)
    assert kernels.encode_fed(scheme, big, None, None, 0, np.empty_like(x), threads=1) is None


def test_fed_encode_refuses_bad_arrays() -> None:
    scheme = parse_scheme("sign")
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError, match="other than e"):
        kernels.encode_fed(scheme, x, x, None, 0, x)
    with pytest.raises(ValueError, match="float32 array of 10"):
        kernels.encode_fed(scheme, x, np.ones(9, np.float32), None, 0, np.empty(10, np.float32))
