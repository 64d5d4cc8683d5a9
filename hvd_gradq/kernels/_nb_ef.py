# mypy: ignore-errors
"""numba loops of error feedback inside the encoders (:func:`hvd_gradq.kernels.encode_fed`): a
bucket compensated as it is read, and its residual written from the codes it just got, so that
compensating, checking, encoding, decoding this rank's own values and keeping the residual are
one pass over the tensor instead of five (:mod:`.feedback`'s two passes, the input check, the
encode, the own decode).

The arithmetic is the classic rule's, in its order (:mod:`._nb_feedback`; ``flush``: TensorFlow's,
every operand and result that is subnormal a zero of its sign):
``p = x + e * S`` (``x`` itself, a zero's sign kept, where there is no residual yet), and the new
residual ``(p - decoded) / S``, the old one (0 without one) where that is not finite. ``decoded``
is what the family's decoder returns for the bucket's codes (the same float32 expression), so
the residual has the bits of decoding the payload and running :func:`.feedback.residual`.

Every loop indexes views from 0 (see ``_nb_common._clip_bucket``): LLVM vectorizes them.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ._nb_common import _OPTS
from ._nb_feedback import _diff, _ftz  # the rule's (p - d) (/ scale), with or without flushing

F0 = np.float32(0.0)


@njit(inline="always", **_OPTS)
def ef_in(x, e, start, w, scale, scaled, has_e, limit, flush, pb):
    """pb[:w] = the compensated bucket ``x[start:start+w] + e[...] (* scale)``; whether every
    value is finite and of magnitude below ``limit`` (the input check of ``hvd_gradq.quantize``:
    a NaN fails the comparison)."""
    xs = x[start : start + w]
    ok = True
    if not has_e:
        for i in range(w):
            v = xs[i]
            pb[i] = v
            ok &= abs(v) < limit
        return ok
    es = e[start : start + w]
    if flush:
        for i in range(w):
            b = _ftz(es[i])
            if scaled:
                b = _ftz(b * scale)
            v = _ftz(_ftz(xs[i]) + b)
            pb[i] = v
            ok &= abs(v) < limit
    elif scaled:
        for i in range(w):
            v = xs[i] + es[i] * scale
            pb[i] = v
            ok &= abs(v) < limit
    else:
        for i in range(w):
            v = xs[i] + es[i]
            pb[i] = v
            ok &= abs(v) < limit
    return ok


@njit(inline="always", **_OPTS)
def _keep(r, o):
    """The new residual ``r``, or the old one ``o`` where ``r`` is not finite."""
    return r if r - r == F0 else o  # NaN and +-inf: inf - inf is NaN


@njit(inline="always", **_OPTS)
def _tab_loop(pb, cv, tab, s, w, es, os, scale, scaled, has_e, flush):
    """:func:`ef_out_table` over views from 0. Two levels (bingrad) decode as a select, which
    vectorizes; more, as the table lookup ``table_decode`` makes (a gather)."""
    if s == 2:
        t0, t1 = tab[0], tab[1]
        for i in range(w):
            r = _diff(pb[i], t1 if cv[i] else t0, scale, scaled, flush)
            os[i] = _keep(r, es[i] if has_e else F0)
    else:
        for i in range(w):
            r = _diff(pb[i], tab[cv[i]], scale, scaled, flush)
            os[i] = _keep(r, es[i] if has_e else F0)


@njit(inline="always", **_OPTS)
def ef_out_table(pb, cv, tab, s, w, e, eout, start, scale, scaled, has_e, flush):
    """The residual of a bucket decoded against its ``s`` levels ``tab`` (``tab[code]``: the
    levels of bingrad and orq, as ``_nb_table.table_decode``), into eout[start:start+w]."""
    os = eout[start : start + w]
    es = e[start : start + w] if has_e else os
    _tab_loop(pb, cv, tab, s, w, es, os, scale, scaled, has_e, flush)


@njit(inline="always", **_OPTS)
def ef_out_sign(pb, cv, m, w, e, eout, start, scale, scaled, has_e, flush):
    """The residual of a sign bucket (``table_decode``'s signed table [-m, m] as a select: a
    lookup in a two-entry table does not vectorize), into eout[start:start+w]."""
    os = eout[start : start + w]
    es = e[start : start + w] if has_e else os
    nm = -m
    for i in range(w):
        r = _diff(pb[i], m if cv[i] else nm, scale, scaled, flush)
        os[i] = _keep(r, es[i] if has_e else F0)


@njit(inline="always", **_OPTS)
def ef_out_even(pb, cv, lo, step, w, e, eout, start, scale, scaled, has_e, flush):
    """The residual of a bucket of evenly spaced levels (``lo + step * code``, the expression of
    ``_nb_even.even_decode``), into eout[start:start+w]."""
    os = eout[start : start + w]
    es = e[start : start + w] if has_e else os
    for i in range(w):
        r = _diff(pb[i], lo + step * np.float32(cv[i]), scale, scaled, flush)
        os[i] = _keep(r, es[i] if has_e else F0)


@njit(**_OPTS)
def compensate_checked(x, e, scale, scaled, has_e, limit, flush, e0, e1, out):
    """out[0 : e1-e0] = the compensated x[e0:e1] (as :func:`ef_in`); whether every value passed
    the input check. For the encoders that sort a chunk of compensated buckets first."""
    return ef_in(x, e, e0, e1 - e0, scale, scaled, has_e, limit, flush, out)
