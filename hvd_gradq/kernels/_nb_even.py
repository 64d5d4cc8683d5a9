# mypy: ignore-errors
"""numba kernels for evenly spaced levels (uniform, qsgd, terngrad) and for sign's encoder."""
from __future__ import annotations

import numpy as np
from numba import njit

from ._layout import L_B1
from ._nb_common import (
    _OPTS,
    F0,
    F1,
    F32_TWO63,
    FHALF,
    FNAN,
    _clip_bucket,
    _draw,
    _maxabs,
    _minmax,
    _pow2_at_least,
    _tree_of,
    f16_round,
)
from ._nb_ef import ef_in, ef_out_even, ef_out_sign
from ._nb_pack import _flush, _unit, _unpack


# ---------------------------------------------------------------------------------------------
# evenly spaced levels: uniform (amode 0: lo=min, step=(max-min)*cst), qsgd / terngrad
# (amode 1: lo=-m, step=m*cst); mmode 0: [min, max], 1: max|x|, 2: sqrt(tree_sum(x*x))
# ---------------------------------------------------------------------------------------------
@njit(**_OPTS)
def _even_codes(xb, w, lo, step, smax, stoch, sa, sb, start, cv):
    """Codes of bucket xb[:w] (first element index ``start``) into cv[:w]."""
    t0 = lo + step * F0
    t1 = lo + step * F1
    stp = t1 - t0
    if not stp > F0:
        # a flat table: j = 0 and the gap t_1 - t_0 is not positive, so p = 0: every code is 0
        for i in range(w):
            cv[i] = 0
        return
    # j = clip(int64(floor(q)), 0, s-2) computed in float32 (fewer, wider SIMD lanes): NumPy's
    # cast sends NaN and q >= 2**63 to INT64_MIN, which the clip takes to 0, hence qq.
    fsmax = np.float32(smax)
    if stoch:
        for i in range(w):
            v = xb[i]
            q = (v - t0) / stp
            qq = q if (q >= F0) & (q < F32_TWO63) else F0
            fj = min(np.floor(qq), fsmax)
            lj = lo + step * fj
            gap = (lo + step * (fj + F1)) - lj
            p = (v - lj) / (gap if gap > F0 else F1)
            p = p if gap > F0 else F0
            cv[i] = np.uint8(np.int32(fj) + (_draw(start + i, sa, sb) < p))
    else:
        for i in range(w):
            v = xb[i]
            q = (v - t0) / stp
            qq = q if (q >= F0) & (q < F32_TWO63) else F0
            fj = min(np.floor(qq), fsmax)
            lj = lo + step * fj
            gap = (lo + step * (fj + F1)) - lj
            p = (v - lj) / (gap if gap > F0 else F1)
            p = p if gap > F0 else F0
            cv[i] = np.uint8(np.int32(fj) + (p >= FHALF))


@njit(**_OPTS)
def even_encode(x, n, d, s, g, bits, lid, amode, mmode, cst, clip_c, fp16, stoch, sa, sb, meta, out, b0, b1, opos,
                ef, e, eout, scale, scaled, has_e, limit, flush):
    """Buckets b0..b1 of the n elements; their codes are packed from byte ``opos`` of ``out``
    (b0 * d a multiple of the layout's unit: :mod:`.parallel`). The draws and the meta stay
    indexed by the global element and bucket, so a range's bytes are the whole call's.

    ``ef``: ``x`` is the raw gradient, each bucket compensated with the residual ``e`` as it is
    read and its new residual written to ``eout`` (:mod:`._nb_ef`); -1 at the first bucket that
    fails the input check (finite, below ``limit``), else the end of the bytes written."""
    buf = np.empty(_pow2_at_least(d), np.float32)
    xc = np.empty(d, np.float32)
    pb = np.empty(d if ef else 1, np.float32)
    cb = np.empty(d + 2 * _unit(g, bits), np.uint8)
    pend = 0
    smax = np.int64(s - 2)
    for b in range(b0, b1):
        start = b * d
        w = min(d, n - start)
        xb = x[start : start + w]
        if ef:
            if not ef_in(x, e, start, w, scale, scaled, has_e, limit, flush, pb):
                return -1
            xb = pb[:w]
        sent = xb
        if clip_c > F0:
            _clip_bucket(xb, w, clip_c, buf, xc)
            xb = xc[:w]
        m1 = F0
        if mmode == 0:
            m0, m1 = _minmax(xb, w)
        elif mmode == 1:
            m0 = _maxabs(xb, w)
        else:
            m0 = np.sqrt(_tree_of(xb, w, 2, F0, buf))
        if fp16:
            m0 = f16_round(m0)
            m1 = f16_round(m1)
        if amode == 0:
            meta[2 * b] = m0
            meta[2 * b + 1] = m1
            lo = m0
            step = (m1 - m0) * cst
        else:
            meta[b] = m0
            lo = -m0
            step = m0 * cst
        _even_codes(xb, w, lo, step, smax, stoch, sa, sb, start, cb[pend : pend + w])
        if ef:
            ef_out_even(sent, cb[pend : pend + w], lo, step, w, e, eout, start, scale, scaled, has_e, flush)
        pend, opos = _flush(lid, s, g, bits, cb, pend + w, out, opos, n < 0)
    pend, opos = _flush(lid, s, g, bits, cb, pend, out, opos, n >= 0)
    return opos


@njit(**_OPTS)
def even_decode(meta, data, n, d, s, g, bits, lid, magic, amode, cst, b0, b1, out, acc):
    cb = np.empty(d + 2 * _unit(g, bits) + 8, np.uint8)
    wbuf = np.empty(d + 2 * _unit(g, bits), np.int64)
    for b in range(b0, b1):
        start = b * d
        w = min(d, n - start)
        if amode == 0:
            m0 = meta[2 * b]
            lo = m0
            step = (meta[2 * b + 1] - m0) * cst
        else:
            m0 = meta[b]
            lo = -m0
            step = m0 * cst
        off = _unpack(lid, s, g, bits, magic, data, start, w, cb, wbuf)
        cv = cb[off : off + w]
        ov = out[start : start + w]
        # lo + step*k is monotone in k: with lo, step and the last level finite, every level is
        last = lo + step * np.float32(s - 1)
        if lo - lo == F0 and step - step == F0 and last - last == F0:
            if acc:
                for i in range(w):
                    ov[i] += lo + step * np.float32(cv[i])
            else:
                for i in range(w):
                    ov[i] = lo + step * np.float32(cv[i])
        else:
            # a NaN meta (a bucket that held NaN/Inf): NaN, with the reference's canonical bits
            # (EvenLevelScheme.table), whatever NaN the arithmetic left
            for i in range(w):
                v = lo + step * np.float32(cv[i])
                if v != v:
                    v = FNAN
                if acc:
                    ov[i] += v
                else:
                    ov[i] = v


# ---------------------------------------------------------------------------------------------
# sign: meta = tree_sum(|x|) * (1/w), code = x >= 0
# ---------------------------------------------------------------------------------------------
@njit(**_OPTS)
def sign_encode(x, n, d, clip_c, fp16, meta, out, b0, b1, opos, ef, e, eout, scale, scaled, has_e, limit, flush):
    """Buckets b0..b1, packed from byte ``opos`` of ``out``; ``ef``..``limit`` and the value
    returned as :func:`even_encode`'s."""
    # (plain int64 and bool values, not literals: each literal would compile _flush again)
    lid, two, one, no, yes = np.int64(L_B1), np.int64(2), np.int64(1), n < 0, n >= 0
    buf = np.empty(_pow2_at_least(d), np.float32)
    xc = np.empty(d, np.float32)
    cb = np.empty(d + 16, np.uint8)
    pb = np.empty(d if ef else 1, np.float32)
    pend = 0
    for b in range(b0, b1):
        start = b * d
        w = min(d, n - start)
        xb = x[start : start + w]
        if ef:
            if not ef_in(x, e, start, w, scale, scaled, has_e, limit, flush, pb):
                return -1
            xb = pb[:w]
        sent = xb
        if clip_c > F0:
            _clip_bucket(xb, w, clip_c, buf, xc)
            xb = xc[:w]
        m = _tree_of(xb, w, 1, F0, buf) * np.float32(1.0 / w)
        if fp16:
            m = f16_round(m)
        meta[b] = m
        cv = cb[pend : pend + w]
        for i in range(w):
            cv[i] = np.uint8(xb[i] >= F0)
        if ef:  # decoded as _nb_table.table_decode's signed table
            ef_out_sign(sent, cv, m, w, e, eout, start, scale, scaled, has_e, flush)
        pend, opos = _flush(lid, two, one, one, cb, pend + w, out, opos, no)
    pend, opos = _flush(lid, two, one, one, cb, pend, out, opos, yes)
    return opos
