# mypy: ignore-errors
"""numba kernels: the level searches of :mod:`.orq_levels` and :mod:`.bingrad_pb`, compiled.

Each search is compiled from its Python source as it is (the same operations in the same order,
so the same bits), except the passes that source keeps in small functions of their own so that
they can run 8 elements at a time: here they are overloaded (``numba.extending.overload``, so
numba calls these wherever the source calls those) by vector steps written in LLVM IR
(:mod:`._nb_lanes`: LLVM leaves the plain loops scalar, see there), with the source's own loop,
compiled, for the last ``w mod 8`` elements. ``tests/unit/test_orq.py`` checks the compiled
search against the source run as Python, and each vector pass against its source.

Measured (16 Mi float32, buckets of 512, one thread, AMD EPYC with AVX-512, old and new
interleaved in one process, load ~1): ORQ-5's search 10.6-11.6 -> 4.7-4.9 ns an element
(2.2-2.5x), ORQ-4's 5.4 -> 3.6, ORQ-6's 29.6 -> 23.2, ORQ-9's 82.7 -> 80.2 (its divide and conquer
is unchanged). The whole encode through ``hvd_gradq.quantize(threads=1)``, old and new trees in
alternating processes, best of 5 each: ORQ-5 14.0-14.7 -> 7.7-8.4 ns an element (~22x a copy,
was ~40x), ORQ-4 8.1-8.2 -> 5.9-6.2, ORQ-9 86.7-90.4 -> 80.7-81.9. BinGrad-pb's search is its
source compiled as it is (see :mod:`.bingrad_pb` for why and what was tried).
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core.extending import intrinsic, overload

from . import orq_levels
from ._nb_common import _OPTS, _i2d
from ._nb_lanes import L, Lanes
from .bingrad_pb import pb_levels_sorted


@intrinsic
def _mid8(typingctx, y, p1, p2, f0, a0, j, n):
    """:func:`.orq_levels.mid_level_pass` for j .. j+7 (< n), operation for operation."""
    sig = types.void(y, p1, p2, f0, a0, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        v = Lanes(context, builder, signature.args, args)
        y_, p1_, p2_, f0_, a0_ = (v.data(k) for k in range(5))
        j = args[5]
        j1 = builder.add(j, v.i(1))
        yj = v.load(y_, j)
        pj1 = v.load(p1_, j1)
        qj1 = v.load(p2_, j1)
        jv = v.iota(j)
        pos = v.gt0(yj)
        m = v.ceil_int(v.sub(v.f(jv), v.fdiv_safe(pj1, yj, pos)))
        m = builder.select(pos, v.smin(v.smax(m, v.splat(0)), jv), v.splat(0))
        ym, pm, qm = v.gather_near((y_, p1_, p2_), m, args[6])
        e1 = v.sub(v.mul(ym, v.add(pm, ym)), v.add(qm, v.mul(ym, ym)))
        n = v.f(builder.add(builder.sub(jv, m), v.splat(1)))
        e2 = v.sub(v.sub(v.mul(v.add(ym, yj), v.sub(pj1, pm)), v.sub(qj1, qm)), v.mul(v.mul(n, ym), yj))
        v.store(f0_, j, v.add(e1, e2))
        v.store(a0_, j, m)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _last8(typingctx, y, p1, p2, f0, gg, am, w, i):
    """:func:`.orq_levels.last_pair_pass` for i .. i+7, operation for operation."""
    sig = types.void(y, p1, p2, f0, gg, am, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        v = Lanes(context, builder, signature.args, args)
        y_, p1_, p2_, f0_, gg_, am_ = (v.data(k) for k in range(6))
        w, i = args[6], args[7]
        wm1 = builder.sub(w, v.i(1))
        yw = v.splat(v.scalar(y_, wm1))
        pw1 = v.splat(v.scalar(p1_, w))
        pw2 = v.splat(v.scalar(p2_, w))
        yi = v.load(y_, i)
        p1i = v.load(p1_, i)
        p2i = v.load(p2_, i)
        f0i = v.load(f0_, i)
        iv = v.iota(i)
        wv = v.splat(w)
        wm1v = v.splat(wm1)
        span = v.sub(yw, yi)
        pos = v.gt0(span)
        tt = v.sub(v.sub(pw1, p1i), v.mul(v.f(builder.sub(wv, iv)), yi))
        m = v.ceil_int(v.sub(v.f(wm1v), v.fdiv_safe(tt, span, pos)))
        m = builder.select(pos, v.smin(v.smax(m, iv), wm1v), iv)
        ym, pm, qm = v.gather_near((y_, p1_, p2_), m, w)
        na = v.f(builder.add(builder.sub(m, iv), v.splat(1)))
        a = v.sub(v.sub(v.mul(v.add(yi, ym), v.sub(v.add(pm, ym), p1i)), v.sub(v.add(qm, v.mul(ym, ym)), p2i)),
                  v.mul(v.mul(na, yi), ym))
        nb = v.f(builder.sub(wv, m))
        b = v.sub(v.sub(v.mul(v.add(ym, yw), v.sub(pw1, pm)), v.sub(pw2, qm)), v.mul(v.mul(nb, ym), yw))
        v.store(gg_, i, v.add(v.add(f0i, a), b))
        v.store(am_, i, m)
        return context.get_dummy_value()

    return sig, codegen


_mid_tail = njit(**_OPTS)(orq_levels.mid_level_pass)
_last_tail = njit(**_OPTS)(orq_levels.last_pair_pass)


@overload(orq_levels.mid_level_pass)
def _mid_level_pass(y, p1, p2, f0, a0, j0, j1):
    def impl(y, p1, p2, f0, a0, j0, j1):
        j = j0
        while j + L <= j1:
            _mid8(y, p1, p2, f0, a0, j, j1)
            j += L
        _mid_tail(y, p1, p2, f0, a0, j, j1)

    return impl


@overload(orq_levels.last_pair_pass)
def _last_pair_pass(y, p1, p2, f0, gg, am, w, i0, i1):
    def impl(y, p1, p2, f0, gg, am, w, i0, i1):
        i = i0
        while i + L <= i1:
            _last8(y, p1, p2, f0, gg, am, w, i)
            i += L
        _last_tail(y, p1, p2, f0, gg, am, w, i, i1)

    return impl


_I64_MAX = np.int64(0x7FFFFFFFFFFFFFFF)
_NEG_INF_KEY = np.int64(-0x7FF0000000000001)  # the key of -inf; a negative NaN's is below it
_first_min_tail = njit(**_OPTS)(orq_levels.first_min)


@njit(**_OPTS)
def _first_min_keys(v, i0, i1):
    """:func:`.orq_levels.first_min`: the float64 bits as integer keys whose signed order is the
    float order (``b ^ ((b >> 63) & MAX)``), an integer min reduction (LLVM vectorizes it; a
    float one it keeps in order), then the first index whose value equals the minimum's by a
    float compare (so a +0.0 before a smaller-keyed -0.0 is found, as the scalar loop finds it).
    A positive NaN's key is above every number's and never the minimum unless nothing is below
    +inf (-1, as the loop); a negative NaN's is below -inf's: then the loop itself."""
    bits = v[i0:i1].view(np.int64)
    mk = _I64_MAX
    for i in range(i1 - i0):
        b = bits[i]
        k = b ^ ((b >> 63) & _I64_MAX)
        mk = k if k < mk else mk
    if mk < _NEG_INF_KEY:
        return _first_min_tail(v, i0, i1)
    mv = _i2d(mk ^ ((mk >> 63) & _I64_MAX))
    if not mv < np.inf:
        return -1
    vs = v[i0:i1]
    first = i1 - i0
    for i in range(i1 - i0):  # the first index as another reduction (an exiting loop stays scalar)
        c = i if vs[i] == mv else i1 - i0
        first = c if c < first else first
    return i0 + first


@overload(orq_levels.first_min)
def _first_min(v, i0, i1):
    return lambda v, i0, i1: _first_min_keys(v, i0, i1)


# orq with 4 levels or more: the exact level search of orq_levels, its passes as above
orq_exact = njit(**_OPTS)(orq_levels.exact_level_indices)
# bingrad pb: the exact minimiser of bingrad_pb, compiled from its Python source likewise
bingrad_pb = njit(**_OPTS)(pb_levels_sorted)
