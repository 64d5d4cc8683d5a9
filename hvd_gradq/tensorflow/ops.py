"""The :class:`~hvd_gradq.xp.Ops` namespace over TensorFlow tensors, usable inside ``tf.function``.

Every primitive is a plain TF op (``tf.math``, ``tf.bitwise``, ``tf.gather``...), so the schemes'
shared mathematics runs inside the training graph; ``tf.numpy_function`` only for ``host`` (ORQ's
compiled level search at 4 levels or more) and ``host_op`` (error feedback's compiled passes).
Bit-identity with :data:`hvd_gradq.xp.NUMPY` rests on these choices (``tests/unit/test_tf_ops.py``
checks every scheme byte for byte, eager and inside ``tf.function``):

* float32/float64 ``+ - * /`` are single IEEE operations in TF's CPU kernels (correctly rounded);
  reductions whose order matters are never asked of TF: the schemes use
  :func:`~hvd_gradq.xp.tree_sum` / :func:`~hvd_gradq.xp.scan_sum`, and ``sum`` here only ever
  adds int64 (exact in any order);
* ``sqrt`` of float32 goes through float64 (correctly rounded there; rounding the float64 root
  of a float32 to float32 is then exact to the bit), as in ``TorchOps``;
* there is no ``argmax`` (ties: ``first_argmax`` in :mod:`hvd_gradq.xp`); ``topk_abs`` follows
  :data:`hvd_gradq.xp.TOPK_TIES` (equal magnitudes: the lower index), as every namespace does;
* int64 arithmetic (the counter-based draws and the packing) wraps nowhere: every product is
  below 2**63 by construction (see :mod:`hvd_gradq.xp`);
* in a graph, Grappler would re-associate float products and sums (``(x*c1)*c2``,
  ``(a*c)*k`` with broadcasting): constants made here are opaque to it (:func:`_opaque`), and
  the frontend runs the schemes in functions whose calls turn the offending passes off
  (:mod:`hvd_gradq.tensorflow.codec`). A plain ``tf.function`` of ``scheme.encode(TF, ...)``
  under TF's default Grappler is *not* guaranteed to match NumPy;
* not covered: float32 subnormals (|x| < 1.18e-38). TF's CPU kernels run with flush-to-zero /
  denormals-are-zero, so such inputs count as 0 in TF and not in NumPy; and the sign of a zero
  among equal values after ``sort`` (-0.0 vs 0.0 may come out in either order).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from numpy.typing import NDArray

from ..errors import GradqError
from ..frontend.settings import env_elements
from ..xp import Array, Ops, _host_result

_DT = {"int64": tf.int64, "float32": tf.float32, "float64": tf.float64, "uint8": tf.uint8,
       "float16": tf.float16, "int32": tf.int32}


def _t(x: Array) -> Any:
    return x if isinstance(x, (tf.Tensor, tf.Variable)) else tf.convert_to_tensor(x)


#: Elements from which error feedback runs as host ops by default (:meth:`TFOps.host_op_min`)
HOST_OP_MIN = 1 << 20
HOST_OP_MIN_ENV = "HVD_GRADQ_TF_EF_HOST_MIN"


@functools.lru_cache(maxsize=1)
def _gpus() -> bool:
    """Whether TensorFlow has a GPU to place an unplaced operation on."""
    return bool(tf.config.list_logical_devices("GPU"))


def _opaque(t: Any) -> Any:
    """A constant that Grappler cannot see through (in a graph; eager tensors pass as they are).

    Grappler's constant folding re-associates float products with two constant factors,
    ``(x * c1) * c2 -> x * (c1 * c2)`` ("constant push-down"), which changes the rounding: with
    the table ``lo + ((hi - lo) * c1) * k`` of an evenly spaced scheme, decoded values came out
    one ulp away from NumPy's. Constants made here (aranges, tables, zeros) go through
    ``PlaceholderWithDefault``, which Grappler never folds, so no such chain is ever constant.
    """
    if tf.executing_eagerly():
        return t
    return tf.raw_ops.PlaceholderWithDefault(input=t, shape=t.shape)


class TFOps:
    """NumPy-named primitives over ``tf.Tensor`` (eager or symbolic; static shapes required)."""

    name = "tensorflow"

    def f32(self, x: Array) -> Array:
        return tf.cast(_t(x), tf.float32)

    def i64(self, x: Array) -> Array:
        return tf.cast(_t(x), tf.int64)

    def f64(self, x: Array) -> Array:
        return tf.cast(_t(x), tf.float64)

    def arange(self, n: int) -> Array:
        return _opaque(tf.range(n, dtype=tf.int64))

    def zeros(self, shape: tuple[int, ...], dtype: str) -> Array:
        return _opaque(tf.zeros(shape, dtype=_DT[dtype]))

    def full(self, shape: tuple[int, ...], value: float) -> Array:
        return _opaque(tf.fill(shape, tf.constant(value, tf.float32)))

    def shape(self, x: Array) -> tuple[int, ...]:
        dims = _t(x).shape.as_list()
        if any(d is None for d in dims):
            raise GradqError(f"hvd_gradq needs tensors of static shape inside the graph; got {dims}")
        return tuple(int(d) for d in dims)

    def reshape(self, x: Array, shape: tuple[int, ...]) -> Array:
        return tf.reshape(x, shape)

    def concat(self, xs: Sequence[Array], axis: int) -> Array:
        return tf.concat(list(xs), axis=axis)

    def amax(self, x: Array, axis: int) -> Array:
        return tf.reduce_max(x, axis=axis, keepdims=True)

    def amin(self, x: Array, axis: int) -> Array:
        return tf.reduce_min(x, axis=axis, keepdims=True)

    def sum(self, x: Array, axis: int) -> Array:
        # Exact for the integers the schemes add; float sums go through xp.tree_sum.
        return tf.reduce_sum(x, axis=axis, keepdims=True)

    def sort(self, x: Array, axis: int) -> Array:
        return tf.sort(x, axis=axis)

    def take(self, x: Array, idx: Array) -> Array:
        return tf.gather(tf.reshape(x, [-1]), idx)

    def take_along(self, x: Array, idx: Array) -> Array:
        xs, js = self.shape(x), self.shape(idx)
        if xs[0] != js[0]:
            x = tf.broadcast_to(x, (js[0], xs[1]))
        return tf.gather(x, idx, axis=1, batch_dims=1)

    def abs(self, x: Array) -> Array:
        return tf.abs(x)

    def sqrt(self, x: Array) -> Array:
        x = _t(x)
        if x.dtype == tf.float32:
            return tf.cast(tf.sqrt(tf.cast(x, tf.float64)), tf.float32)
        return tf.sqrt(x)

    def floor(self, x: Array) -> Array:
        return tf.floor(x)

    def where(self, c: Array, a: Array, b: Array) -> Array:
        return tf.where(c, a, b)

    def minimum(self, a: Array, b: Array) -> Array:
        return tf.minimum(a, b)

    def maximum(self, a: Array, b: Array) -> Array:
        return tf.maximum(a, b)

    def clip(self, x: Array, lo: Array, hi: Array) -> Array:
        return tf.minimum(tf.maximum(x, lo), hi)

    def isfinite(self, x: Array) -> Array:
        return tf.math.is_finite(x)

    def shr(self, x: Array, k: int) -> Array:
        x = _t(x)
        return tf.bitwise.right_shift(x, tf.constant(k, x.dtype))

    def xor(self, a: Array, b: Array) -> Array:
        a = _t(a)
        return tf.bitwise.bitwise_xor(a, tf.cast(_t(b), a.dtype))

    def band(self, a: Array, b: int) -> Array:
        a = _t(a)
        return tf.bitwise.bitwise_and(a, tf.cast(_t(b), a.dtype))

    def floordiv_by(self, a: Array, b: Array) -> Array:
        a = _t(a)
        return tf.math.floordiv(a, tf.cast(_t(b), a.dtype))

    def mod(self, a: Array, b: int) -> Array:
        a = _t(a)
        return tf.math.floormod(a, tf.cast(_t(b), a.dtype))

    def scatter(self, n: int, idx: Array, vals: Array) -> Array:
        return tf.tensor_scatter_nd_update(
            tf.zeros((n,), tf.float32), tf.reshape(tf.cast(idx, tf.int64), (-1, 1)), tf.cast(vals, tf.float32)
        )

    def topk_abs(self, x: Array, k: int) -> Array:
        n = self.shape(x)[0]
        if k >= n:
            return self.arange(n)
        # TOPK_TIES (hvd_gradq.xp), as TorchOps: the k-th largest |x| from top_k, then every
        # element above it and its ties by lowest index; tf.where lists them ascending
        a = tf.abs(_t(x))
        t = tf.reduce_min(tf.math.top_k(a, k=k, sorted=False).values)
        above = a > t
        ties = a == t
        need = k - tf.reduce_sum(tf.cast(above, tf.int64))
        chosen = tf.logical_or(above, tf.logical_and(ties, tf.cumsum(tf.cast(ties, tf.int64)) <= need))
        return tf.reshape(tf.where(chosen), (k,))

    def to_f16(self, x: Array) -> Array:
        return tf.cast(x, tf.float16)

    def guard_max_abs(self, x: Array, bound: float, message: str) -> Array:
        """``x``, checked to hold no finite value of magnitude above ``bound`` (NaN/Inf are the
        non-finite policy's business). Eager: raises GradqError now; in a graph: the returned
        tensor carries a ``tf.debugging.Assert`` that fails the step with ``message``
        (``InvalidArgumentError``), since a graph cannot raise Python errors on values."""
        x = _t(x)
        a = tf.abs(x)
        big = tf.reduce_max(tf.where(tf.math.is_finite(a), a, tf.zeros_like(a)))
        if tf.executing_eagerly():
            if float(big) > bound:
                raise GradqError(f"{message} (largest magnitude {float(big):.6g})")
            return x
        ok = big <= tf.cast(bound, big.dtype)
        with tf.control_dependencies([tf.debugging.Assert(ok, [message, "largest magnitude:", big])]):
            return tf.identity(x)

    def to_numpy(self, x: Array) -> NDArray[Any]:
        if isinstance(x, np.ndarray):
            return x
        if not tf.executing_eagerly():
            raise GradqError("TFOps.to_numpy needs eager tensors (called while building a graph)")
        return np.asarray(x.numpy())

    def from_numpy(self, x: NDArray[Any]) -> Array:
        return _opaque(tf.constant(np.ascontiguousarray(x)))

    def host(self, fn: Callable[[NDArray[Any]], NDArray[Any]], x: Array, shape: tuple[int, ...]) -> Array:
        """``fn`` through ``tf.numpy_function`` (eager or in a graph), float32 of the static ``shape``.
        Stateless: the same input gives the same output (deterministic host code)."""
        return self.host_op(fn, [x], shape)

    #: TensorFlow's CPU kernels run with flush-to-zero and denormals-are-zero (``ScopedFlushDenormal``
    #: on its threads): host code standing in for its operations must flush subnormals too
    flushes_subnormals = True

    def host_op(self, fn: Callable[..., Any], inputs: Sequence[Array], shape: tuple[int, ...],
                name: str = "hvd_gradq_host") -> Array:
        """``fn`` of the inputs' NumPy values as one ``tf.numpy_function`` op, float32 of the static
        ``shape``: the optional hook through which compiled host code (:class:`hvd_gradq.feedback.Memory`)
        replaces a chain of graph ops. Stateless: deterministic host code of its inputs only."""
        y = tf.numpy_function(lambda *v: _host_result(fn(*v), shape), [_t(x) for x in inputs], tf.float32,
                              stateful=False, name=name)
        y.set_shape(shape)
        return y

    def host_op_min(self) -> int:
        """Elements from which :class:`hvd_gradq.feedback.Memory` runs error feedback's passes as
        host ops: ``HVD_GRADQ_TF_EF_HOST_MIN``, else :data:`HOST_OP_MIN` (0: every tensor). A host
        op has a fixed cost TF's operations have not (the Python call, the GIL, handed between
        the executor's threads: 40-400 us a call on a loaded 2-core host), paid back only by
        large tensors: ``bench/micro/tf_feedback.py`` with two processes on 2 cores measured the
        two host ops 1.2-1.6x faster than the rule's graph ops at 1M elements (1.8-1.9x at 4M),
        0.8-0.9x at 256K-512K, 0.5-0.7x at 64K and 0.2x at 4K."""
        return env_elements(HOST_OP_MIN_ENV, HOST_OP_MIN, "every tensor")

    def on_host(self, x: Array) -> bool:
        """Whether ``x`` is a float32 tensor on the CPU (placed there, or unplaced with no GPU to
        go to), which host code takes without a copy from a device."""
        t = _t(x)
        if t.dtype != tf.float32:
            return False
        kind = tf.DeviceSpec.from_string(t.device or "").device_type
        return kind == "CPU" if kind else not _gpus()


TF = TFOps()
_check: Ops = TF  # TFOps satisfies the Ops protocol (checked by mypy)

