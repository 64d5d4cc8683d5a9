# mypy: ignore-errors
"""numba loops of error feedback's classic rule (:mod:`.feedback` holds the entry points): one
pass to compensate, one to keep the residual. Float32 throughout, in the rule's order: ``x + e * S``
and ``(sent - decoded) / S``, no fused multiply-add (no fast-math), so the bits are those of the
same operations on NumPy or torch float32 arrays; with ``flush``, those of TensorFlow's CPU
kernels, which run with flush-to-zero and denormals-are-zero (:func:`_ftz` on every operand and
result: a subnormal counts as a zero of its sign)."""
from __future__ import annotations

import numpy as np
from numba import njit

from ._nb_common import _OPTS

F0 = np.float32(0.0)
F_TINY = np.float32(np.finfo(np.float32).tiny)  # the smallest normal float32


@njit(**_OPTS)
def _ftz(v):
    """``v``, or a zero of its sign where it is subnormal (x86's FTZ/DAZ, done by hand: the bit
    is the calling thread's, set on TensorFlow's executor threads and not on others)."""
    return v * F0 if abs(v) < F_TINY else v


@njit(**_OPTS)
def compensate(x, e, scale, scaled, flush, out, e0, e1):
    """out[i] = x[i] + e[i] (* scale) for i in [e0, e1); ``flush``: subnormals as zeros. Loops
    over slices from 0: an index numba cannot prove non-negative gets a wrap-around check that
    keeps LLVM from vectorizing (5-10x slower)."""
    xs, es, os = x[e0:e1], e[e0:e1], out[e0:e1]
    if flush:
        for i in range(xs.shape[0]):
            b = _ftz(es[i])
            if scaled:
                b = _ftz(b * scale)
            os[i] = _ftz(_ftz(xs[i]) + b)
    elif scaled:
        for i in range(xs.shape[0]):
            os[i] = xs[i] + es[i] * scale
    else:
        for i in range(xs.shape[0]):
            os[i] = xs[i] + es[i]


@njit(inline="always", **_OPTS)
def _diff(s, d, scale, scaled, flush):
    """(s - d) (/ scale), subnormals as zeros with ``flush``."""
    if flush:
        e = _ftz(_ftz(s) - _ftz(d))
        if scaled:
            e = _ftz(e / scale)
    else:
        e = s - d
        if scaled:
            e = e / scale
    return e


@njit(inline="always", **_OPTS)
def _residual_loop(ss, ds, scale, scaled, flush, ks, has_keep, rs, has_res, ol, has_old, os):
    """:func:`residual` over slices from 0, each flag a constant where it is inlined (one loop
    a case, vectorized: a select, not a branch)."""
    for i in range(ss.shape[0]):
        e = _diff(ss[i], ds[i], scale, scaled, flush)
        bad = not (e - e == F0)  # NaN and +-inf: inf - inf is NaN
        if has_keep:
            bad = bad or ks[i]
        if has_res:
            r = rs[i]
            bad = bad or not (r - r == F0)
        o = ol[i] if has_old else F0
        os[i] = o if bad else e


@njit(**_OPTS)
def residual(sent, dec, scale, scaled, flush, keep, has_keep, res, has_res, old, has_old, out, e0, e1):
    """out[i] = (sent[i] - dec[i]) (/ scale), or the old residual (0 without one) where that is
    not finite, keep[i] is set or res[i] (the step's result) is not finite, for i in [e0, e1).
    ``out`` may be ``old`` itself. ``flush``: subnormals as zeros in the arithmetic (an old
    residual is copied as its bits, as a select does). Arrays a flag leaves out are not read."""
    ss, ds, os = sent[e0:e1], dec[e0:e1], out[e0:e1]
    ol = old[e0:e1] if has_old else os
    ks = keep[e0:e1] if has_keep else keep[:0]
    rs = res[e0:e1] if has_res else res[:0]
    if has_keep and has_res:
        _residual_loop(ss, ds, scale, scaled, flush, ks, True, rs, True, ol, has_old, os)
    elif has_keep:
        _residual_loop(ss, ds, scale, scaled, flush, ks, True, rs, False, ol, has_old, os)
    elif has_res:
        _residual_loop(ss, ds, scale, scaled, flush, ks, False, rs, True, ol, has_old, os)
    else:
        _residual_loop(ss, ds, scale, scaled, flush, ks, False, rs, False, ol, has_old, os)
