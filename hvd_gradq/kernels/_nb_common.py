# mypy: ignore-errors
"""numba kernels, shared pieces: constants, the counter-based draw, fp16 rounding, tree sums,
clipping, and order-free min/max reductions over one bucket (see :mod:`._numba` for the
bit-identity rules every kernel follows)."""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic

from ..xp import _M1, _M2, _M3
from ._nb_cache import install

install()  # every kernel module imports this one first: the cache's place and freshness before any decorating

_OPTS = {"cache": True, "nogil": True, "error_model": "numpy", "boundscheck": False}

F0 = np.float32(0.0)
F1 = np.float32(1.0)
FHALF = np.float32(0.5)
FNAN = np.float32(np.nan)
# x86 turns a float beyond int64's range (or NaN) into INT64_MIN when NumPy casts it
F32_TWO63 = np.float32(2.0**63)
F64_TWO63 = 2.0**63
INT64_MIN = np.int64(-(2**63))
TWO52 = 2.0**52
M9 = (1 << 32) // 9 + 1
F_RANGE = np.float32(2.0**127)  # schemes.level.RANGE_LIMIT



# ---------------------------------------------------------------------------------------------
# scalar helpers
# ---------------------------------------------------------------------------------------------
@intrinsic
def _draw(typingctx, idx, sa, sb):
    """xp.uniforms for one element index: the same hash, written as 32-bit LLVM IR (numba
    would widen every uint32 step to 64 bits, which halves the SIMD lanes)."""
    sig = types.float32(types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        i64 = ir.IntType(64)
        k, a, b = args

        def mix(v):
            for sh, m in ((16, _M1), (15, _M2), (16, _M3)):
                v = builder.mul(builder.xor(v, builder.lshr(v, ir.Constant(i32, sh))), ir.Constant(i32, m))
            return builder.xor(v, builder.lshr(v, ir.Constant(i32, 15)))

        lo = builder.trunc(k, i32)
        hi = builder.trunc(builder.lshr(k, ir.Constant(i64, 32)), i32)
        h = mix(builder.xor(lo, builder.trunc(a, i32)))
        h = mix(builder.xor(h, builder.xor(hi, builder.trunc(b, i32))))
        f = builder.uitofp(builder.lshr(h, ir.Constant(i32, 8)), ir.FloatType())
        return builder.fmul(f, ir.Constant(ir.FloatType(), 1.0 / (1 << 24)))

    return sig, codegen


@intrinsic
def _store_u64(typingctx, arr, idx, val):
    """arr[idx : idx+8] = the 8 little-endian bytes of ``val`` (uint8 array, unaligned store)."""
    sig = types.void(arr, idx, val)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(64).as_pointer())
        builder.store(args[2], ptr, align=1)
        return context.get_dummy_value()

    return sig, codegen


# the 5 base-3 digits of a byte (of the byte mod 243, as the reference's mod does), one a byte
LUT3 = np.array([sum(((v % 243) // 3**t % 3) << (8 * t) for t in range(5)) for v in range(256)], np.uint64)


@njit(**_OPTS)
def f16_round(v):
    """LevelScheme.round_meta for fp16 scales: clip to +-65504 (fp16's largest finite value),
    then float32 -> float16 -> float32, round to nearest even, as NumPy does."""
    if v != v:
        return v
    a = abs(np.float64(v))
    if a >= 65504.0:
        return np.float32(math.copysign(65504.0, v))
    m, e = math.frexp(a)  # a = m * 2**e, m in [0.5, 1)
    ulp = math.ldexp(1.0, max(e - 11, -24))
    r = a / ulp
    r = (r + TWO52) - TWO52  # round half to even (r < 2**12)
    return np.float32(math.copysign(r * ulp, v))


@njit(inline="always", **_OPTS)
def _pow2_at_least(w):
    p = 1
    while p < w:
        p *= 2
    return p


@njit(inline="always", **_OPTS)
def _tree(buf, p):
    """xp.tree_sum of buf[:p] (p a power of two, zero padded), destroying buf."""
    while p > 16:
        p //= 2
        hi = buf[p : 2 * p]
        for i in range(p):
            buf[i] = buf[i] + hi[i]
    while p > 1:
        p //= 2
        for i in range(p):
            buf[i] = buf[i] + buf[i + p]
    return buf[0]


@njit(inline="always", **_OPTS)
def _f(v, mode, c):
    if mode == 0:
        return v
    if mode == 1:
        return abs(v)
    if mode == 2:
        return v * v
    dv = v - c
    return dv * dv


@njit(**_OPTS)
def _tree_of(xb, w, mode, c, buf):
    """xp.tree_sum of f(xb[:w]), f by ``mode``: 0 x, 1 |x|, 2 x*x, 3 (x-c)*(x-c). The first
    level of the tree (pairs i, i + p/2 of the zero-padded row) is read straight from xb."""
    if w == 1:
        return _f(xb[0], mode, c)
    h = _pow2_at_least(w) // 2
    lo = xb[:h]
    hi = xb[h:w]
    for i in range(w - h):
        buf[i] = _f(lo[i], mode, c) + _f(hi[i], mode, c)
    for i in range(w - h, h):
        buf[i] = _f(lo[i], mode, c) + F0
    return _tree(buf, h)


@njit(inline="always", **_OPTS)
def _fmax(a, b):  # np.maximum(a, b) on finite values: b on ties
    return a if a > b else b


@njit(inline="always", **_OPTS)
def _fmin(a, b):  # np.minimum(a, b) on finite values: b on ties
    return a if a < b else b


@njit(inline="always", **_OPTS)
def _f64_to_i64(q):
    if q > -F64_TWO63 and q < F64_TWO63:
        return np.int64(q)
    return INT64_MIN


@njit(**_OPTS)
def _clip_bucket(xb, w, c, buf, xc):
    """LevelScheme.clip_rows of one bucket xb[:w] into xc[:w] (c > 0); returns (lo, hi).

    (Kernels index views from 0: an index ``off + i`` that numba cannot prove non-negative
    gets a wrap-around test, which stops LLVM from vectorizing the loop; hence the views.)"""
    inv = np.float32(1.0 / w)
    h = np.int32(0)  # log2 of schemes.level.sqrt_pow2_at_least(w): at, down as clip_scaling(w)
    v = w - 1
    while v > 0:
        h += 1
        v >>= 1
    h = (h + 1) // 2
    at = _i2f(np.int32((127 + 62 - h) << 23))
    mn, mx = _minmax(xb, w)
    if _fmax(-mn, mx) >= at:  # the sum of squares would overflow: statistics of xb * down
        down = _i2f(np.int32((127 - 66 - h) << 23))
        back = _i2f(np.int32((127 + 66 + h) << 23))
        for i in range(w):
            xc[i] = xb[i] * down
        xs = xc
    else:
        down = F1
        back = F1
        xs = xb
    mean = _tree_of(xs, w, 0, F0, buf) * inv
    std = np.sqrt(_tree_of(xs, w, 3, mean, buf) * inv)
    bound = down * F_RANGE
    lo = _fmin(_fmax(mean - c * std, -bound), bound) * back
    hi = _fmin(_fmax(mean + c * std, -bound), bound) * back
    for i in range(w):
        xc[i] = _fmin(_fmax(xb[i], lo), hi)
    return lo, hi


# ---------------------------------------------------------------------------------------------
# reductions over one bucket (order-free: min and max, on integer keys that LLVM vectorizes)
# ---------------------------------------------------------------------------------------------
@intrinsic
def _i2f(typingctx, k):
    """The float32 whose bits are the int32 ``k``."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def _i2d(typingctx, k):
    """The float64 whose bits are the int64 ``k``."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


@njit(**_OPTS)
def _minmax(xb, w):
    """min and max of xb[:w] (finite), on order-preserving integer keys of the float bits: LLVM
    vectorizes integer min/max reductions but not float ones (NaN and signed-zero rules).
    (Of +0.0 and -0.0 the min is -0.0 and the max +0.0; NumPy's SIMD reductions may return
    either: then the meta differs in the sign of a zero, and decodes to the same floats.)"""
    xi = xb.view(np.int32)
    mn = np.int32(0x7FFFFFFF)
    mx = np.int32(-0x80000000)
    for i in range(w):
        b = xi[i]
        k = np.int32(b ^ ((b >> 31) & 0x7FFFFFFF))
        mn = k if k < mn else mn
        mx = k if k > mx else mx
    mn = np.int32(mn ^ ((mn >> 31) & 0x7FFFFFFF))
    mx = np.int32(mx ^ ((mx >> 31) & 0x7FFFFFFF))
    return _i2f(mn), _i2f(mx)


@njit(**_OPTS)
def _maxabs(xb, w):
    """max |xb[:w]| (finite), as the max of the bits with the sign cleared."""
    xi = xb.view(np.int32)
    mx = np.int32(0)
    for i in range(w):
        k = np.int32(xi[i] & 0x7FFFFFFF)
        mx = k if k > mx else mx
    return _i2f(mx)
