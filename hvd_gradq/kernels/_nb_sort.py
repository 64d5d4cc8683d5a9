# mypy: ignore-errors
"""numba kernel: each bucket sorted by an LSD radix sort on order-preserving integer keys.

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


@njit(**_OPTS)
def sort_rows(x, out):
    """out[r] = x[r] sorted ascending, for float32 (rows, w) arrays (x and out may not overlap)."""
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
