# mypy: ignore-errors
"""numba kernels: 8-lane float64 vector steps written as LLVM IR, for the level searches'
closed-form passes (:mod:`._nb_search`).

Why IR and not loops: a pass such as ORQ's layer 2 reads y[m], P[m], Q[m] at an index m computed
in the loop and writes f[j]; LLVM cannot bound the gathered addresses, so it cannot check at run
time that they miss the stored ones, and leaves the whole loop scalar ("cannot identify array
bounds"): one float64 division, a rounding and ~25 other operations per element, one at a time.
Here each step computes 8 lanes with vector instructions (a zmm register with AVX-512, two ymm
with AVX2: LLVM legalizes the width) and gathers with ``llvm.masked.gather``.

The operations are IEEE float64 ones, no fast-math flags (so no reassociation, no fused
multiply-add), each the same as the scalar source's in the same order: a lane gives the bits
the scalar loop gives for that element. :class:`Lanes` wraps the builder for that.
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

L = 8  # float64 lanes of one vector step
_F64 = ir.DoubleType()
_I64 = ir.IntType(64)
_I32 = ir.IntType(32)
_VF = ir.VectorType(_F64, L)
_VI = ir.VectorType(_I64, L)
_VB = ir.VectorType(ir.IntType(1), L)
_VP = ir.VectorType(_F64.as_pointer(), L)


class Lanes:
    """Vector operations of one intrinsic's body: arrays are numba array arguments, offsets and
    scalars i64 / double LLVM values, vectors 8 lanes of double (``VF``) or i64 (``VI``)."""

    def __init__(self, context, builder, argtys, args):
        self.c = context
        self.b = builder
        self.argtys = argtys
        self.args = args

    def data(self, k):
        """The data pointer of array argument ``k``."""
        return self.c.make_array(self.argtys[k])(self.c, self.b, self.args[k]).data

    def i(self, v):
        return ir.Constant(_I64, v) if isinstance(v, int) else v

    def load(self, base, off):
        """base[off : off + 8] (unaligned)."""
        p = self.b.gep(base, [self.i(off)])
        return self.b.load(self.b.bitcast(p, (_VI if base.type.pointee == _I64 else _VF).as_pointer()), align=8)

    def scalar(self, base, off):
        return self.b.load(self.b.gep(base, [self.i(off)]))

    def store(self, base, off, v):
        p = self.b.gep(base, [self.i(off)])
        self.b.store(v, self.b.bitcast(p, v.type.as_pointer()), align=8)

    def splat(self, x):
        """x in every lane (a Python float or int: a constant)."""
        if isinstance(x, float):
            return ir.Constant(_VF, [x] * L)
        if isinstance(x, int):
            return ir.Constant(_VI, [x] * L)
        vt = _VF if x.type == _F64 else _VI
        v = self.b.insert_element(ir.Constant(vt, ir.Undefined), x, ir.Constant(_I32, 0))
        return self.b.shuffle_vector(v, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(_I32, L), [0] * L))

    def iota(self, j):
        """j, j+1, ..., j+7."""
        return self.b.add(self.splat(self.i(j)), ir.Constant(_VI, list(range(L))))

    def gather(self, base, idx):
        """base[idx[k]] in lane k (float64 arrays): 8 scalar loads. ``llvm.masked.gather``
        (vgatherqpd) was ~1.35x slower a pass on AMD Zen 4, where a gather is microcoded."""
        b = self.b
        v = ir.Constant(_VF, ir.Undefined)
        for k in range(L):
            x = b.load(b.gep(base, [b.extract_element(idx, ir.Constant(_I32, k))]))
            v = b.insert_element(v, x, ir.Constant(_I32, k))
        return v

    def gather_near(self, bases, idx, n):
        """[base[idx[k]] in lane k for each base]: each base has at least ``n`` elements and
        every idx[k] is in 0 .. n-1. Where the 8 indices lie within 16 of lane 0's (monotone
        indices that grow slowly: the searches' closed-form levels), two loads of each base and
        one two-register permute (vpermi2pd) replace the 8 scalar loads; else :meth:`gather`.
        The permute needs AVX-512; without it, always :meth:`gather`."""
        b = self.b
        if not self.avx512():
            return [self.gather(base, idx) for base in bases]
        lo = b.extract_element(idx, ir.Constant(_I32, 0))
        top = b.sub(n, ir.Constant(_I64, 2 * L))
        lo = b.select(b.icmp_signed("<", lo, top), lo, top)
        rel = b.sub(idx, self.splat(lo))
        inside = b.icmp_unsigned("<", rel, self.splat(2 * L))
        ok = b.icmp_unsigned("==", b.bitcast(inside, ir.IntType(L)), ir.Constant(ir.IntType(L), (1 << L) - 1))
        ok = b.and_(ok, b.icmp_signed(">=", top, ir.Constant(_I64, 0)))
        perm = cgutils.get_or_insert_function(
            b.module, ir.FunctionType(_VF, [_VF, _VI, _VF]), "llvm.x86.avx512.vpermi2var.pd.512")
        with b.if_else(b.call(cgutils.get_or_insert_function(
                b.module, ir.FunctionType(ir.IntType(1), [ir.IntType(1), ir.IntType(1)]), "llvm.expect.i1"),
                [ok, ir.Constant(ir.IntType(1), 1)])) as (near, far):
            with near:
                fast = [b.call(perm, [self.load(base, lo), rel, self.load(base, b.add(lo, ir.Constant(_I64, L)))])
                        for base in bases]
                bb_near = b.basic_block
            with far:
                slow = [self.gather(base, idx) for base in bases]
                bb_far = b.basic_block
        out = []
        for f, g in zip(fast, slow):
            phi = b.phi(_VF)
            phi.add_incoming(f, bb_near)
            phi.add_incoming(g, bb_far)
            out.append(phi)
        return out

    def avx512(self):
        """Whether the code is compiled for AVX-512 (numba's target features; an unknown numba
        internals layout: no, the scalar loads work everywhere)."""
        return "+avx512f" in str(getattr(self.c.codegen(), "_tm_features", "")).split(",")

    def ceil(self, v):
        fn = cgutils.get_or_insert_function(self.b.module, ir.FunctionType(_VF, [_VF]), "llvm.ceil.v8f64")
        return self.b.call(fn, [v])

    def fdiv_safe(self, num, den, pos):
        """num / (den where pos, else 1.0): the scalar source's ``num / (den if pos else 1.0)``."""
        return self.b.fdiv(num, self.b.select(pos, den, self.splat(1.0)))

    def gt0(self, v):
        return self.b.fcmp_ordered(">", v, self.splat(0.0))

    def smax(self, a, b):
        return self.b.select(self.b.icmp_signed(">", a, b), a, b)

    def smin(self, a, b):
        return self.b.select(self.b.icmp_signed("<", a, b), a, b)

    def ceil_int(self, v):
        """int(np.ceil(v)) as numba compiles it: a rounding up, then a truncating conversion."""
        return self.b.fptosi(self.ceil(v), _VI)

    def f(self, v):
        """np.float64 of an i64 vector."""
        return self.b.sitofp(v, _VF)

    # IEEE float64 arithmetic, nothing else
    def add(self, a, b):
        return self.b.fadd(a, b)

    def sub(self, a, b):
        return self.b.fsub(a, b)

    def mul(self, a, b):
        return self.b.fmul(a, b)

    def div(self, a, b):
        return self.b.fdiv(a, b)
