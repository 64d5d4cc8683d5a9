# mypy: ignore-errors
"""numba loops of error feedback's classic rule (:mod:`.feedback` holds the entry points): one
pass to compensate, one to keep the residual. Float32 throughout, in the rule's order: ``x + e * S``
and ``(sent - decoded) / S``, no fused multiply-add (no fast-math), so the bits are those of the
same operations on NumPy or torch float32 arrays."""
from __future__ import annotations

import numpy as np
from numba import njit

from ._nb_common import _OPTS

F0 = np.float32(0.0)


@njit(**_OPTS)
def compensate(x, e, scale, scaled, out, e0, e1):
    """out[i] = x[i] + e[i] (* scale) for i in [e0, e1)."""
    if scaled:
        for i in range(e0, e1):
            out[i] = x[i] + e[i] * scale
    else:
        for i in range(e0, e1):
            out[i] = x[i] + e[i]


@njit(**_OPTS)
def residual(sent, dec, scale, scaled, keep, has_keep, old, has_old, out, e0, e1):
    """out[i] = (sent[i] - dec[i]) (/ scale), or the old residual (0 without one) where that is
    not finite or keep[i] is set, for i in [e0, e1). ``out`` may be ``old`` itself."""
    for i in range(e0, e1):
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
