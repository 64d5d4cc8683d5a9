"""What the reduction core (:mod:`hvd_gradq.reduce`) asks of TensorFlow, while Horovod traces a
reduction: graph collectives (:class:`GraphTransport`) and payloads made by host functions
(:class:`GraphCodec`).

:class:`GraphTransport` turns each request into Horovod's graph op on the tensor's process set,
named as the request says (``ignore_name_scope``: the name must be the same on every rank,
whatever scope Horovod traces in); *waiting* is only handing the symbolic result on, since the
graph orders the ops by their inputs.

:class:`GraphCodec` makes each phase's payloads in one host function (:mod:`.host`: the compiled
kernels PyTorch uses, sizes static) and never raises while encoding: under ``nonfinite=raise``
it sends the poison itself (``finite``: whether this rank's input held no NaN/Inf, a bool
tensor; :mod:`hvd_gradq.wire.poison`), and every rank's decoder raises on it after the
collective, naming the ranks, as PyTorch's do. A payload's ``own`` is an :class:`Own`: its
element count (static shapes downstream) and, where error feedback needs them, its decoded
values, made by the same host function as the payload and used in place of decoding this
rank's row again.

:func:`words`: a tensor's seed words at a step, from the step counter of the graph, in one host
function.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..reduce.core import Allgather, Alltoall, Barrier, Request
from ..schemes.scheme import Scheme
from ..spec import SchemeLike, as_config
from ..wire.poison import poisons
from ..xp import NUMPY, Seed, step_words
from . import host
from .ops import TF


def words(seed: int, step: Any) -> tuple[Any, Any]:
    """The two seed words of stream ``seed`` at ``step`` (a step counter: an int64 tensor of the
    graph, or an int), computed on the host by :func:`hvd_gradq.xp.step_words` in NumPy: the same
    integer arithmetic as its graph form, so the same words, PyTorch's host rule's too. One op a
    tensor where the graph form is 35 (two avalanche hashes of int64 ops), built anew for every
    tensor at every trace: most of what the compressor added to a traced first step (issue 35)."""

    def run(s: Any) -> tuple[Any, Any]:
        a, b = step_words(NUMPY, seed, np.int64(s))
        return np.int64(a), np.int64(b)

    a, b = tf.numpy_function(run, [step], (tf.int64, tf.int64), stateful=False, name="hvd_gradq_words")
    return tf.ensure_shape(a, ()), tf.ensure_shape(b, ())


class GraphTransport:
    """The core's collectives on one process set, as Horovod's graph ops."""

    def __init__(self, process_set: Any) -> None:
        self.process_set = process_set

    def start(self, request: Request) -> Any:
        ps, name = self.process_set, request.name
        if isinstance(request, Barrier):  # an eager driver's stop (core.halt); a traced reduction never stops so
            return hvd.allreduce(tf.zeros((1,)), op=hvd.Sum, name=name, ignore_name_scope=True, process_set=ps)
        if isinstance(request, Allgather):
            return hvd.allgather(request.buf, name=name, ignore_name_scope=True, process_set=ps)
        if isinstance(request, Alltoall):
            out, _ = hvd.alltoall(request.buf, splits=tf.constant(request.splits, tf.int32), name=name,
                                  ignore_name_scope=True, process_set=ps)
            return out
        op = hvd.Max if request.op == "max" else hvd.Sum
        value = request.value
        wide = value.dtype == tf.int64  # integer lanes, laid out to fit: int32 on the wire, as PyTorch's
        out = hvd.allreduce(tf.cast(value, tf.int32) if wide else value, op=op, name=name, ignore_name_scope=True,
                            process_set=ps)
        return tf.cast(out, tf.int64) if wide else out

    def wait(self, handle: Any) -> Any:
        return handle


@dataclass(frozen=True)
class Own:
    """This rank's decoded values of a payload it sent (f32[n]), or None where nobody asked."""

    n: int
    values: Any = None


@dataclass(frozen=True)
class Fed:
    """What the one-pass encode of a graph takes of error feedback (:meth:`GraphCodec.encode_fed_graph`):
    the residual variable's value and whether this rank owns it (a scalar bool), or None for
    both before the first, and the step's loss scale (a tensor or float), or None."""

    e: Any = None
    mine: Any = None
    scale: Any = None


class GraphCodec:
    """Payloads of one tensor's phases over ``size`` ranks, named ``what`` in errors; ``own``:
    decode what this rank sends (error feedback); ``header``: (shape, dtype) of the gradient,
    for a whole-tensor payload (the gather pattern's; chunks are flat float32)."""

    def __init__(self, size: int, what: str, own: bool, finite: Any = None,
                 header: tuple[tuple[int, ...], str] | None = None) -> None:
        self.size, self.what, self.own, self.finite, self.header = size, what, own, finite, header
        self.handoff = host.Handoff()  # the wait between an encoder and its decoder (stats)

    def encode(self, config: SchemeLike, x: Any, seed: Seed, what: str) -> tuple[Any, Own]:
        n = TF.shape(x)[0]
        buf, _, owns = self._chunks(as_config(config).scheme, x, ((0, n),), [seed], self.header)
        return buf, owns[0]

    def encode_chunks(self, config: SchemeLike, x: Any, bounds: Sequence[tuple[int, int]], seeds: Sequence[Seed],
                      what: str) -> tuple[Any, tuple[int, ...], list[Own]]:
        return self._chunks(as_config(config).scheme, x, tuple(bounds), seeds, None)

    def encode_fed(self, config: SchemeLike, x: Any, e: Any, scale: float | None, e_out: Any,
                   bounds: Sequence[tuple[int, int]], seeds: Sequence[Seed]) -> None:
        """None: host arrays are an eager driver's; a graph's pass is :meth:`encode_fed_graph`."""
        return None

    def encode_fed_graph(self, config: SchemeLike, x: Any, fed: Fed, bounds: Sequence[tuple[int, int]],
                         seeds: Sequence[Seed]) -> tuple[Any, tuple[int, ...], list[Own], Any]:
        """The payloads of the chunks of the raw gradient ``x`` with the residual ``fed`` holds
        added, their sizes, their own values (none: a sum decodes this rank's payload with the
        others) and the new residual (f32[n], the old one kept where it is not finite), from one
        host function (:func:`.host.fed_encoder`)."""
        scheme = as_config(config).scheme
        bounds = tuple(bounds)
        header = self.header  # the gather pattern's whole tensor; chunks have none
        a = tf.stack([s[0] for s in seeds])  # type: ignore[index]
        b = tf.stack([s[1] for s in seeds])  # type: ignore[index]
        lens = tuple(host.chunk_sizes(scheme, bounds, header))
        mine = fed.mine if fed.mine is not None else tf.constant(True)  # a store that keeps no owner
        inputs = [x, a, b] + ([fed.e, mine] if fed.e is not None else []) + (
            [tf.cast(fed.scale, tf.float32)] if fed.scale is not None else [])
        fn = host.fed_encoder(scheme, bounds, header, fed.e is not None, fed.scale is not None)
        buf, new = tf.numpy_function(*host.timed(fn, inputs, "encode", self.handoff), (tf.uint8, tf.float32),
                                     stateful=False, name="hvd_gradq_encode_fed")
        return (tf.ensure_shape(buf, (sum(lens),)), lens, [Own(hi - lo) for lo, hi in bounds],
                tf.ensure_shape(new, (bounds[-1][1],)))

    def _chunks(self, scheme: Scheme, x: Any, bounds: tuple[tuple[int, int], ...], seeds: Sequence[Seed],
                header: tuple[tuple[int, ...], str] | None) -> tuple[Any, tuple[int, ...], list[Own]]:
        a = tf.stack([s[0] for s in seeds])  # type: ignore[index]
        b = tf.stack([s[1] for s in seeds])  # type: ignore[index]
        lens = tuple(host.chunk_sizes(scheme, bounds, header))
        fn = host.chunk_encoder(scheme, bounds, self.own, header)
        buf, mine = tf.numpy_function(*host.timed(fn, [x, a, b], "encode", self.handoff), (tf.uint8, tf.float32),
                                      stateful=False, name="hvd_gradq_encode")
        buf = tf.ensure_shape(buf, (sum(lens),))
        mine = tf.ensure_shape(mine, (bounds[-1][1] if self.own else 0,))
        if self.finite is not None:  # every chunk the poison, padded to its traced size
            buf = tf.where(self.finite, buf, tf.constant(poisons(lens)))
        return buf, lens, [Own(hi - lo, mine[lo:hi] if self.own else None) for lo, hi in bounds]

    # the decoders make their op here, one frame below the pattern: a graph's error message lists
    # the frames that made the failing op before hvd_gradq's own text

    def verify(self, buf: Any, finder: int, phase: int, ranks: Sequence[int] | None = None,
               whole: bool = True) -> Any:
        count = (self.size if ranks is None else len(ranks)) if whole else 0  # rows: padded poisons
        fn = host.verifier(finder, phase, None if ranks is None else tuple(ranks), count)
        found = tf.numpy_function(*host.timed(fn, [buf], "decode"), tf.float64, stateful=False,
                                  name="hvd_gradq_verify")
        return tf.ensure_shape(found, (1,))

    def sum(self, buf: Any, rank: int, own: Own, what: str, ranks: Sequence[int] | None = None,
            unless: Any = None, out: Any = None) -> tuple[Any, int]:  # out: a graph's parts carry none
        count = self.size if ranks is None else len(ranks)
        rows = tf.reshape(buf, (count, -1))  # one payload a member, all of one size
        fn = host.rows_decoder(rank, self.what, None if ranks is None else tuple(ranks), own.n if unless is not None
                               else None)
        mine = [] if own.values is None else [own.values]
        guard = [] if unless is None else [unless]
        total = tf.numpy_function(*host.timed(fn, [rows, *guard, *mine], "decode", self.handoff), tf.float32,
                                  stateful=False, name="hvd_gradq_decode")
        return tf.ensure_shape(total, (own.n,)), count

    def concat(self, buf: Any, rank: int, own: Own, sizes: Sequence[int], what: str,
               ranks: Sequence[int] | None = None, unless: Any = None, out: Any = None) -> Any:
        fn = host.chunks_decoder(tuple(sizes), rank, self.what, None if ranks is None else tuple(ranks),
                                 unless is not None)
        mine = [] if own.values is None else [own.values]
        guard = [] if unless is None else [unless]
        out = tf.numpy_function(*host.timed(fn, [buf, *guard, *mine], "decode", self.handoff), tf.float32,
                                stateful=False,
                                name="hvd_gradq_decode_chunks")
        return tf.ensure_shape(out, (sum(sizes),))

    def values(self, own: Any) -> Any:
        """An :class:`Own`'s values (or a tensor of the graph, as it is)."""
        if not isinstance(own, Own):
            return own
        assert own.values is not None, "own values of a payload encoded without them"
        return own.values
