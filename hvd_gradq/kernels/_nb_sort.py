# mypy: ignore-errors
"""numba kernels: each bucket sorted, on order-preserving integer keys.

:func:`sort_rows` picks one of two sorts that give the same bits (IEEE total order; any
correct sort of the integer keys does, since equal keys are equal bits):

* **Bitonic, 16 buckets at once** (:func:`_sort_bitonic`, buckets of up to 8,192 after padding
  to a power of two; a last group of 4 or more buckets, 8 above 512 wide): the keys of 16
  buckets are laid out transposed, one bucket a lane of a 16 x int32 vector (one zmm register),
  and the network runs as vector steps written in LLVM IR (:mod:`._nb_simd`):

  - the transposes in and out are 16 x 16 shuffle transposes that also map float bits to keys;
  - blocks of 16 points are sorted in registers (Batcher's 63 comparators), so the first 10
    stages of the network are one pass;
  - each merge runs its stages four at a time: 16 rows of the transposed array loaded, 4
    half-cleaner stages in registers, stored once. A descending block is the ascending network
    on its rows in reverse order, so one network serves both directions;
  - L1 blocking: every stage that stays within 256 points (16 KB of keys) runs block by block
    while the block is in L1; only the stages pairing points of different blocks pass over the
    whole array.

  At 512 the network makes 12 passes over the keys instead of 45.
* **LSD radix** (:func:`_sort_radix`) for the rest: a few buckets (the tail of a tensor) or
  wide ones.

Measured (AMD EPYC with AVX-512, 16 Mi float32 in one call, thread CPU time, best of 7, old and
new interleaved in one process; load average ~4 from other work on 2 cores, so ratios are the
firm part): at 512 wide 3.7-3.8 -> 1.25-1.3 ns an element (2.9-3.1x faster; 3.1x a copy), at
128 2.1-2.4 -> 1.1 (1.9-2.1x; 2.8x a copy), at 2048 4.7-4.9 -> 1.6 (2.8-3.0x; 4.0x a copy). The
radix sort takes ~7 at 512 to 16,384 wide. Of the 1.3 ns at 512 about half is the transposes
(memory: the same traffic as a copy) and half the network (~2.8 vector min/max an element, near
the compute floor of a bitonic network). BinGrad-b's whole encode (threads=1, 16 Mi floats):
7.4-8.1 -> 3.2-3.3 ns an element; ORQ-5's: 24.6 -> 14.5-17.2.

Tried and dropped: 5 stages a pass (32 rows of 16 lanes: too few registers, spills; ~1.2x
slower at 512); 8-lane vectors with 4 or 5 stages a pass (~2x slower: half the work an
instruction); L1 blocks of 128 points (slower at 512) or 512 (less gain at 2048); prefetching the
next group into L1 (it pushes a 512-wide group's keys out: the transposes ~15% slower; into L2
it is kept, see :func:`._nb_simd.transpose_keys`). Compiled without AVX-512 (for Haswell: 16
ymm registers) the 16-row steps spill; still 1.1-1.9x the old network's speed there.

The sorted-level schemes (bingrad, orq with 4 levels or more) sort every bucket; NumPy's row
sort (introsort, no SIMD sort for float32 on AVX2 in NumPy 1.26) took ~42 ns an element here,
most of BinGrad-b's time. Four 8-bit passes over a bucket's 32-bit keys (a float's bits, sign
flipped, or all bits flipped for negatives, so unsigned order is float order) take ~10: the
counts of all four digits are taken in one pass, and a pass whose digit is the same for every
key is skipped (gradients in a bucket often share their top byte).

The order is IEEE total order, so of -0.0 and +0.0 the negative comes first, where NumPy's
sort leaves equal values as they go: the one corner where a level taken from a sorted bucket may
differ from the reference's in a zero's sign (the limit :mod:`._numba` documents; the same
floats decode). Input must be finite (a NaN would sort by its bits).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ._nb_common import _OPTS
from ._nb_simd import VW, merge_pairs, network, sort_pairs, transpose_keys

_TOP = np.uint32(0x80000000)
_ALL = np.uint32(0xFFFFFFFF)
_BYTE = np.uint32(255)


_LANES = VW  # buckets a bitonic group sorts together, one a lane of a vector (512 x 16 keys: 32 KB)
# padded width beyond which the radix sort is faster here: at 16,384 the keys of a group are
# 1 MB (L2), and levels.py's chunks of 128 Ki floats give it 8 rows, half a group
_BITONIC_MAX = 8192
# a last group of fewer buckets than this sorts by radix: padding lanes cost as much as real ones
# (bitonic wins from 3 rows of 512 or 128, from 8 of 2,048, whose partial group is slower)
_MIN_ROWS_NARROW = 4  # padded width 512 or less
_MIN_ROWS_WIDE = 8
_BLOCK = 16  # points sorted in registers before the first merge
_L1_POINTS = 256  # points of the transposed keys in 16 KB (the merges' L1 blocking)
_SORT16 = network(_BLOCK, sort_pairs(_BLOCK))
_MERGE2 = network(2, merge_pairs(2))
_MERGE4 = network(4, merge_pairs(4))
_MERGE8 = network(8, merge_pairs(8))
_MERGE16 = network(16, merge_pairs(16))


@njit(**_OPTS)
def sort_rows(x, out):
    """out[r] = x[r] sorted ascending, for float32 (rows, w) arrays (x and out may not overlap)."""
    rows, w = x.shape
    p = 1
    while p < w:
        p <<= 1
    nb = (rows // _LANES) * _LANES if p <= _BITONIC_MAX else 0
    if p <= _BITONIC_MAX and rows - nb >= (_MIN_ROWS_NARROW if p <= 512 else _MIN_ROWS_WIDE):
        nb = rows
    if nb:
        _sort_bitonic(x[:nb], out[:nb], max(p, _BLOCK))
    if nb < rows:
        _sort_radix(x[nb:], out[nb:])


@njit(**_OPTS)
def _merge_stages(a, lo, hi, k, jhi, nst):
    """Stages j = jhi, jhi / 2, ... (nst of them, 1 to 4) of the bitonic merges of size k on
    points lo .. hi - 1 (whole blocks of 2 * jhi), fused: each vector step holds the 2 ** nst
    rows those stages compare in registers. A block that sorts descending runs the ascending
    network on its rows in reverse order."""
    s = jhi >> (nst - 1)
    last = ((1 << nst) - 1) * s * _LANES
    for base in range(lo, hi, 2 * jhi):
        o = base * _LANES
        desc = (base & k) != 0
        step = -s * _LANES if desc else s * _LANES
        for u in range(o, o + s * _LANES, VW):
            start = u + last if desc else u
            if nst == 4:
                _MERGE16(a, start, step)
            elif nst == 3:
                _MERGE8(a, start, step)
            elif nst == 2:
                _MERGE4(a, start, step)
            else:
                _MERGE2(a, start, step)


@njit(**_OPTS)
def _merge_down(a, lo, hi, k, jhi, jlo):
    """Stages j = jhi down to jlo (powers of two) of the merges of size k on points lo .. hi - 1,
    four at a time from the top; j = 8 .. 1 (within a block of 16) is always one pass of four."""
    while jhi >= jlo:
        nst = 1
        while nst < 4 and (jhi >> nst) >= jlo and ((jhi >> nst) >= _BLOCK or jhi < _BLOCK):
            nst += 1
        _merge_stages(a, lo, hi, k, jhi, nst)
        jhi >>= nst


@njit(**_OPTS)
def _network(a, p):
    """The bitonic network on the transposed keys of p points (a power of two, 16 or more).

    Blocks of 16 points are sorted in registers. Every stage with j < _L1_POINTS stays within a
    block of _L1_POINTS points (16 KB): all merges up to that size, and the low stages of every
    larger merge, run block by block while the block is in L1; only the stages that pair points
    of different blocks pass over the whole array."""
    blk = min(p, _L1_POINTS)
    for b0 in range(0, p, blk):
        for base in range(b0, b0 + blk, _BLOCK):  # ascending where the first merge wants it so
            if base & _BLOCK:
                _SORT16(a, (base + _BLOCK - 1) * _LANES, -_LANES)
            else:
                _SORT16(a, base * _LANES, _LANES)
        k = 2 * _BLOCK
        while k <= blk:
            _merge_down(a, b0, b0 + blk, k, k >> 1, 1)
            k <<= 1
    k = 2 * blk
    while k <= p:
        _merge_down(a, 0, p, k, k >> 1, blk)
        for b0 in range(0, p, blk):
            _merge_down(a, b0, b0 + blk, k, blk >> 1, 1)
        k <<= 1


@njit(**_OPTS)
def _sort_bitonic(x, out, p):
    """Bitonic sort of each row, _LANES rows at a time, keys transposed (a[i * _LANES + l] is
    point i of row l), rows padded to ``p`` points (a power of two, 16 or more) with the
    largest key. Blocks of 16 points are sorted in registers, then each merge of size k runs
    its stages four at a time (see the module docstring)."""
    rows, w = x.shape
    xv = x.view(np.int32)
    ov = out.view(np.int32)
    a = np.empty(p * _LANES, np.int32)
    top = np.int32(0x7FFFFFFF)
    xs = x.strides[0] // 4
    os = out.strides[0] // 4
    fast = w % VW == 0 and x.strides[1] == 4 and out.strides[1] == 4
    for r0 in range(0, rows, _LANES):
        nl = min(_LANES, rows - r0)
        if fast and nl == _LANES:
            for i0 in range(0, w, VW):
                transpose_keys(xv, r0 * xs + i0, xs, a, i0 * _LANES, _LANES, _LANES * xs)
            for i in range(w * _LANES, p * _LANES):
                a[i] = top
        else:
            for l in range(_LANES):
                if l < nl:
                    src = xv[r0 + l]
                    for i in range(w):
                        b = src[i]
                        a[i * _LANES + l] = b ^ ((b >> 31) & top)  # signed order = float total order
                    for i in range(w, p):
                        a[i * _LANES + l] = top
                else:
                    for i in range(p):
                        a[i * _LANES + l] = top
        _network(a, p)
        if fast and nl == _LANES:
            for i0 in range(0, w, VW):
                transpose_keys(a, i0 * _LANES, _LANES, ov, r0 * os + i0, os, 0)
        else:
            for l in range(nl):
                dst = ov[r0 + l]
                for i in range(w):
                    b = a[i * _LANES + l]
                    dst[i] = b ^ ((b >> 31) & top)


@njit(**_OPTS)
def _sort_radix(x, out):
    """LSD radix sort of each row: four 8-bit passes (see the module docstring)."""
    rows, w = x.shape
    ka = np.empty(w, np.uint32)
    kb = np.empty(w, np.uint32)
    cnt = np.empty(1024, np.int64)
    for r in range(rows):
        xi = x[r].view(np.uint32)
        for k in range(1024):
            cnt[k] = 0
        for i in range(w):
            u = xi[i]
            key = u ^ (_ALL if (u >> np.uint32(31)) else _TOP)
            ka[i] = key
            cnt[key & _BYTE] += 1
            cnt[256 + ((key >> np.uint32(8)) & _BYTE)] += 1
            cnt[512 + ((key >> np.uint32(16)) & _BYTE)] += 1
            cnt[768 + (key >> np.uint32(24))] += 1
        src = ka
        dst = kb
        for p in range(4):
            base = 256 * p
            total = 0
            same = False
            for d in range(256):
                c = cnt[base + d]
                if c == w:
                    same = True
                cnt[base + d] = total
                total += c
            if same:  # every key has this digit: the pass would not move anything
                continue
            sh = np.uint32(8 * p)
            for i in range(w):
                key = src[i]
                d = (key >> sh) & _BYTE
                pos = cnt[base + d]
                dst[pos] = key
                cnt[base + d] = pos + 1
            src, dst = dst, src
        o = out[r].view(np.uint32)
        for i in range(w):
            key = src[i]
            o[i] = key ^ (_TOP if (key >> np.uint32(31)) else _ALL)
