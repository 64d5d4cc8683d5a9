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
    """out[i] = x[i] + e[i] (* scale) for i in [e0, e1); ``flush``: subnormals as zeros."""
    if flush:
        for i in range(e0, e1):
            b = _ftz(e[i])
            if scaled:
                b = _ftz(b * scale)
            out[i] = _ftz(_ftz(x[i]) + b)
    elif scaled:
        for i in range(e0, e1):
            out[i] = x[i] + e[i] * scale
    else:
        for i in range(e0, e1):
            out[i] = x[i] + e[i]


@njit(**_OPTS)
def residual(sent, dec, scale, scaled, flush, keep, has_keep, old, has_old, out, e0, e1):
    """out[i] = (sent[i] - dec[i]) (/ scale), or the old residual (0 without one) where that is
    not finite or keep[i] is set, for i in [e0, e1). ``out`` may be ``old`` itself. ``flush``:
    subnormals as zeros in the arithmetic (an old residual is copied as its bits, as a select does)."""
    for i in range(e0, e1):
        if flush:
            e = _ftz(_ftz(sent[i]) - _ftz(dec[i]))
            if scaled:
                e = _ftz(e / scale)
        else:
            e = sent[i] - dec[i]
            if scaled:
                e = e / scale
        bad = not (e - e == F0)  # NaN and +-inf: inf - inf is NaN
        if has_keep:
            bad = bad or keep[i]
        if bad:
            out[i] = old[i] if has_old else F0
        else:
            out[i] = e
