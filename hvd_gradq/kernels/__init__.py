"""Compiled fast paths (numba) for the level schemes, bit-identical to the NumPy reference.

``encode`` / ``decode`` return exactly what ``scheme.encode(NUMPY, ...)`` / ``scheme.decode``
return (the same meta floats, the same packed bytes, as uint8 instead of int64 byte values, the
same decoded floats), or ``None`` where no fast path exists for the scheme or its parameters,
in which case the caller runs the reference. ``tests/unit/test_kernels.py`` checks the
bit-identity; ``scripts/bench_kernels.py`` measures the speed (results/kernels.md).

Covered: uniform, qsgd, terngrad, sign, bingrad (b, pb) and orq with any number of levels (for
4 levels or more the exact level search of :mod:`.orq_levels`, the same source the reference
runs, compiled), with any bucket, clip and scales. Not covered (None): the non-level schemes
(none, fp16, topk).

The package imports with NumPy alone; numba is imported on first use. ``available()`` says
whether it is there; the environment variable ``HVD_GRADQ_KERNELS=0`` turns the fast paths off
for the process, ``with kernels.disabled():`` for a block of code (both make every caller run
the NumPy reference: an oracle that shares no code with the kernels). The first call of each
kernel compiles it (cached on disk afterwards, next to the module). Input must be finite and
within ``scheme.limit``, as ``hvd_gradq.quantize`` ensures before encoding (it runs the
reference otherwise, which marks such buckets NaN); see ``_numba``'s docstring for the corner
case that is not bitwise (the sign of a zero meta: a min/max, or a level taken from a sorted
bucket). Codes beyond the alphabet (a malformed payload) raise PayloadError before any kernel
runs (``packing.check_codes``), as in the reference path. Metas that are NaN (buckets that held
NaN/Inf) decode as NaN, as in the reference.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..schemes.base import Scales, Scheme
from ..schemes.bingrad import BinGrad, Variant
from ..schemes.orq import ORQ
from ..schemes.qsgd import QSGD, Norm
from ..schemes.sign import Sign
from ..schemes.terngrad import TernGrad
from ..schemes.uniform import Uniform
from ..wire.packing import check_codes, layout
from ..xp import seed_words
from ._layout import layout_id
from ._switch import available, disabled

__all__ = ["available", "decode", "disabled", "encode"]

Parts = dict[str, NDArray[Any]]

EVEN, SIGN, BINGRAD, ORQ_KIND, ORQ_EXACT = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class _Plan:
    kind: int
    d: int  # bucket
    s: int  # symbols
    g: int  # symbols a word
    bits: int  # bits a word
    lid: int  # layout id (_numba.layout_id)
    magic: int  # floor(2**32 / s) + 1: word // s == (word * magic) >> 32 for words < 2**16
    mw: int  # meta floats a bucket
    clip: np.float32
    fp16: bool
    stoch: bool
    amode: int = 0  # EVEN: 0 lo=min, step=(max-min)*cst; 1 lo=-m, step=m*cst
    mmode: int = 0  # EVEN: 0 [min, max]; 1 max|x|; 2 ||x||_2
    cst: np.float32 = np.float32(1.0)
    param: int = 0  # BINGRAD: 1 for pb

    def nbuckets(self, n: int) -> int:
        return -(-n // self.d)


@lru_cache(maxsize=256)
def _plan(scheme: Scheme) -> _Plan | None:
    t = type(scheme)
    if t not in (Uniform, QSGD, TernGrad, Sign, BinGrad, ORQ):
        return None
    assert isinstance(scheme, (Uniform, QSGD, TernGrad, Sign, BinGrad, ORQ))
    s = scheme.symbols
    if s > 256:  # codes are kept as bytes
        return None
    lay = layout(s)
    base = _Plan(
        kind=EVEN,
        d=scheme.bucket,
        s=s,
        g=lay.group,
        bits=lay.bits,
        lid=layout_id(s, lay.group, lay.bits),
        magic=(1 << 32) // s + 1,
        mw=scheme.meta_width,
        clip=np.float32(scheme.clip),
        fp16=scheme.scales is Scales.FP16,
        stoch=scheme.draws,
    )
    if isinstance(scheme, Uniform):
        return replace(base, amode=0, mmode=0, cst=np.float32(1.0 / (s - 1)))
    if isinstance(scheme, TernGrad):
        return replace(base, amode=1, mmode=1, cst=np.float32(1.0))
    if isinstance(scheme, QSGD):
        mmode = 1 if scheme.norm is Norm.MAX else 2
        return replace(base, amode=1, mmode=mmode, cst=np.float32(1.0 / scheme.levels))
    if isinstance(scheme, Sign):
        return replace(base, kind=SIGN)
    if isinstance(scheme, BinGrad):
        return replace(base, kind=BINGRAD, param=int(scheme.variant is Variant.PB))
    if s >= 4:
        return replace(base, kind=ORQ_EXACT)  # levels from orq_levels' exact search
    return replace(base, kind=ORQ_KIND)  # 2 or 3 levels: orq_small_encode, no sort


def _jit() -> Any:
    from . import _numba as mod

    return mod


def encode(scheme: Scheme, x: NDArray[Any], seed: int, *, out: Parts | None = None) -> Parts | None:
    """``scheme.encode(NUMPY, x, seed)`` for a flat float32 array, or None (no fast path).

    ``out`` may hold preallocated "meta" (float32) and "codes" (uint8) arrays of the exact
    sizes (``scheme.sections(n)``); they are filled and returned (saves the page faults of
    fresh buffers on every call)."""
    if not available():
        return None
    plan = _plan(scheme)
    if plan is None:
        return None
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    n = int(x.shape[0])
    nb = plan.nbuckets(n)
    meta = _buffer(out, "meta", nb * plan.mw, np.float32)
    codes = _buffer(out, "codes", layout(plan.s).nbytes(n), np.uint8)
    if n == 0:
        return {"meta": meta, "codes": codes}
    k = _jit()
    sa, sb = seed_words(seed)
    p = plan
    if p.kind == EVEN:
        k.even_encode(x, n, p.d, p.s, p.g, p.bits, p.lid, p.amode, p.mmode, p.cst, p.clip, p.fp16, p.stoch,
                      sa, sb, meta, codes)
    elif p.kind == SIGN:
        k.sign_encode(x, n, p.d, p.clip, p.fp16, meta, codes)
    elif p.kind == ORQ_KIND:
        k.orq_small_encode(x, n, p.d, p.s, p.g, p.bits, p.lid, p.clip, p.fp16, sa, sb, meta, codes)
    else:
        _sorted_encode(k, p, x, n, sa, sb, meta, codes)
    return {"meta": meta, "codes": codes}


def _buffer(out: Parts | None, name: str, size: int, dtype: Any) -> NDArray[Any]:
    if out is not None and name in out:
        buf = out[name]
        if buf.dtype != dtype or buf.shape != (size,) or not buf.flags.c_contiguous or not buf.flags.writeable:
            raise ValueError(f"out[{name!r}] must be a writeable contiguous {np.dtype(dtype)} array of {size}")
        return buf
    return np.empty(size, dtype)


# bingrad and orq sort every bucket: NumPy's SIMD sort, a chunk of buckets at a time (the
# chunk stays in cache for the kernel that follows)
_SORT_CHUNK_ELEMS = 1 << 17


def _sorted_encode(k: Any, p: _Plan, x: NDArray[Any], n: int, sa: int, sb: int, meta: NDArray[Any],
                   codes: NDArray[Any]) -> None:
    d = p.d
    state = np.zeros(2, np.int64)
    cb = np.empty(d + 2 * (p.g * 8 if p.bits < 8 else p.g), np.uint8)
    full = n // d
    step = max(1, _SORT_CHUNK_ELEMS // d)
    srt = np.empty((min(step, max(full, 1)), d), np.float32)
    for b0 in range(0, full, step):
        b1 = min(full, b0 + step)
        rows = srt[: b1 - b0]
        np.copyto(rows, x[b0 * d : b1 * d].reshape(b1 - b0, d))
        rows.sort(axis=1)
        k.sorted_encode(p.kind, p.param, x, rows, n, d, b0, b1, p.s, p.g, p.bits, p.lid, p.clip, p.fp16,
                        p.stoch, sa, sb, meta, codes, state, cb)
    if n % d:
        rows = np.sort(x[full * d :]).reshape(1, -1)
        k.sorted_encode(p.kind, p.param, x, rows, n, d, full, full + 1, p.s, p.g, p.bits, p.lid, p.clip,
                        p.fp16, p.stoch, sa, sb, meta, codes, state, cb)
    k.final_flush(p.lid, p.s, p.g, p.bits, cb, state, codes)


def _wire_parts(plan: _Plan, parts: Parts, n: int) -> tuple[NDArray[Any], NDArray[Any]] | None:
    meta = np.ascontiguousarray(np.asarray(parts["meta"]), dtype=np.float32).reshape(-1)
    codes = np.asarray(parts["codes"]).reshape(-1)
    if codes.dtype != np.uint8:
        codes = codes.astype(np.uint8)
    codes = np.ascontiguousarray(codes)
    if meta.shape[0] != plan.nbuckets(n) * plan.mw or codes.shape[0] != layout(plan.s).nbytes(n):
        return None
    check_codes(codes, plan.s, n)  # a code beyond the table would read NaN: PayloadError instead
    return meta, codes


def _decode_into(plan: _Plan, meta: NDArray[Any], codes: NDArray[Any], n: int, b0: int, b1: int,
                 out: NDArray[Any], acc: bool) -> None:
    k = _jit()
    p = plan
    if p.kind == EVEN:
        k.even_decode(meta, codes, n, p.d, p.s, p.g, p.bits, p.lid, p.magic, p.amode, p.cst, b0, b1, out, acc)
    else:
        k.table_decode(meta, p.mw, p.kind == SIGN, codes, n, p.d, p.s, p.g, p.bits, p.lid, p.magic, b0, b1,
                       out, acc)


def _out_ok(out: NDArray[Any], n: int) -> bool:
    return bool(out.dtype == np.float32 and out.shape == (n,) and out.flags.c_contiguous and out.flags.writeable)


def decode(scheme: Scheme, parts: Parts, n: int, *, out: NDArray[Any] | None = None) -> NDArray[Any] | None:
    """``scheme.decode(NUMPY, parts, n)`` as a float32 array, or None (no fast path).
    ``out``: a preallocated float32 array of ``n`` elements to decode into (and return)."""
    if not available():
        return None
    plan = _plan(scheme)
    if plan is None:
        return None
    wp = _wire_parts(plan, parts, n)
    if wp is None:
        return None
    if out is None:
        out = np.empty(n, np.float32)
    elif not _out_ok(out, n):
        raise ValueError(f"out must be a writeable contiguous float32 array of {n} elements")
    if n:
        _decode_into(plan, wp[0], wp[1], n, 0, plan.nbuckets(n), out, False)
    return out

