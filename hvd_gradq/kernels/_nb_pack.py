# mypy: ignore-errors
"""numba kernels: streamed base-s packing and unpacking of codes, bit-identical to
:mod:`hvd_gradq.wire.packing` (test_kernels checks the bytes). It stays here rather than under
``wire/``: these loops are inlined into the fused per-bucket encoders and decoders, and
``wire/`` must import with NumPy alone."""
from __future__ import annotations

import numpy as np
from numba import njit

from ._layout import L_B1, L_B2, L_B4, L_B8, L_S3, L_S5, L_S9
from ._nb_common import _OPTS, LUT3, M9, _store_u64


# ---------------------------------------------------------------------------------------------
# packing (hvd_gradq.wire.packing), streamed: codes are appended to a small buffer ``cb`` and whole
# units (8 words for sub-byte words, else one word) are packed as soon as they are complete.
# The common layouts have loops of their own (constant trip counts and multipliers, so LLVM
# vectorizes them); every other layout takes the generic loop.
# ---------------------------------------------------------------------------------------------
@njit(inline="always", **_OPTS)
def _unit(g, bits):
    return g * 8 if bits < 8 else g


@njit(**_OPTS)
def _pack(lid, s, g, bits, cb, k, out):
    """Pack ``k`` units of codes cb[0 : k*unit] to out[0:]; returns the bytes written."""
    if lid == L_B8:
        for u in range(k):
            out[u] = cb[u]
        return k
    if lid == L_B1:
        for m in range(k):
            v = 0
            for t in range(8):
                v |= np.int32(cb[8 * m + t]) << t
            out[m] = np.uint8(v)
        return k
    if lid == L_B2:
        for m in range(2 * k):
            v = 0
            for t in range(4):
                v |= np.int32(cb[4 * m + t]) << (2 * t)
            out[m] = np.uint8(v)
        return 2 * k
    if lid == L_B4:
        for m in range(4 * k):
            out[m] = np.uint8(np.int32(cb[2 * m]) | (np.int32(cb[2 * m + 1]) << 4))
        return 4 * k
    if lid == L_S3:
        for m in range(k):
            c = 5 * m
            v = (((np.int32(cb[c + 4]) * 3 + cb[c + 3]) * 3 + cb[c + 2]) * 3 + cb[c + 1]) * 3 + cb[c]
            out[m] = np.uint8(v)
        return k
    if lid == L_S9:
        for m in range(k):
            c = 5 * m
            v = (((np.int32(cb[c + 4]) * 9 + cb[c + 3]) * 9 + cb[c + 2]) * 9 + cb[c + 1]) * 9 + cb[c]
            out[2 * m] = np.uint8(v & 0xFF)
            out[2 * m + 1] = np.uint8(v >> 8)
        return 2 * k
    if lid == L_S5:
        for m in range(k):
            merged = np.int64(0)
            for i in range(8):
                c = 24 * m + 3 * i
                word = (np.int64(cb[c + 2]) * 5 + cb[c + 1]) * 5 + cb[c]
                merged |= word << (7 * i)
            for t in range(7):
                out[7 * m + t] = np.uint8((merged >> (8 * t)) & 0xFF)
        return 7 * k
    # generic
    if bits < 8:
        for u in range(k):
            merged = np.int64(0)
            for i in range(8):
                base = (u * 8 + i) * g
                word = np.int64(cb[base + g - 1])
                for j in range(g - 2, -1, -1):
                    word = word * s + cb[base + j]
                merged |= word << (bits * i)
            for t in range(bits):
                out[u * bits + t] = np.uint8((merged >> (8 * t)) & 0xFF)
        return k * bits
    nbb = bits // 8
    for u in range(k):
        base = u * g
        word = np.int64(cb[base + g - 1])
        for j in range(g - 2, -1, -1):
            word = word * s + cb[base + j]
        for t in range(nbb):
            out[u * nbb + t] = np.uint8((word >> (8 * t)) & 0xFF)
    return k * nbb


@njit(**_OPTS)
def _flush(lid, s, g, bits, cb, pend, out, opos, final):
    """Pack the whole units among the ``pend`` codes in cb (all of them, zero padded, if
    ``final``), move the rest to the front; returns (pend, opos)."""
    unit = _unit(g, bits)
    if final and pend % unit:
        pad = unit - pend % unit
        tail = cb[pend : pend + pad]
        for i in range(pad):
            tail[i] = 0
        pend += pad
    k = pend // unit
    opos += _pack(lid, s, g, bits, cb, k, out[opos:])
    rem = pend - k * unit
    left = cb[k * unit : pend]
    for i in range(rem):
        cb[i] = left[i]
    return rem, opos


@njit(inline="always", **_OPTS)
def _digits(word, s, magic, g, cb, pos):
    for _ in range(g):
        q = (word * magic) >> 32
        cb[pos] = np.uint8(word - q * s)
        word = q
        pos += 1
    return pos


@njit(**_OPTS)
def _unpack(lid, s, g, bits, magic, data, start, w, cb, wbuf):
    """Codes of symbols [start, start+w) into cb[off : off+w] (whole units are decoded, so
    cb holds w + 2 units, and 8 bytes of slack; wbuf: int64 scratch of w + 2 units); returns off."""
    unit = _unit(g, bits)
    u0 = start // unit
    nu = (start + w - 1) // unit + 1 - u0
    if lid == L_B8:
        src = data[u0:]
        for u in range(nu):
            cb[u] = src[u]
    elif lid == L_B1:
        src = data[u0:]
        for u in range(nu):
            v = np.int32(src[u])
            for t in range(8):
                cb[8 * u + t] = np.uint8((v >> t) & 1)
    elif lid == L_B2:
        src = data[2 * u0 :]
        for m in range(2 * nu):
            v = np.int32(src[m])
            for t in range(4):
                cb[4 * m + t] = np.uint8((v >> (2 * t)) & 3)
    elif lid == L_B4:
        src = data[4 * u0 :]
        for m in range(4 * nu):
            v = np.int32(src[m])
            cb[2 * m] = np.uint8(v & 15)
            cb[2 * m + 1] = np.uint8(v >> 4)
    elif lid == L_S3:
        # one table word of 5 codes a byte, stored 8 bytes at a time (cb has 8 bytes of slack)
        src = data[u0 : u0 + nu]
        for u in range(nu):
            _store_u64(cb, 5 * u, LUT3[src[u]])
    elif lid == L_S9:
        # the 5 base-9 digits of each 16-bit word as one 64-bit word (vectorized), then stored
        src = data[2 * u0 : 2 * (u0 + nu)]
        for u in range(nu):
            v = np.int64(src[2 * u]) | (np.int64(src[2 * u + 1]) << 8)
            word = np.int64(0)
            for t in range(5):
                q = (v * M9) >> 32  # v // 9 for v < 2**16
                word |= (v - 9 * q) << (8 * t)
                v = q
            wbuf[u] = word
        for u in range(nu):
            _store_u64(cb, 5 * u, wbuf[u])
    elif lid == L_S5:
        src = data[7 * u0 :]
        for u in range(nu):
            merged = np.int64(0)
            for t in range(7):
                merged |= np.int64(src[7 * u + t]) << (8 * t)
            for i in range(8):
                v = (merged >> (7 * i)) & 127
                for t in range(3):
                    q = (v * 205) >> 10  # v // 5 for v < 1024
                    cb[24 * u + 3 * i + t] = np.uint8(v - 5 * q)
                    v = q
    elif bits < 8:
        src = data[u0 * bits :]
        wmask = (np.int64(1) << bits) - 1
        pos = 0
        for u in range(nu):
            merged = np.int64(0)
            for t in range(bits):
                merged |= np.int64(src[u * bits + t]) << (8 * t)
            for i in range(8):
                word = (merged >> (bits * i)) & wmask
                if g == 1:
                    cb[pos] = np.uint8(word)
                    pos += 1
                else:
                    pos = _digits(word, s, magic, g, cb, pos)
    else:
        nbb = bits // 8
        src = data[u0 * nbb :]
        pos = 0
        for u in range(nu):
            word = np.int64(0)
            for t in range(nbb):
                word |= np.int64(src[u * nbb + t]) << (8 * t)
            if g == 1:
                cb[pos] = np.uint8(word)
                pos += 1
            elif bits <= 16:
                pos = _digits(word, s, magic, g, cb, pos)
            else:
                for _ in range(g):
                    q = word // s
                    cb[pos] = np.uint8(word - q * s)
                    word = q
                    pos += 1
    return start - u0 * unit


@njit(**_OPTS)
def final_flush(lid, s, g, bits, cb, state, out):
    pend, opos = _flush(lid, s, g, bits, cb, state[0], out, state[1], state[0] >= 0)
    state[0] = pend
    state[1] = opos
