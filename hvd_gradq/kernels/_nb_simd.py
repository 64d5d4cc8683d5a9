# mypy: ignore-errors
"""numba kernels: 16-lane int32 vector steps written as LLVM IR, for the bucket sort (:mod:`._nb_sort`).

Why IR and not loops: a compare-exchange network over n rows of a transposed array, written as
a numba loop, reads and writes n pointers into one array; LLVM cannot prove they do not overlap
and, past 8 runtime overlap checks, does not vectorize at all. Here each step loads n vectors of
16 int32 (one zmm register with AVX-512, two ymm with AVX2: LLVM legalizes the width), keeps
them in registers through every comparator of the network, and stores them once.

The networks are lists of comparators ``(i, j)``: after one, row ``i`` holds the smaller key of
each lane and row ``j`` the larger. :func:`network` builds the intrinsic for one list.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

VW = 16  # int32 lanes of one vector step
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_VEC = ir.VectorType(_I32, VW)


def _base(context, builder, aryty, val):
    """The array's data as an i32 pointer (its elements are 4 bytes: int32 or float32)."""
    return builder.bitcast(context.make_array(aryty)(context, builder, val).data, _I32.as_pointer())


def _vptr(builder, base, off):
    return builder.bitcast(builder.gep(base, [off]), _VEC.as_pointer())


def _rows(builder, base, o, step, n):
    """Pointers to the n vectors at elements o, o + step, ... (step may be negative)."""
    return [_vptr(builder, base, builder.add(o, builder.mul(step, ir.Constant(_I64, c)))) for c in range(n)]


def network(n, pairs):
    """An intrinsic ``net(a, o, step)``: loads the vectors of n rows at elements ``o + c * step``
    of the int32 array ``a`` (c = 0 .. n-1), applies the comparators ``pairs`` lane by lane,
    stores them back. A negative step runs the same network on the rows in reverse order (a
    descending sort or merge with an ascending network)."""
    pairs = tuple((int(i), int(j)) for i, j in pairs)

    @intrinsic
    def net(typingctx, a, o, step):
        sig = types.void(a, types.int64, types.int64)

        def codegen(context, builder, signature, args):
            ptrs = _rows(builder, _base(context, builder, signature.args[0], args[0]), args[1], args[2], n)
            v = [builder.load(p, align=4) for p in ptrs]
            for i, j in pairs:
                lt = builder.icmp_signed("<", v[i], v[j])
                v[i], v[j] = builder.select(lt, v[i], v[j]), builder.select(lt, v[j], v[i])
            for p, x in zip(ptrs, v):
                builder.store(x, p, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return net


@intrinsic
def transpose_keys(typingctx, src, os, ss, dst, od, sd, pf):
    """A 16 x 16 block of int32 from ``src`` (row c at element ``os + c * ss``) transposed into
    ``dst`` (row c at ``od + c * sd``), each value mapped by ``b ^ ((b >> 31) & 0x7fffffff)``:
    float bits to keys whose signed order is the IEEE total order, and back (the map is its own
    inverse). Four rounds of two-source shuffles swap the off-diagonal blocks of 8, 4, 2 and 1.

    The 16 source rows ``pf`` elements further on are prefetched into L2 (not L1: the next
    group of a 512-wide sort is 32 KB, which would push the working keys out of L1). Short rows
    are short streams that the hardware prefetcher barely learns: at 128 floats a row this took
    the transposes from ~1.1 to ~0.75 ns an element, and left 512 and 2048 as they were."""
    sig = types.void(src, types.int64, types.int64, dst, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        src_base = _base(context, builder, signature.args[0], args[0])
        s_ptrs = _rows(builder, src_base, args[1], args[2], VW)
        i8p = ir.IntType(8).as_pointer()
        prefetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32]), "llvm.prefetch.p0i8")
        for p in _rows(builder, src_base, builder.add(args[1], args[6]), args[2], VW):
            builder.call(prefetch, [builder.bitcast(p, i8p), ir.Constant(_I32, 0), ir.Constant(_I32, 1),
                                    ir.Constant(_I32, 1)])
        d_ptrs = _rows(builder, _base(context, builder, signature.args[3], args[3]), args[4], args[5], VW)
        top = ir.Constant(_VEC, [0x7FFFFFFF] * VW)
        s31 = ir.Constant(_VEC, [31] * VW)
        r = []
        for p in s_ptrs:
            b = builder.load(p, align=4)
            r.append(builder.xor(b, builder.and_(builder.ashr(b, s31), top)))
        for h in (8, 4, 2, 1):
            keep = ir.Constant(_VEC, [c if not c & h else VW + c - h for c in range(VW)])
            swap = ir.Constant(_VEC, [c + h if not c & h else VW + c for c in range(VW)])
            for i in range(VW):
                if not i & h:
                    lo, hi = r[i], r[i + h]
                    r[i] = builder.shuffle_vector(lo, hi, keep)
                    r[i + h] = builder.shuffle_vector(lo, hi, swap)
        for p, x in zip(d_ptrs, r):
            builder.store(x, p, align=4)
        return context.get_dummy_value()

    return sig, codegen


def merge_pairs(n):
    """Half-cleaner stages of a bitonic merge of n rows (a power of two), all ascending."""
    out = []
    j = n >> 1
    while j:
        out += [(i, i + j) for i in range(n) if not i & j]
        j >>= 1
    return out


def sort_pairs(n):
    """Batcher's odd-even merge sort of n rows (a power of two): 63 comparators for 16."""
    out = []
    p = 1
    while p < n:
        k = p
        while k:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        out.append((i + j, i + j + k))
            k >>= 1
        p <<= 1
    return out
