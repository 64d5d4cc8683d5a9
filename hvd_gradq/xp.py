"""The array namespace the schemes are written against, and the shared random draws.

Each scheme's mathematics is written once against :class:`Ops`, a small set of primitives with
NumPy names. :data:`NUMPY` is the reference; ``hvd_gradq.torch`` and ``hvd_gradq.tensorflow``
provide the same primitives over torch tensors and TensorFlow tensors (the latter usable inside
``tf.function``). All arithmetic is float32 or int64 in the same order in every namespace, so
the same input and the same draws give bit-identical codes everywhere.

Random draws come from a counter-based hash of (seed, element index), written as int64
arithmetic on 32-bit values with multipliers below 2**31, so no product overflows int64 and
every namespace computes the same bits.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from .errors import GradqError

Array = Any  # an array of whichever namespace is in use

MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31 (so that a 32-bit value times one fits in int64).
_M1 = 0x2C1B3C6D
_M2 = 0x297A2D39
_M3 = 0x7FEB352D

#: Top-K's one selection rule (``Ops.topk_abs``), a total order every namespace computes exactly:
#: larger ``|x|`` first, and among equal ``|x|`` (fp16/bf16 gradients tie often; ``x`` and ``-x``
#: tie) the lower index first. Library selections promise nothing about ties (NumPy's
#: ``argpartition``, ``torch.topk`` on CPU or CUDA), so each namespace only asks them for the
#: k-th largest value, which ties cannot change, and picks the elements itself.
TOPK_TIES = "larger |x| first; equal |x|: lower index first"


class Ops(Protocol):
    """Primitives a scheme may use. Shapes follow NumPy broadcasting."""

    name: str

    def f32(self, x: Array) -> Array: ...
    def i64(self, x: Array) -> Array: ...
    def f64(self, x: Array) -> Array: ...
    def scatter(self, n: int, idx: Array, vals: Array) -> Array: ...
    def arange(self, n: int) -> Array: ...
    def zeros(self, shape: tuple[int, ...], dtype: str) -> Array: ...
    def full(self, shape: tuple[int, ...], value: float) -> Array: ...
    def shape(self, x: Array) -> tuple[int, ...]: ...
    def reshape(self, x: Array, shape: tuple[int, ...]) -> Array: ...
    def concat(self, xs: Sequence[Array], axis: int) -> Array: ...
    def amax(self, x: Array, axis: int) -> Array: ...
    def amin(self, x: Array, axis: int) -> Array: ...
    def sum(self, x: Array, axis: int) -> Array: ...
    def sort(self, x: Array, axis: int) -> Array: ...
    def take(self, x: Array, idx: Array) -> Array: ...
    def take_along(self, x: Array, idx: Array) -> Array: ...
    def abs(self, x: Array) -> Array: ...
    def sqrt(self, x: Array) -> Array: ...
    def floor(self, x: Array) -> Array: ...
    def where(self, c: Array, a: Array, b: Array) -> Array: ...
    def minimum(self, a: Array, b: Array) -> Array: ...
    def maximum(self, a: Array, b: Array) -> Array: ...
    def clip(self, x: Array, lo: Array, hi: Array) -> Array: ...
    def isfinite(self, x: Array) -> Array: ...
    def shr(self, x: Array, k: int) -> Array: ...
    def xor(self, a: Array, b: Array) -> Array: ...
    def band(self, a: Array, b: int) -> Array: ...
    def mod(self, a: Array, b: int) -> Array: ...
    def floordiv_by(self, a: Array, b: Array) -> Array: ...
    def topk_abs(self, x: Array, k: int) -> Array:
        """Indices (int64, ascending) of the ``k`` largest ``|x|`` of flat ``x`` (no NaN), chosen
        by :data:`TOPK_TIES`, so every namespace keeps the same elements, ties included."""
        ...
    def to_f16(self, x: Array) -> Array: ...
    def to_numpy(self, x: Array) -> NDArray[Any]: ...
    def from_numpy(self, x: NDArray[Any]) -> Array: ...
    def host(self, fn: Callable[[NDArray[Any]], NDArray[Any]], x: Array, shape: tuple[int, ...]) -> Array:
        """``fn`` (a NumPy function returning float32 of ``shape``) applied to ``x`` on the host,
        the result back in this namespace: how a compiled host routine (ORQ's level search)
        serves every frontend, inside a TF graph too."""
        ...


class NumpyOps:
    """The reference namespace."""

    name = "numpy"

    def f32(self, x: Array) -> Array:
        return np.asarray(x, dtype=np.float32)

    def i64(self, x: Array) -> Array:
        return np.asarray(x).astype(np.int64, copy=False)

    def f64(self, x: Array) -> Array:
        return np.asarray(x).astype(np.float64, copy=False)

    def scatter(self, n: int, idx: Array, vals: Array) -> Array:
        out = np.zeros(n, dtype=np.float32)
        out[idx] = vals
        return out

    def arange(self, n: int) -> Array:
        return np.arange(n, dtype=np.int64)

    def zeros(self, shape: tuple[int, ...], dtype: str) -> Array:
        return np.zeros(shape, dtype=np.dtype(dtype))

    def full(self, shape: tuple[int, ...], value: float) -> Array:
        return np.full(shape, value, dtype=np.float32)

    def shape(self, x: Array) -> tuple[int, ...]:
        return tuple(int(s) for s in np.shape(x))

    def reshape(self, x: Array, shape: tuple[int, ...]) -> Array:
        return np.reshape(x, shape)

    def concat(self, xs: Sequence[Array], axis: int) -> Array:
        return np.concatenate(list(xs), axis=axis)

    def amax(self, x: Array, axis: int) -> Array:
        return np.max(x, axis=axis, keepdims=True)

    def amin(self, x: Array, axis: int) -> Array:
        return np.min(x, axis=axis, keepdims=True)

    def sum(self, x: Array, axis: int) -> Array:
        return np.sum(x, axis=axis, keepdims=True)

    def sort(self, x: Array, axis: int) -> Array:
        return np.sort(x, axis=axis)

    def take(self, x: Array, idx: Array) -> Array:
        return np.take(x, idx)

    def take_along(self, x: Array, idx: Array) -> Array:
        return np.take_along_axis(x, idx, axis=-1)

    def abs(self, x: Array) -> Array:
        return np.abs(x)

    def sqrt(self, x: Array) -> Array:
        return np.sqrt(x)

    def floor(self, x: Array) -> Array:
        return np.floor(x)

    def where(self, c: Array, a: Array, b: Array) -> Array:
        return np.where(c, a, b)

    def minimum(self, a: Array, b: Array) -> Array:
        return np.minimum(a, b)

    def maximum(self, a: Array, b: Array) -> Array:
        return np.maximum(a, b)

    def clip(self, x: Array, lo: Array, hi: Array) -> Array:
        return np.minimum(np.maximum(x, lo), hi)

    def isfinite(self, x: Array) -> Array:
        return np.isfinite(x)

    def shr(self, x: Array, k: int) -> Array:
        return np.right_shift(x, k)

    def xor(self, a: Array, b: Array) -> Array:
        return np.bitwise_xor(a, b)

    def band(self, a: Array, b: int) -> Array:
        return np.bitwise_and(a, b)

    def mod(self, a: Array, b: int) -> Array:
        return np.mod(a, b)

    def floordiv_by(self, a: Array, b: Array) -> Array:
        return np.floor_divide(a, b)

    def topk_abs(self, x: Array, k: int) -> Array:
        # TOPK_TIES: the k-th largest |x| by selection, everything above it, then the lowest
        # indices among its ties; flatnonzero lists the chosen mask in ascending index order.
        n = x.shape[0]
        if k >= n:
            return np.arange(n, dtype=np.int64)
        a = np.abs(x)
        t = np.partition(a, n - k)[n - k]
        chosen = a > t
        ties = np.flatnonzero(a == t)
        chosen[ties[: k - int(np.count_nonzero(chosen))]] = True
        return np.flatnonzero(chosen).astype(np.int64)

    def to_f16(self, x: Array) -> Array:
        return np.asarray(x, dtype=np.float32).astype(np.float16)

    def to_numpy(self, x: Array) -> NDArray[Any]:
        return np.asarray(x)

    def from_numpy(self, x: NDArray[Any]) -> Array:
        return x

    def host_view(self, x: Array) -> NDArray[Any] | None:
        """``x`` itself (flat) where it is a contiguous float32 or bool array, else None: the optional
        hook through which compiled host code (:class:`hvd_gradq.feedback.Memory`) takes arrays."""
        if isinstance(x, np.ndarray) and x.dtype in (np.float32, np.bool_) and x.flags.c_contiguous:
            return x.reshape(-1)
        return None

    def host(self, fn: Callable[[NDArray[Any]], NDArray[Any]], x: Array, shape: tuple[int, ...]) -> Array:
        return _host_result(fn(np.asarray(x)), shape)


def _host_result(y: Any, shape: tuple[int, ...]) -> NDArray[Any]:
    """A host function's result as float32 of the promised static ``shape`` (a wrong shape is a
    bug in the caller: say so rather than let a graph carry a shape it does not have)."""
    out: NDArray[Any] = np.ascontiguousarray(y, dtype=np.float32)
    if out.shape != tuple(shape):
        raise GradqError(f"host function returned shape {out.shape}, promised {tuple(shape)}: fix it or the shape")
    return out


NUMPY = NumpyOps()


def _mix(ops: Ops, x: Array) -> Array:
    """A 32-bit avalanche hash (xor-shift-multiply), on int64 holding 32-bit values."""
    x = ops.band(ops.xor(x, ops.shr(x, 16)) * _M1, MASK32)
    x = ops.band(ops.xor(x, ops.shr(x, 15)) * _M2, MASK32)
    x = ops.band(ops.xor(x, ops.shr(x, 16)) * _M3, MASK32)
    return ops.xor(x, ops.shr(x, 15))


def hash32(ops: Ops, x: Array) -> Array:
    """The draws' 32-bit avalanche hash of int64 ``x`` holding 32-bit values, for other
    counter-based uses (the summable lanes' checksum weights, :mod:`hvd_gradq.wire.integrity`)."""
    return _mix(ops, x)


def _mix_int(x: int) -> int:
    """:func:`_mix` on one Python int (seeds are mixed on the host, once per tensor)."""
    x = ((x ^ (x >> 16)) * _M1) & MASK32
    x = ((x ^ (x >> 15)) * _M2) & MASK32
    x = ((x ^ (x >> 16)) * _M3) & MASK32
    return x ^ (x >> 15)


#: A stream seed, or its two 32-bit words already split (:func:`seed_words`, :func:`step_words`).
Seed = int | tuple[int, int]


def seed_words(seed: int) -> tuple[int, int]:
    """Split a (possibly large) integer seed into two 32-bit words, mixed so nearby seeds differ."""
    s = int(seed) & ((1 << 64) - 1)
    lo, hi = s & MASK32, (s >> 32) & MASK32
    a = _mix_int(lo ^ 0x9E3779B9)
    b = _mix_int(hi ^ a ^ 0x85EBCA6B)
    return a, b


def uniforms(ops: Ops, seed: int | tuple[Array, Array], start: int, n: int) -> Array:
    """``n`` float32 draws in [0, 1) for elements ``start .. start+n-1`` of stream ``seed``.

    24 random bits each, so every draw is exactly representable in float32. ``seed`` may also be
    its two seed words already split (int64 scalars of ``ops``: a TF graph derives them from a
    step counter it holds in a variable, see :func:`step_words`).
    """
    a, b = seed if isinstance(seed, tuple) else seed_words(seed)
    idx = ops.arange(n) + int(start)
    x = _mix(ops, ops.xor(ops.band(idx, MASK32), a))
    x = _mix(ops, ops.xor(x, ops.band(ops.xor(ops.shr(idx, 32), b), MASK32)))
    return ops.f32(ops.shr(x, 8)) * np.float32(1.0 / (1 << 24))


def step_words(ops: Ops, seed: int, step: Array) -> tuple[Array, Array]:
    """The two 32-bit seed words of the draws of one tensor at ``step`` (an int64 scalar array of
    ``ops``, e.g. a ``tf.Variable``'s value inside the graph).

    ``seed`` (a Python int: the tensor's stream, :func:`hvd_gradq.reduce.names.stream`) is split
    by :func:`~hvd_gradq.xp.seed_words`; the step is then mixed in with the same 32-bit hash as the
    draws themselves, so the words can be computed inside a TF graph from a step counter and, for
    tests, in NumPy: ``uniforms(ops, step_words(ops, seed, step), start, n)``.
    """
    a0, b0 = seed_words(seed)
    s = ops.i64(step)
    a = _mix(ops, ops.xor(ops.band(s, MASK32), a0))
    b = _mix(ops, ops.band(ops.xor(ops.xor(ops.band(ops.shr(s, 32), MASK32), b0), a), MASK32))
    return a, b


def step_words_int(seed: int, step: int) -> tuple[int, int]:
    """:func:`step_words` on Python ints, for a step known on the host: the same words (every
    operation is an exact integer one on values below 2**63), without the ~20 scalar operations
    of an array namespace that cost tens of microseconds a tensor."""
    a0, b0 = seed_words(seed)
    s = int(step) & ((1 << 64) - 1)
    a = _mix_int((s & MASK32) ^ a0)
    b = _mix_int((((s >> 32) & MASK32) ^ b0 ^ a) & MASK32)
    return a, b


def stream_seed(base: int, *parts: int) -> int:
    """Derive an independent stream seed from a base seed and integers (rank, step, tensor key)."""
    h = int(base) & ((1 << 64) - 1)
    for p in parts:
        a, b = seed_words(h ^ ((int(p) & ((1 << 64) - 1)) * 0x9E3779B97F4A7C15 & ((1 << 64) - 1)))
        h = (a << 32) | b
    return h


def _pow2_at_least(w: int) -> int:
    p = 1
    while p < w:
        p *= 2
    return p


def tree_sum(ops: Ops, x: Array) -> Array:
    """Row sums (rows, 1) by a fixed pairwise tree of IEEE additions.

    Library reductions add in orders of their own (NumPy pairwise, torch and Eigen vectorised
    cascades), so their float32 results differ in the last bit across namespaces. A fixed tree
    makes every namespace compute the same bits, and is as accurate as pairwise summation.
    """
    rows, w = ops.shape(x)
    p = _pow2_at_least(max(w, 1))
    if p != w:
        x = ops.concat([x, ops.zeros((rows, p - w), _dtype_name(ops, x))], 1)
    while p > 1:
        p //= 2
        x = x[:, :p] + x[:, p : 2 * p]
    return x


def scan_sum(ops: Ops, x: Array) -> Array:
    """Inclusive prefix sums along rows by a fixed Hillis-Steele scan (same bits everywhere)."""
    rows, w = ops.shape(x)
    k = 1
    while k < w:
        x = ops.concat([x[:, :k], x[:, k:] + x[:, : w - k]], 1)
        k *= 2
    return x


def _dtype_name(ops: Ops, x: Array) -> str:
    return "float64" if "64" in str(getattr(x, "dtype", "")) else "float32"


def first_argmax(ops: Ops, x: Array) -> Array:
    """Index (rows, 1) of the first maximum of each row, the same in every namespace (some
    libraries do not promise which of tied maxima their argmax returns)."""
    rows, w = ops.shape(x)
    m = ops.amax(x, 1)
    idx = ops.reshape(ops.arange(w), (1, w))
    big = ops.zeros((1, 1), "int64") + w
    return ops.amin(ops.where(x >= m, idx, big), 1)


def count_true(ops: Ops, c: Array) -> Array:
    """Row counts (rows, 1) of a boolean array, as int64."""
    return ops.sum(ops.i64(c), 1)
