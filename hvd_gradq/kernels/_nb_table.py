# mypy: ignore-errors
"""numba kernels for level tables: encoders whose levels come from the bucket (bingrad; orq
sorted, with the exact level search, or with 2 or 3 levels unsorted) and decoding against a
per-bucket table (sign, bingrad, orq)."""
from __future__ import annotations

import numpy as np
from numba import njit

from ._nb_common import _OPTS, F0, _clip_bucket, _f64_to_i64, _fmax, _fmin, _minmax, _pow2_at_least, f16_round
from ._nb_ef import compensate_checked, ef_in, ef_out_table  # noqa: F401  (re-exported for levels.py)
from ._nb_levels import _best_level, _exact_sum_ok, _f2i, _key, _kth, _scan, _scan_exact, _table_codes, _two_means
from ._nb_pack import _flush, _unit, _unpack
from ._nb_search import bingrad_pb, orq_exact
from ._nb_sort import sort_rows  # noqa: F401  (re-exported: levels.py sorts through this module)


@njit(**_OPTS)
def sorted_encode(kind, param, x, xoff, srt, n, d, b0, b1, s, g, bits, lid, clip_c, fp16, stoch,
                  sa, sb, meta, out, state, cb, ef, e, eout, scale, scaled, has_e, flush):
    """bingrad (kind 2; param 1: pb) or orq with 4 levels or more (kind 4: orq_exact) for
    buckets b0..b1, whose values start at element ``xoff`` of ``x`` and whose sorted values are
    the rows of ``srt``; packing state (pending codes, output position) in state/cb.

    ``ef``: ``x`` holds the compensated values (``_nb_ef.compensate_checked``, before the sort),
    and each bucket's new residual is written to ``eout`` from its codes (``e``..``has_e`` as
    ``_nb_even.even_encode``'s)."""
    buf = np.empty(_pow2_at_least(d), np.float32)
    xc = np.empty(d, np.float32)
    ys = np.empty(d, np.float64)
    ta = np.empty(d + 1, np.float64)
    tb = np.empty(d + 1, np.float64)
    pre = np.empty(d + 1, np.float64)
    score = np.empty(d, np.float64)
    inv = np.empty(d + 1, np.float64)
    invr = np.empty(d + 1, np.float64)
    winv = -1
    lv = np.empty(max(s, 2), np.float64)
    tab = np.empty(max(s, 2), np.float32)
    jb = np.empty(d, np.int32)
    lob = np.empty(d, np.float32)
    hib = np.empty(d, np.float32)
    # the exact level search's scratch (kind 4), as orq_levels.scratch allocates it
    dp = kind == 4
    dpd = d if dp or (kind == 2 and param == 1) else 1
    pbo = np.empty((1, 2), np.float64)
    y = np.empty(dpd, np.float64)
    p1 = np.empty(dpd + 1, np.float64)
    p2 = np.empty(dpd + 1, np.float64)
    hh = np.empty(dpd, np.float64)
    fa = np.empty(dpd, np.float64)
    fb = np.empty(dpd, np.float64)
    gg = np.empty(dpd, np.float64)
    dargs = np.empty((max(s - 3, 1), dpd), np.int64)
    path = np.empty((1, max(s, 2)), np.int64)
    pend = state[0]
    opos = state[1]
    for b in range(b0, b1):
        start = b * d
        w = min(d, n - start)
        xb = x[start - xoff : start - xoff + w]
        sent = xb
        row = srt[b - b0]
        if clip_c > F0:
            lo_c, hi_c = _clip_bucket(xb, w, clip_c, buf, xc)
            xb = xc[:w]
            for i in range(w):
                ys[i] = np.float64(_fmin(_fmax(row[i], lo_c), hi_c))
        else:
            for i in range(w):
                ys[i] = np.float64(row[i])
        if dp:
            orq_exact(ys[:w].reshape((1, w)), s, path, y, p1, p2, hh, fa, fb, gg, dargs)
            for k in range(s):
                lv[k] = ys[path[0, k]]
            ex = -1
        else:
            ex = _exact_sum_ok(xb, w)
            if ex >= 0:
                _scan_exact(ys, w, ex, pre)
            else:
                _scan(ys, w, ta, tb, pre)
        if kind == 2:
            if w != winv:
                winv = w
                for i in range(w - 1):
                    inv[i] = 1.0 / np.float64(i + 1)
                    invr[i] = 1.0 / np.float64(w - 1 - i)
            if param == 1:  # pb: the exact minimiser (bingrad_pb), not the 2-means
                bingrad_pb(ys[:w].reshape((1, w)), pbo, y, p1, p2)
                l1 = pbo[0, 0]
                l2 = pbo[0, 1]
            else:
                l1, l2 = _two_means(ys, pre, w, score, inv, invr)
            lv[0] = l1
            lv[1] = l2
        for k in range(s):
            t = np.float32(lv[k])
            if fp16:
                t = f16_round(t)
            tab[k] = t
            meta[b * s + k] = t
        _table_codes(xb, w, tab, s, stoch, sa, sb, start, lob, hib, jb, cb[pend : pend + w])
        if ef:
            ef_out_table(sent, cb[pend : pend + w], tab, s, w, e, eout, start, scale, scaled, has_e, flush)
        pend, opos = _flush(lid, s, g, bits, cb, pend + w, out, opos, n < 0)
    state[0] = pend
    state[1] = opos



@njit(**_OPTS)
def orq_small_encode(x, n, d, s, g, bits, lid, clip_c, fp16, sa, sb, meta, out, b0, b1, opos,
                     ef, e, eout, scale, scaled, has_e, limit, flush):
    """Buckets b0..b1, packed from byte ``opos`` of ``out``; ``ef``..``limit`` and the value
    returned as ``_nb_even.even_encode``'s."""
    buf = np.empty(_pow2_at_least(d), np.float32)
    fbuf = np.empty(_pow2_at_least(d), np.float64)
    xc = np.empty(d, np.float32)
    ys = np.empty(d, np.float64)
    ta = np.empty(d + 1, np.float64)
    tb = np.empty(d + 1, np.float64)
    pre = np.empty(d + 1, np.float64)
    tab = np.empty(3, np.float32)
    jb = np.empty(d, np.int32)
    lob = np.empty(d, np.float32)
    hib = np.empty(d, np.float32)
    cb = np.empty(d + 2 * _unit(g, bits) + 8, np.uint8)
    lv = np.empty(3, np.float64)
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
        mn, mx = _minmax(xb, w)
        lo = np.float64(mn)
        hi = np.float64(mx)
        lv[0] = lo
        lv[s - 1] = hi
        if s == 3:
            if _exact_sum_ok(xb, w) >= 0:
                p = _pow2_at_least(w)
                for i in range(w):
                    fbuf[i] = np.float64(xb[i])
                for i in range(w, p):
                    fbuf[i] = 0.0
                while p > 1:
                    p //= 2
                    for i in range(p):
                        fbuf[i] = fbuf[i] + fbuf[i + p]
                total = fbuf[0]
                nf = np.float64(w)
                span = hi - lo
                t = total - 0.0 - nf * lo
                sv = t / span if span > 0.0 else nf * 0.0
                k = _f64_to_i64(-np.floor(-(nf - sv)))
                k = min(max(k, 1), max(w, 1))
                idx = min(k - 1, w - 1)
                if span > 0.0:
                    c = np.float64(_kth(xb, w, idx + 1, _key(_f2i(mn)), _key(_f2i(mx)), jb))
                    lv[1] = _fmin(_fmax(c, lo), hi)
                else:
                    lv[1] = lo
            else:
                for i in range(w):
                    ys[i] = np.float64(xb[i])
                ys[:w].sort()
                _scan(ys, w, ta, tb, pre)
                lv[1] = _best_level(ys, pre, w, lo, hi)
        for k in range(s):
            t32 = np.float32(lv[k])
            if fp16:
                t32 = f16_round(t32)
            tab[k] = t32
            meta[b * s + k] = t32
        _table_codes(xb, w, tab, s, True, sa, sb, start, lob, hib, jb, cb[pend : pend + w])
        if ef:
            ef_out_table(sent, cb[pend : pend + w], tab, s, w, e, eout, start, scale, scaled, has_e, flush)
        pend, opos = _flush(lid, s, g, bits, cb, pend + w, out, opos, n < 0)
    pend, opos = _flush(lid, s, g, bits, cb, pend, out, opos, n >= 0)
    return opos



# ---------------------------------------------------------------------------------------------
# decoding against a per-bucket table: sign ([-m, m]), bingrad and orq (the meta row itself)
# ---------------------------------------------------------------------------------------------
@njit(**_OPTS)
def table_decode(meta, mw, signed, data, n, d, s, g, bits, lid, magic, b0, b1, out, acc):
    cb = np.empty(d + 2 * _unit(g, bits) + 8, np.uint8)
    wbuf = np.empty(d + 2 * _unit(g, bits), np.int64)
    # codes beyond the alphabet (only in a malformed payload: the reference raises) read NaN
    tab = np.full(256, np.nan, np.float32)
    for b in range(b0, b1):
        start = b * d
        w = min(d, n - start)
        if signed:
            tab[0] = -meta[b]
            tab[1] = meta[b]
        else:
            mrow = meta[b * mw : b * mw + s]
            for k in range(s):
                tab[k] = mrow[k]
        off = _unpack(lid, s, g, bits, magic, data, start, w, cb, wbuf)
        cv = cb[off : off + w]
        ov = out[start : start + w]
        if acc:
            for i in range(w):
                ov[i] += tab[cv[i]]
        else:
            for i in range(w):
                ov[i] = tab[cv[i]]
