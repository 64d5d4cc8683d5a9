# mypy: ignore-errors
"""numba kernels: each bucket sorted, on order-preserving integer keys.

:func:`sort_rows` picks one of two sorts that give the same bits (IEEE total order):

* **Bitonic, 32 buckets at once** (:func:`_sort_bitonic`, buckets of up to 2,048 after padding
  to a power of two, 8 or more of them): the keys of 32 buckets are laid out transposed, one
  bucket a lane, so every compare-exchange of the network is an integer min/max over contiguous
  memory, 8 lanes to an AVX2 instruction. ~5 ns an element at 512 against the radix sort's ~9.5,
  ~4 against ~17 at 128 (its 1,024 counters cost as much as a small bucket).
* **LSD radix** (:func:`_sort_radix`) for the rest: a few buckets (the tail of a tensor) or
  wide ones.

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

_TOP = np.uint32(0x80000000)
_ALL = np.uint32(0xFFFFFFFF)
_BYTE = np.uint32(255)


_LANES = 32  # buckets a bitonic pass sorts together (512 x 32 int32 keys: 64 KB)
_BITONIC_MAX = 2048  # padded width beyond which the radix sort is faster here
_BITONIC_MIN_ROWS = 8  # fewer buckets than this would leave most lanes padding


@njit(**_OPTS)
def sort_rows(x, out):
    """out[r] = x[r] sorted ascending, for float32 (rows, w) arrays (x and out may not overlap)."""
    rows, w = x.shape
    p = 1
    while p < w:
        p <<= 1
    nb = (rows // _LANES) * _LANES if p <= _BITONIC_MAX else 0
    if p <= _BITONIC_MAX and rows - nb >= _BITONIC_MIN_ROWS:
        nb = rows
    if nb:
        _sort_bitonic(x[:nb], out[:nb], p)
    if nb < rows:
        _sort_radix(x[nb:], out[nb:])


@njit(**_OPTS)
def _sort_bitonic(x, out, p):
    """Bitonic sort of each row, _LANES rows at a time, keys transposed (a[i * _LANES + l] is
    point i of row l), rows padded to ``p`` points (a power of two) with the largest key."""
    rows, w = x.shape
    xv = x.view(np.int32)
    ov = out.view(np.int32)
    a = np.empty(p * _LANES, np.int32)
    top = np.int32(0x7FFFFFFF)
    for r0 in range(0, rows, _LANES):
        nl = min(_LANES, rows - r0)
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
        k = 2
        while k <= p:
            j = k >> 1
            while j >= 1:
                m = j * _LANES
                for base in range(0, p, 2 * j):
                    lo = a[base * _LANES : base * _LANES + m]
                    hi = a[base * _LANES + m : base * _LANES + 2 * m]
                    if (base & k) == 0:  # an ascending block (2j <= k: one direction a block)
                        for t in range(m):
                            u = lo[t]
                            v = hi[t]
                            lo[t] = min(u, v)
                            hi[t] = max(u, v)
                    else:
                        for t in range(m):
                            u = lo[t]
                            v = hi[t]
                            lo[t] = max(u, v)
                            hi[t] = min(u, v)
                j >>= 1
            k <<= 1
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
