"""The patterns' pure arithmetic (the summable pattern's, every pattern's final scaling) as cached
``tf.function`` s, one per scheme, size and rank count: traced once, and run exactly as written
(the gathered and scattered payloads are made on the host: :mod:`.host`).

*Traced once.* A scheme's encoder is hundreds to thousands of TF ops (ORQ's dynamic programs
most), and ``tf.function`` traces a training step at least twice (a second time once variables
were created; again on every retrace). Building those ops anew each time costs seconds a tensor,
so the pure computations (no variables, no collectives) live here in functions keyed by what
they are static in (the scheme, the rank count, ...: :func:`pure`) and their input shapes;
calling one from a trace adds a single call op.

*Exactly as written.* Grappler rewrites float arithmetic in ways that change bits: constant
folding re-associates ``(x * c1) * c2`` into ``x * (c1 * c2)``, and the arithmetic optimizer's
"minimize broadcasts" stage turns ``(a * c) * k`` with a (rows, 1), k (1, s) into ``a * (c * k)``
(both measured here on TF 2.15: decoded values one ulp away from NumPy's), and may fold a chain
of additions into an ``AddN`` of another order. So these functions are never inlined into their
caller (``_noinline``), and their call ops carry a ConfigProto with Grappler's constant folding,
arithmetic optimizer and remapper off; the runtime optimizes each function with the config of
its call. Eagerly (no graph, no Grappler) the Python function runs op by op.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cache
from typing import Any

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
from tensorflow.python.eager import context as _context

from ..frontend.compressor import final_scale as rule
from .ops import TF

_EXACT_OFF = ("arithmetic_optimization", "constant_folding", "remapping")


@contextlib.contextmanager
def exact_calls() -> Iterator[None]:
    """Function calls made in this scope (in a graph being built) carry a ConfigProto that turns
    off the Grappler passes that re-associate float arithmetic (see the module's docstring)."""
    ctx = _context.context()
    old = ctx.function_call_options
    cfg = config_pb2.ConfigProto()
    if old.config_proto_serialized:
        cfg.ParseFromString(old.config_proto_serialized)
    rw = cfg.graph_options.rewrite_options
    for name in _EXACT_OFF:
        setattr(rw, name, rewriter_config_pb2.RewriterConfig.OFF)
    ctx.function_call_options = _context.FunctionCallOptions(executor_type=old.executor_type, config_proto=cfg)
    try:
        yield
    finally:
        ctx.function_call_options = old


class _Exact:
    """A pure computation: a never-inlined ``tf.function`` called under :func:`exact_calls`
    inside graphs, the plain Python function (op by op) when executing eagerly."""

    def __init__(self, f: Any, signature: tuple[Any, ...]) -> None:
        self.python = f
        self.function = tf.function(f, input_signature=list(signature) if signature else None, autograph=False,
                                    experimental_attributes={"_noinline": True})

    def __call__(self, *args: Any) -> Any:
        if tf.executing_eagerly():
            return self.python(*args)
        with exact_calls():
            return self.function(*args)


def _fn(f: Any, *signature: Any) -> _Exact:
    return _Exact(f, signature)


@cache
def pure(f: Any, static: tuple[Any, ...]) -> Any:
    """``f(*static, TF, *arrays)`` (a pattern's pure arithmetic, :meth:`hvd_gradq.reduce.core.Reduction.pure`)
    as one exact function of the arrays, traced once per ``static`` and input shapes."""
    return _fn(lambda *arrays: f(*static, TF, *arrays))


@cache
def final_scale(n: int, size: int) -> Any:
    """(the sum over ``size`` ranks f32[n], Horovod's reduced [1.0] ``v``) -> ``sum * v / size``,
    written ``sum / size`` (v == 1) and ``sum`` (v == size) so that the plain cases keep their bits
    (PyTorch's arithmetic): exact here, where an inlined ``/ size`` became ``* (1 / size)``
    (measured at 3 ranks: one ulp off in a third of the elements)."""

    def scale(out: Any, v: Any) -> Any:
        return rule(out, v, size, tf.where, tf.equal)  # the rule is the frontends' one (frontend/compressor.py)

    return _fn(scale, tf.TensorSpec((n,), tf.float32), tf.TensorSpec((), tf.float32))


@cache
def host_sum(local: int, m: int) -> Any:
    """The hierarchical pattern's first sum: rows f32[local, m] (each of the host's ranks'
    piece) -> their sum in local rank order, f32[m]: exact here, where an inlined chain of adds
    joined the residual's into an ``AddN`` of another order (measured: one ulp off in a third of
    the owners' residuals)."""

    def add(rows: Any) -> Any:
        total = rows[0]
        for i in range(1, local):
            total = total + rows[i]
        return total

    return _fn(add, tf.TensorSpec((local, m), tf.float32))


def horovod_operand(tensor: Any, fp16: bool) -> Any:
    """What Horovod's own allreduce reduces for a tensor hvd_gradq passes to it: cast to float16
    as ``hvd.Compression.fp16`` does (``fp16``: the cost model's fallback; its decompress casts
    back, so the bits are stock fp16's), else the tensor, bfloat16 sent as float32 (Horovod's TF
    allreduce has no bfloat16)."""
    if fp16:
        return tf.cast(tensor, tf.float16)
    return tf.cast(tensor, tf.float32) if tensor.dtype == tf.bfloat16 else tensor
