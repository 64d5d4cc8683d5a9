# mypy: ignore-errors
"""numba kernels, level helpers: scans and 2-means over a sorted bucket, ORQ's one-level
optimum, codes against a sorted table, and the exact-sum test and order statistic that let
orq with 2 or 3 levels skip the sort."""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic

from ._nb_common import _OPTS, F0, F1, FHALF, _draw, _f64_to_i64, _fmax, _fmin, _i2f


# ---------------------------------------------------------------------------------------------
# levels from the sorted bucket: bingrad (two_means) and orq (best_level)
# ---------------------------------------------------------------------------------------------
@njit(**_OPTS)
def _scan(v, w, ta, tb, pre):
    """pre[0] = 0, pre[1:w+1] = xp.scan_sum(v[:w]) (Hillis-Steele, float64). Two levels (k and
    2k) a pass, with the additions grouped exactly as the two levels group them."""
    for i in range(w):
        ta[i] = v[i]
    a = ta
    b = tb
    k = 1
    while k < w:
        e1 = min(k, w)
        for i in range(e1):
            b[i] = a[i]
        if 2 * k < w:
            e2 = min(2 * k, w)
            e3 = min(3 * k, w)
            a0, a1, bo = a[k:e2], a[: e2 - k], b[k:e2]
            for i in range(e2 - k):
                bo[i] = a0[i] + a1[i]
            a0, a1, a2, bo = a[2 * k : e3], a[k : e3 - k], a[: e3 - 2 * k], b[2 * k : e3]
            for i in range(e3 - 2 * k):
                bo[i] = (a0[i] + a1[i]) + a2[i]
            if 3 * k < w:
                a0, a1, a2, a3, bo = a[3 * k : w], a[2 * k : w - k], a[k : w - 2 * k], a[: w - 3 * k], b[3 * k : w]
                for i in range(w - 3 * k):
                    bo[i] = (a0[i] + a1[i]) + (a2[i] + a3[i])
            k *= 4
        else:
            a0, a1, bo = a[k:w], a[: w - k], b[k:w]
            for i in range(w - k):
                bo[i] = a0[i] + a1[i]
            k *= 2
        a, b = b, a
    pre[0] = 0.0
    p1 = pre[1:]
    for i in range(w):
        p1[i] = a[i]


@njit(**_OPTS)
def _two_means(ys, pre, w, score, inv, invr):
    """bingrad.two_means: the split k maximising pk^2/k + (T-pk)^2/(w-k), first on ties.

    The scores are first computed with reciprocals (``inv[i] = 1/(i+1)``, ``invr[i] = 1/(w-1-i)``; within a
    relative 1e-15 of the exact ones, and vectorized); only the splits within 4e-14 of the
    best get the exact score, in the reference's operations, and the first exact maximum among
    them wins. That is the reference's split: an exact maximum is never more than 2e-15 below
    the approximate one."""
    if w == 1:
        return ys[0], ys[0]
    total = pre[w]
    fw = np.float64(w)
    p1 = pre[1:w]
    for i in range(w - 1):
        pk = p1[i]
        r = total - pk
        score[i] = (pk * pk) * inv[i] + (r * r) * invr[i]
    # the largest of non-negative doubles is the largest of their bits (an integer reduction,
    # which LLVM vectorizes)
    si = score[: w - 1].view(np.int64)
    mb = np.int64(0)
    for i in range(w - 1):
        mb = si[i] if si[i] > mb else mb
    j = 0
    while si[j] != mb:
        j += 1
    thr = score[j] * (1.0 - 4e-14)
    cnt = 0
    for i in range(w - 1):
        cnt += np.int32(score[i] >= thr)
    if cnt > 1:  # near-ties: the exact scores decide (the approximate maximum is a candidate)
        best = -1.0
        for i in range(w - 1):
            if score[i] >= thr:
                pk = p1[i]
                kf = np.float64(i + 1)
                r = total - pk
                sc = pk * pk / kf + r * r / (fw - kf)
                if sc > best:
                    best = sc
                    j = i
    kk = np.float64(j + 1)
    pj = pre[j + 1]
    return pj / kk, (total - pj) / (fw - kk)


@njit(inline="always", **_OPTS)
def _count_lt(ys, w, a):
    lo = 0
    hi = w
    while lo < hi:
        mid = (lo + hi) >> 1
        if ys[mid] < a:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(inline="always", **_OPTS)
def _count_le(ys, w, a):
    lo = 0
    hi = w
    while lo < hi:
        mid = (lo + hi) >> 1
        if ys[mid] <= a:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(**_OPTS)
def _best_level(ys, pre, w, a, b):
    i0 = _count_lt(ys, w, a)
    i1 = _count_le(ys, w, b)
    nn = i1 - i0
    nf = np.float64(nn)
    span = b - a
    t = pre[i1] - pre[i0] - nf * a
    sv = t / span if span > 0.0 else nf * 0.0
    k = _f64_to_i64(-np.floor(-(nf - sv)))
    k = min(max(k, 1), max(nn, 1))
    idx = min(i0 + k - 1, w - 1)
    if nn > 0 and span > 0.0:
        return _fmin(_fmax(ys[idx], a), b)
    return a


@njit(**_OPTS)
def _table_codes(xb, w, tab, s, stoch, sa, sb, start, lob, hib, jb, cv):
    """LevelScheme.assign against a sorted table of s levels (bingrad, orq): j = #{k in
    1..s-2: x >= t_k} (for a sorted table, the last such k), then nearest or stochastic
    rounding between t_j and t_j+1. Passes over k keep every loop vectorized."""
    t0 = tab[0]
    t1 = tab[1]
    if s == 2:
        gap = t1 - t0
        if stoch:
            for i in range(w):
                p = (xb[i] - t0) / (gap if gap > F0 else F1)
                p = p if gap > F0 else F0
                cv[i] = np.uint8(_draw(start + i, sa, sb) < p)
        else:
            for i in range(w):
                p = (xb[i] - t0) / (gap if gap > F0 else F1)
                p = p if gap > F0 else F0
                cv[i] = np.uint8(p >= FHALF)
        return
    for i in range(w):
        lob[i] = t0
        hib[i] = t1
        jb[i] = 0
    for k in range(1, s - 1):
        tk = tab[k]
        tk1 = tab[k + 1]
        for i in range(w):
            c = xb[i] >= tk
            lob[i] = tk if c else lob[i]
            hib[i] = tk1 if c else hib[i]
            jb[i] += np.int32(c)
    if stoch:
        for i in range(w):
            lj = lob[i]
            gap = hib[i] - lj
            p = (xb[i] - lj) / (gap if gap > F0 else F1)
            p = p if gap > F0 else F0
            cv[i] = np.uint8(jb[i] + (_draw(start + i, sa, sb) < p))
    else:
        for i in range(w):
            lj = lob[i]
            gap = hib[i] - lj
            p = (xb[i] - lj) / (gap if gap > F0 else F1)
            p = p if gap > F0 else F0
            cv[i] = np.uint8(jb[i] + (p >= FHALF))



# ---------------------------------------------------------------------------------------------
# orq with 2 or 3 levels, without sorting: min, max, and for 3 levels the one level
# best_level(min, max), which needs the bucket's sum in Hillis-Steele order over the sorted
# bucket and one order statistic. When every partial sum of the bucket is exact in float64
# (the exponents of its nonzero values span at most 20 binades: 24-bit mantissas, 9 bits of
# count, 53 bits), any order gives the same bits, and the order statistic comes from a binary
# search on the values' integer keys; other buckets are sorted (rare for gradients).
# ---------------------------------------------------------------------------------------------
@njit(**_OPTS)
def _key(b):
    return np.int32(b ^ ((b >> 31) & 0x7FFFFFFF))


@intrinsic
def _f2i(typingctx, v):
    """The bits of the float32 ``v`` as an int32."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@njit(**_OPTS)
def _exact_sum_ok(xb, w):
    """Whether every partial sum of float64(xb[:w]) is exact: all values are multiples of the
    smallest one's ulp, 2**(e-150) (e its biased exponent, 1 for subnormals), and w * 2**24
    such ulps of the largest binade fit in 53 bits. Returns e, or -1 when not exact."""
    lg = 0
    while (1 << lg) < w:
        lg += 1
    xi = xb.view(np.int32)
    emax = np.int32(0)
    emin = np.int32(255)
    for i in range(w):
        a = xi[i] & 0x7FFFFFFF
        e = np.int32(max(a >> 23, 1))  # subnormals share the exponent of 2**-126
        emax = e if e > emax else emax
        e = e if a != 0 else np.int32(255)
        emin = e if e < emin else emin
    if emax - emin <= 29 - lg:
        return min(emin, emax)
    return -1


@njit(**_OPTS)
def _scan_exact(v, w, e, pre):
    """pre[0] = 0, pre[1:w+1] = prefix sums of v[:w] (float64 of float32 values, all multiples
    of 2**(e-150), every partial sum exact): integer running sums, which equal the reference's
    Hillis-Steele sums bit for bit (an exact sum does not depend on the order)."""
    up = math.ldexp(1.0, 150 - e)
    down = math.ldexp(1.0, e - 150)
    acc = np.int64(0)
    pre[0] = 0.0
    p1 = pre[1:]
    for i in range(w):
        acc += np.int64(v[i] * up)
        p1[i] = np.float64(acc) * down


@njit(**_OPTS)
def _kth(xb, w, r, kmin, kmax, kb):
    """The r-th smallest (1-based) of xb[:w], by bisection on the integer keys (kb: scratch)."""
    xi = xb.view(np.int32)
    for i in range(w):
        kb[i] = _key(xi[i])
    lo = np.int64(kmin)
    hi = np.int64(kmax)
    while lo < hi:
        mid = np.int32((lo + hi) >> 1)
        c = 0
        for i in range(w):
            c += np.int32(kb[i] <= mid)
        if c >= r:
            hi = mid
        else:
            lo = mid + 1
    return _i2f(_key(np.int32(lo)))
