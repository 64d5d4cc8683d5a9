"""Compiled fast paths (numba) for the level schemes, bit-identical to the NumPy reference.

``encode`` / ``decode`` return exactly what ``scheme.encode(NUMPY, ...)`` / ``scheme.decode``
return (the same meta floats, the same packed bytes, as uint8 instead of int64 byte values, the
same decoded floats), or ``None`` where no fast path exists for the scheme or its parameters,
in which case the caller runs the reference. ``tests/unit/test_kernels.py`` checks the
bit-identity; ``bench/micro/bench_kernels.py`` measures the speed (results/micro/kernels.md).

Covered: uniform, qsgd, terngrad, sign, bingrad (b, pb) and orq with any number of levels (for
4 levels or more the exact level search of :mod:`.orq_levels`, the same source the reference
runs, compiled), with any bucket, clip and scales. Not covered (None): the non-level schemes
(none, fp16, topk).

The package imports with NumPy alone; numba is imported on first use. ``available()`` says
whether it is there; the environment variable ``HVD_GRADQ_KERNELS=0`` turns the fast paths off
for the process, ``with kernels.disabled():`` for a block of code (both make every caller run
the NumPy reference: an oracle that shares no code with the kernels). The first call of each
kernel compiles it, with one INFO line on the ``hvd_gradq.kernels`` logger, and numba caches it
on disk (:mod:`._cache`: beside the module, or in the user's cache folder when the package's is
read-only; ``python -m hvd_gradq warm`` compiles them all ahead). Input must be finite and
within ``scheme.limit``, as ``hvd_gradq.quantize`` ensures before encoding (it runs the
reference otherwise, which marks such buckets NaN); see ``_numba``'s docstring for the corner
case that is not bitwise (the sign of a zero meta: a min/max, or a level taken from a sorted
bucket). Codes beyond the alphabet (a malformed payload) raise PayloadError before any kernel
runs (``wire.check_codes``), as in the reference path. Metas that are NaN (buckets that held
NaN/Inf) decode as NaN, as in the reference.

Layout: each kernel module registers a factory for its scheme classes with
``@kernel_for(ORQ)`` (:mod:`._registry`); :mod:`.even` (uniform, qsgd, terngrad, sign) and
:mod:`.levels` (bingrad, orq) hold the NumPy-side entry points, and the numba loops they call
are ``_nb_common`` (draws, fp16 rounding, tree sums, min/max), ``_nb_pack`` (streamed packing,
bit-identical to :mod:`hvd_gradq.wire.packing`), ``_nb_even``, ``_nb_levels`` and ``_nb_table``;
``_numba`` re-exports them (and ``_nb_search`` compiles :mod:`.orq_levels` and :mod:`.bingrad_pb`,
over the vector steps of ``_nb_lanes``).

Threads: ``encode`` and ``decode`` split a tensor of at least 2 x 64K elements (2 x 8K for the
encoders that sort: bingrad, orq from 4 levels) into ranges of whole buckets, aligned to the
packing's units, run on a process-wide pool (:mod:`.parallel`: why the bytes stay those of one
thread, and how many threads a call gets by default).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..schemes.scheme import Scheme
from ..wire.packing import check_codes, layout
from ..xp import seed_words

# even, levels: each registers its kernels with @kernel_for; search: installs the level searches
# the schemes call (hvd_gradq.schemes.searches)
from . import even, levels, parallel, search  # noqa: F401
from ._registry import Fed, Kernel, kernel, kernel_for, limit32, registered, scale_of
from ._switch import available, disabled

__all__ = ["Kernel", "available", "decode", "disabled", "encode", "encode_fed", "kernel", "kernel_for", "registered",
           "scan"]

Parts = dict[str, NDArray[Any]]


def encode(scheme: Scheme, x: NDArray[Any], seed: int | tuple[int, int], *, out: Parts | None = None,
           threads: int | None = None) -> Parts | None:
    """``scheme.encode(NUMPY, x, seed)`` for a flat float32 array, or None (no fast path).
    ``seed`` may be its two 32-bit words already split, as :func:`hvd_gradq.xp.uniforms` takes it.

    ``out`` may hold preallocated "meta" (float32) and "codes" (uint8) arrays of the exact
    sizes (``scheme.sections(n)``); they are filled and returned (saves the page faults of
    fresh buffers on every call). ``threads``: how many threads encode it, in ranges of whole
    buckets, the same bytes whatever the count (:mod:`.parallel`; None: :func:`.parallel.resolve`)."""
    if not available():
        return None
    k = kernel(scheme)
    if k is None:
        return None
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    n = int(x.shape[0])
    meta = _buffer(out, "meta", k.nbuckets(n) * k.mw, np.float32)
    codes = _buffer(out, "codes", layout(k.s).nbytes(n), np.uint8)
    if n:
        sa, sb = (int(seed[0]), int(seed[1])) if isinstance(seed, tuple) else seed_words(seed)
        least = parallel.MIN_RANGE_ELEMS // (parallel.SEARCH_DIVISOR if k.searches else 1)

        def plain(b0: int, b1: int) -> None:
            k.encode(x, n, b0, b1, sa, sb, meta, codes)

        parallel.run(plain, parallel.plan(n, k.d, k.unit, threads, least))
    return {"meta": meta, "codes": codes}


def encode_fed(scheme: Scheme, x: NDArray[np.float32], e: NDArray[np.float32] | None, scale: float | None,
               seed: int | tuple[int, int], e_out: NDArray[np.float32], *, flush: bool = False,
               threads: int | None = None) -> Parts | None:
    """Error feedback's classic rule and the encode in one pass: the parts of
    ``scheme.encode(NUMPY, p, seed)`` for ``p = x + e * scale`` (``x`` where ``e`` is None: a
    first step), with the new residual ``(p - decoded) / scale`` (the old one, or 0, where that
    is not finite) written to ``e_out``; or None, where there is no fast path or a value of ``p``
    fails :func:`hvd_gradq.quantize`'s input check (NaN/Inf, or ``|p| >= scheme.limit``), and the
    caller runs the unfused path: compensate, quantize, decode, keep the residual (which handles
    such input by the policy's ``nonfinite``). ``e_out`` then holds no residual to keep.

    Why: unfused, the five steps are five passes over the tensor (:mod:`.feedback`'s two, the
    input check, the encode and this rank's own decode), each writing or reading a full-size
    array; here each bucket is compensated as it is read and its residual written from the codes
    it just got, while it is in cache, and no decoded array exists (a sum decodes this rank's
    payload with the others). The bits are the unfused path's: ``tests/unit/test_encode_fed.py``.

    ``x``, ``e`` and ``e_out`` are flat float32 arrays of one size (``e_out`` not ``e``: a step
    that is rolled back needs the old residual); ``scale`` None: unscaled. ``flush``: the rule's
    arithmetic with subnormals as zeros, TensorFlow's (:mod:`.feedback`'s ``flush``). ``threads``:
    as :func:`encode`'s (each range writes its own slice of ``e_out``)."""
    if not available():
        return None
    k = kernel(scheme)
    if k is None:
        return None
    n = int(x.shape[0])
    for name, a in (("x", x), ("e", e), ("e_out", e_out)):
        if a is not None and (a.dtype != np.float32 or a.shape != (n,) or not a.flags.c_contiguous):
            raise ValueError(f"encode_fed: {name} must be a contiguous float32 array of {n} elements")
    if not e_out.flags.writeable or e_out is e:
        raise ValueError("encode_fed: e_out must be a writeable array other than e (a rollback reads e)")
    meta = np.empty(k.nbuckets(n) * k.mw, np.float32)
    codes = np.empty(layout(k.s).nbytes(n), np.uint8)
    if n:
        s, scaled = scale_of(scale, flush)
        fed = Fed(e if e is not None else e_out, e_out, s, scaled, e is not None, limit32(scheme.limit), flush)
        sa, sb = (int(seed[0]), int(seed[1])) if isinstance(seed, tuple) else seed_words(seed)
        least = parallel.MIN_RANGE_ELEMS // (parallel.SEARCH_DIVISOR if k.searches else 1)
        ranges = parallel.plan(n, k.d, k.unit, threads, least)
        fine = [True] * len(ranges)
        slot = {r: i for i, r in enumerate(ranges)}

        def job(b0: int, b1: int) -> None:
            fine[slot[b0, b1]] = k.encode(x, n, b0, b1, sa, sb, meta, codes, fed)

        parallel.run(job, ranges)
        if not all(fine):
            return None
    return {"meta": meta, "codes": codes}


def scan(x: NDArray[Any], limit: float, threads: int | None = None) -> tuple[bool, bool] | None:
    """(every value finite, every |value| < ``limit``) for a flat float32 array, in one pass over
    its bits (the largest magnitude's bits; a NaN's are larger than any), or None without the
    kernels. The input check of :func:`hvd_gradq.quantize`, at the speed of a read; over
    ``threads`` ranges of elements for a large array (the largest bits of the ranges' largest)."""
    if not available():
        return None
    n = x.shape[0]
    if n == 0:
        return True, True
    from ._nb_common import _maxabs  # numba: imported on first use

    ranges = parallel.plan(n, 1, 1, threads)
    tops = np.zeros(len(ranges), np.float32)
    slot = {r: i for i, r in enumerate(ranges)}

    def job(e0: int, e1: int) -> None:
        tops[slot[e0, e1]] = _maxabs(x[e0:e1], e1 - e0)

    parallel.run(job, ranges)
    m = float(tops.view(np.int32).max().view(np.float32))  # by bits, as _maxabs: NaN beats inf
    return math.isfinite(m), math.isfinite(m) and m < limit


def _buffer(out: Parts | None, name: str, size: int, dtype: Any) -> NDArray[Any]:
    if out is not None and name in out:
        buf = out[name]
        if buf.dtype != dtype or buf.shape != (size,) or not buf.flags.c_contiguous or not buf.flags.writeable:
            raise ValueError(f"out[{name!r}] must be a writeable contiguous {np.dtype(dtype)} array of {size}")
        return buf
    return np.empty(size, dtype)


def _wire_parts(k: Kernel, parts: Parts, n: int) -> tuple[NDArray[Any], NDArray[Any]] | None:
    meta = np.ascontiguousarray(np.asarray(parts["meta"]), dtype=np.float32).reshape(-1)
    codes = np.asarray(parts["codes"]).reshape(-1)
    if codes.dtype != np.uint8:
        codes = codes.astype(np.uint8)
    codes = np.ascontiguousarray(codes)
    if meta.shape[0] != k.nbuckets(n) * k.mw or codes.shape[0] != layout(k.s).nbytes(n):
        return None
    check_codes(codes, k.s, n)  # a code beyond the table would read NaN: PayloadError instead
    return meta, codes


def _out_ok(out: NDArray[Any], n: int) -> bool:
    return bool(out.dtype == np.float32 and out.shape == (n,) and out.flags.c_contiguous and out.flags.writeable)


def decode(scheme: Scheme, parts: Parts, n: int, *, out: NDArray[Any] | None = None, acc: bool = False,
           threads: int | None = None) -> NDArray[Any] | None:
    """``scheme.decode(NUMPY, parts, n)`` as a float32 array, or None (no fast path).
    ``out``: a preallocated float32 array of ``n`` elements to decode into (and return).
    ``acc``: add the decoded values to ``out`` instead (``out += decoded``, each element one
    float32 addition, the bits of NumPy's ``out + decoded``), with no decoded array in between: a
    sum over ranks in one buffer. ``threads``: as :func:`encode`'s (each range writes its own
    slice of ``out``)."""
    if acc and out is None:
        raise ValueError("acc=True adds to out: give the array to add to")
    if not available():
        return None
    k = kernel(scheme)
    if k is None:
        return None
    wp = _wire_parts(k, parts, n)
    if wp is None:
        return None
    if out is None:
        out = np.empty(n, np.float32)
    elif not _out_ok(out, n):
        raise ValueError(f"out must be a writeable contiguous float32 array of {n} elements")
    if n:
        meta, codes, dst = wp[0], wp[1], out
        ranges = parallel.plan(n, k.d, k.unit, threads)  # ~1 ns an element, whatever the scheme
        parallel.run(lambda b0, b1: k.decode(meta, codes, n, b0, b1, dst, acc), ranges)
    return out
