"""The shared bucketed level-quantization pipeline, and the float32 limits it keeps to.

A *level scheme* maps each bucket of ``bucket`` elements onto a sorted table of ``symbols``
values (its levels) described by a few floats (its ``meta``: min/max, a norm, or the levels
themselves), then sends one code a element, base-s packed. Subclasses write only what is
theirs: how ``meta`` is chosen from a bucket, how the table follows from ``meta``, and whether
rounding is nearest (biased) or stochastic between neighbours (unbiased inside the table's
range). Everything runs on the :class:`~hvd_gradq.xp.Ops` namespace given. What the summable
pattern adds for evenly spaced levels (a scale shared by all ranks) is in :mod:`.summable`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from ..errors import SpecError
from ..wire.packing import check_codes, layout, pack, unpack
from ..xp import Array, Ops, Seed, tree_sum, uniforms
from .options import Scales, param
from .scheme import Combine, Scheme, Section

# Limits of the float32 pipeline (see Scheme.limit). A range or a difference of two values
# below 2**127 is below float32's largest value (2**128 - 2**104): x - lo, hi - lo cannot overflow.
RANGE_LIMIT = 2.0**127
# A sum of w squares (an L2 norm, a standard deviation) of values below 2**62 / sqrt(w), even of
# differences of two of them, stays below 2**126.
SQUARE_LIMIT = 2.0**62


def pow2_at_least(w: int) -> int:
    """The smallest power of two >= w (w >= 1)."""
    return 1 << (w - 1).bit_length()


def sqrt_pow2_at_least(w: int) -> int:
    """A power of two >= sqrt(w) (w >= 1)."""
    return 1 << -(-(w - 1).bit_length() // 2)


def clip_scaling(w: int) -> tuple[float, float]:
    """(at, down) for clipping rows ``w`` wide: a row whose max|x| reaches ``at`` (the square
    limit for w) has its mean and standard deviation computed on ``x * down``, an exact power of
    two that brings every |x| < RANGE_LIMIT below ``at`` (down = 2**-(66 + h), at = 2**(62 - h),
    h = log2 sqrt_pow2_at_least(w); the row's max stays >= 2**(-4 - 2h), a normal float32).
    Shared with the numba kernels' ``_clip_bucket``, which computes the same two numbers."""
    h = sqrt_pow2_at_least(w).bit_length() - 1
    return 2.0 ** (62 - h), 2.0 ** -(66 + h)


def bucket_rows(n: int, d: int) -> list[tuple[int, int, int]]:
    """[(start, rows, width)]: full buckets as one block, then the short tail bucket, if any."""
    out = []
    full = n // d
    if full:
        out.append((0, full, d))
    if n % d:
        out.append((full * d, 1, n % d))
    return out


@dataclass(frozen=True, kw_only=True)
class LevelScheme(Scheme):
    """A scheme that quantizes each bucket onto a sorted table of levels."""

    clip: float = param(0.0, float, "clip each bucket to mean +- clip*std before levels are chosen (0: off)")
    scales: Scales = param(Scales.FP32, Scales, "wire precision of per-bucket levels/scales (fp16 saturates at 65504)")

    meta_width: ClassVar[int] = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.clip < 0:
            raise SpecError(f"{self.name}: clip={self.clip} must be >= 0 (standard deviations; 0 turns it off)")

    @property
    def unbiased(self) -> bool:
        # clipping moves outliers towards the bulk before rounding: E[Q(x)] is the clipped x
        return self.unbiased_rounding and self.clip == 0

    @property
    def limit(self) -> float:
        # ranges and differences (x - lo, hi - lo); clipping's mean and sum of squares are taken
        # on a scaled row where they would overflow (clip_rows), so they add no limit
        return RANGE_LIMIT

    def check_parts(self, parts: dict[str, NDArray[Any]], n: int) -> None:
        check_codes(np.asarray(parts["codes"]), self.symbols, n)

    def rows_ok(self, ops: Ops, x: Array) -> Array:
        """(rows, 1) bool: every element of the bucket is finite and below :attr:`limit` in
        magnitude (a NaN compares false, so its bucket is not ok)."""
        inside = ops.f32(ops.abs(x) < np.float32(self.limit))
        return ops.amin(inside, 1) > np.float32(0.0)

    @property
    def symbols(self) -> int:
        raise NotImplementedError

    @property
    def draws(self) -> bool:
        """Whether rounding is stochastic (needs uniform draws) rather than nearest."""
        return self.stochastic

    # --- what subclasses write ---------------------------------------------------------------
    def choose(self, ops: Ops, x: Array) -> Array:
        """Per-bucket ``meta`` (rows, meta_width) from buckets ``x`` (rows, width)."""
        raise NotImplementedError

    def table(self, ops: Ops, meta: Array) -> Array:
        """Sorted levels (rows, symbols) from ``meta``."""
        raise NotImplementedError

    def locate(self, ops: Ops, x: Array, table: Array) -> Array:
        """Index j of the interval [t_j, t_j+1] holding each x, in [0, symbols-2]."""
        s = self.symbols
        j = ops.zeros(ops.shape(x), "int64")
        for k in range(1, s - 1):
            j = j + ops.i64(x >= table[:, k : k + 1])
        return j

    # --- the shared pipeline ----------------------------------------------------------------
    def sections(self, n: int) -> list[Section]:
        nb = -(-n // self.bucket)
        return [
            Section("meta", "float32" if self.scales is Scales.FP32 else "float16", nb * self.meta_width),
            Section("codes", "uint8", layout(self.symbols).nbytes(n)),
        ]

    def code_bits(self, n: int) -> float:
        nb = -(-n // self.bucket)
        mb = 32 if self.scales is Scales.FP32 else 16
        return n * float(np.log2(self.symbols)) + nb * self.meta_width * mb

    def clip_rows(self, ops: Ops, x: Array) -> Array:
        if self.clip <= 0:
            return x
        w = ops.shape(x)[1]
        inv = np.float32(1.0 / w)
        # A row with max|x| >= at would overflow the sum of squares: its statistics are taken on
        # x * down (exact: a power of two) and its bounds scaled back; other rows are untouched
        # (down = 1). The bounds are clamped to +-RANGE_LIMIT first, which no |x| < limit
        # reaches, so the scaling back cannot overflow and the clipped row is the same.
        at, down = clip_scaling(w)
        one = ops.full((1, 1), 1.0)
        big = ops.amax(ops.abs(x), 1) >= np.float32(at)
        p = ops.where(big, ops.full((1, 1), down), one)
        xs = x * p
        mean = tree_sum(ops, xs) * inv
        dev = xs - mean
        std = ops.sqrt(tree_sum(ops, dev * dev) * inv)
        c = np.float32(self.clip)
        bound = p * np.float32(RANGE_LIMIT)
        back = ops.where(big, ops.full((1, 1), 1.0 / down), one)
        lo = ops.clip(mean - c * std, -bound, bound) * back
        hi = ops.clip(mean + c * std, -bound, bound) * back
        return ops.clip(x, lo, hi)

    def round_meta(self, ops: Ops, meta: Array) -> Array:
        """Meta as the receiver will see it, so codes are chosen against the levels decoded."""
        if self.scales is Scales.FP16:
            # saturate at fp16's largest finite value: a scale beyond it would become inf and
            # decode the whole bucket to inf/NaN; saturated, elements beyond it clamp instead
            lim = np.float32(65504.0)
            return ops.f32(ops.to_f16(ops.clip(meta, -lim, lim)))
        return meta

    def assign(self, ops: Ops, x: Array, table: Array, u: Array | None) -> Array:
        """Codes for buckets ``x`` against ``table``: nearest, or stochastic given draws ``u``."""
        j = self.locate(ops, x, table)
        lo = ops.take_along(table, j)
        hi = ops.take_along(table, j + 1)
        gap = hi - lo
        pos = gap > 0
        p = ops.where(pos, (x - lo) / ops.where(pos, gap, ops.full((1, 1), 1.0)), ops.full((1, 1), 0.0))
        if u is None:
            up = p >= np.float32(0.5)
        else:
            up = u < p
        return j + ops.i64(up)

    def encode_rows(self, ops: Ops, x: Array, seed: Seed, start: int) -> tuple[Array, Array]:
        """(meta, codes) of buckets ``x`` (rows, width) whose first element is ``start``."""
        rows, w = ops.shape(x)
        # A bucket holding NaN/Inf, or a value beyond the float32 pipeline's limit, is encoded
        # as zeros with NaN meta: it decodes as NaN on every rank (nonfinite=propagate; the
        # callers raise first under the other policies). Elsewhere this changes nothing.
        ok = self.rows_ok(ops, x)
        x = ops.where(ok, x, ops.full((1, 1), 0.0))
        xc = self.clip_rows(ops, x)
        meta = self.round_meta(ops, self.choose(ops, xc))
        table = self.table(ops, meta)
        u = None
        if self.draws:
            u = ops.reshape(uniforms(ops, seed, start, rows * w), (rows, w))
        codes = self.assign(ops, xc, table, u)
        return ops.where(ok, meta, ops.full((1, 1), math.nan)), codes

    def encode(self, ops: Ops, x: Array, seed: Seed) -> dict[str, Array]:
        n = ops.shape(x)[0]
        metas, codes = [], []
        for start, rows, w in bucket_rows(n, self.bucket):
            xb = ops.reshape(x[start : start + rows * w], (rows, w))
            m, c = self.encode_rows(ops, xb, seed, start)
            metas.append(m)
            codes.append(ops.reshape(c, (rows * w,)))
        if not metas:
            return {"meta": ops.zeros((0,), "float32"), "codes": ops.zeros((0,), "int64")}
        meta = ops.reshape(ops.concat(metas, 0), (-1,))
        code = ops.concat(codes, 0) if len(codes) > 1 else codes[0]
        return {"meta": meta, "codes": pack(ops, code, self.symbols)}

    def decode(self, ops: Ops, parts: dict[str, Array], n: int) -> Array:
        codes = unpack(ops, parts["codes"], self.symbols, n)
        meta = ops.reshape(ops.f32(parts["meta"]), (-1, self.meta_width))
        out = []
        b = 0
        for start, rows, w in bucket_rows(n, self.bucket):
            table = self.table(ops, meta[b : b + rows])
            c = ops.reshape(codes[start : start + rows * w], (rows, w))
            out.append(ops.reshape(ops.take_along(table, c), (rows * w,)))
            b += rows
        if not out:
            return ops.zeros((0,), "float32")
        return ops.concat(out, 0) if len(out) > 1 else out[0]


@dataclass(frozen=True, kw_only=True)
class EvenLevelScheme(LevelScheme):
    """Levels evenly spaced, t_k = lo + k*step: the interval is found arithmetically, and
    codes of several workers that share (lo, step) add up (the summable pattern)."""

    combine: ClassVar[Combine] = Combine.SUMMABLE

    def affine(self, ops: Ops, meta: Array) -> tuple[Array, Array]:
        """(lo, step) per bucket, shapes (rows, 1)."""
        raise NotImplementedError

    def table(self, ops: Ops, meta: Array) -> Array:
        lo, step = self.affine(ops, meta)
        k = ops.f32(ops.reshape(ops.arange(self.symbols), (1, self.symbols)))
        t = lo + step * k
        # NaN meta (a bucket that held NaN/Inf): one NaN bit pattern, whichever operand's NaN
        # the hardware kept (-m of qsgd/terngrad flips a NaN's sign); the kernels do the same
        return ops.where(t == t, t, ops.full((1, 1), math.nan))

    def locate(self, ops: Ops, x: Array, table: Array) -> Array:
        lo = table[:, :1]
        step = table[:, 1:2] - lo
        pos = step > 0
        q = ops.where(pos, (x - lo) / ops.where(pos, step, ops.full((1, 1), 1.0)), ops.full((1, 1), 0.0))
        j = ops.i64(ops.floor(q))
        return ops.clip(
            j, ops.i64(ops.zeros((1, 1), "int64")), ops.i64(ops.zeros((1, 1), "int64") + (self.symbols - 2))
        )

    # -- the summable pattern: a shared scale agreed by a max-allreduce of shared_stats -------
    def shared_stats(self, ops: Ops, x: Array) -> Array:
        """Per-bucket statistics (rows, k) whose elementwise max over workers fixes the shared
        table; :meth:`meta_from_stats` turns the reduced statistics into ``meta``."""
        raise NotImplementedError

    def meta_from_stats(self, ops: Ops, stats: Array) -> Array:
        raise NotImplementedError
