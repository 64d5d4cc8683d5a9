"""The TensorFlow frontend's driver of the reduction core (:mod:`hvd_gradq.reduce`): each
pattern's generator runs while Horovod traces the reduction, its requests turned into graph
collectives (:class:`~.transport.GraphTransport`).

Horovod splits a reduction into ``compress()`` and ``decompress()``: :func:`begin` (in
``compress()``) runs the pattern up to its first collective and starts it, :func:`finish` (in
``decompress()``) runs it to its end, starting each later collective as the pattern asks, and
returns the group's sum. What runs at each step is the graph these build.

What the graph does differently from an eager driver, and where it went:

* *seeds*: the words come from the slot's step counter in the graph (the compressor hands the
  core's :class:`~hvd_gradq.reduce.core.Part` a ``draws`` of :func:`.transport.words`, the
  stream's words at that step computed by a host function);
* *this rank's residual*: the compressor writes it with the step's keep mask once the result's
  finiteness is known, so the core hands it over (:attr:`Flow.own`) instead of writing it;
  the owner residuals (``#reduce``, ``#host``...) the core writes through the compressor's
  memory, handed in by ``decompress()`` (:meth:`Flow.finish`);
* *figures*: bytes come from the slots' static sizes and time from the host functions
  (:mod:`.telemetry`), so the core counts nothing here (``stats=None``);
* *values*: none can be read on the host while tracing, so a decision on values (the summable
  pattern's stop) is a host function the result waits for (:meth:`Flow.check`);
* *arithmetic*: each pattern's pure arithmetic is one exact function, traced once
  (:meth:`Flow.pure`: :func:`.codec.pure`), and the hierarchical pattern's fp32 pieces are
  added in one (:meth:`Flow.add_rows`: :func:`.codec.host_sum`), so that Grappler cannot
  reorder float arithmetic.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from .. import feedback
from .. import reduce as core
from ..feedback import Memory
from ..plan.decide import Choice
from ..policy import Policy
from ..reduce import table
from ..schemes.scheme import Scheme
from ..spec import Config
from ..xp import Array, Seed
from . import codec
from .codec import host_sum
from .ops import TF
from .transport import Fed, GraphCodec, GraphTransport


@dataclass
class Flow:
    """A tensor's pattern from ``compress()`` to ``decompress()``: the generator, the
    collective in flight, and this rank's gradient as sent (``own``, decoded; with ``ef``). It is
    the core's :class:`~hvd_gradq.reduce.core.Graph`: what a graph does its own way."""

    gen: core.Phases
    transport: GraphTransport
    red: core.Reduction
    handle: Any = None
    own: Any = None
    fed: Fed | None = None  # the residual's inputs, where the pattern adds it in its encode
    residual: Any = None  # the new residual that encode made (the compressor keeps it)

    def finish(self, memory: Memory | None = None) -> Any:
        """Run the pattern to its end (``memory``: the owner residuals'): the group's sum."""
        self.red.memory = memory
        while True:
            got = self.transport.wait(self.handle)
            try:
                request = self.gen.send(got)
            except StopIteration as stop:
                return stop.value
            self.handle = self.transport.start(request)

    # -- core.Graph --

    def keep(self, sent: Array, decoded: Array) -> None:
        self.own = decoded

    def encode_fed(self, t: core.Part, x: Array, bounds: Sequence[tuple[int, int]],
                   seeds: Sequence[Seed]) -> tuple[Any, tuple[int, ...], list[Any]] | None:
        if self.fed is None or not isinstance(t.codec, GraphCodec):
            return None
        buf, lens, owns, self.residual = t.codec.encode_fed_graph(self.red.config, x, self.fed, bounds, seeds)
        return buf, lens, owns

    def add_rows(self, buf: Array, rows: int, m: int) -> Array:
        """The host's fp32 pieces added in row order, as written (:func:`.codec.host_sum`)."""
        return host_sum(rows, m)(tf.reshape(buf, (rows, m)))

    def pure(self, f: Callable[..., Any], static: tuple[Any, ...]) -> Callable[..., Any]:
        return codec.pure(f, static)  # type: ignore[no-any-return]

    def check(self, value: Array, verdict: Callable[..., None], facts: Sequence[Array]) -> Array:
        """``value`` after a host function ran ``verdict`` on the facts' values: it raises on every
        rank that stops (TensorFlow reports it with the error's text)."""

        def run(*arrays: Any) -> Any:
            verdict(*arrays)
            return np.zeros((0,), np.float32)

        done = tf.numpy_function(run, list(facts), tf.float32, stateful=True, name="hvd_gradq_check")
        with tf.control_dependencies([done]):
            return tf.identity(value)


def begin(choice: Choice, scheme: Scheme, ef: bool, x: Any, part: core.Part, fed: Fed | None = None) -> Flow:
    """Start the decided pattern (its phases from the core's table) on flat float32 ``x`` (its
    residual added, or with ``fed`` (``part.compensated`` False) the raw gradient and what the
    pattern's one-pass encode adds to it) for ``part`` (its draws the graph's), up to its first
    collective on the part's process set; ``ef``: whether this tensor keeps residuals."""
    config = Config(scheme, Policy(feedback=feedback.CLASSIC if ef else feedback.NONE))
    # seed 0: the part's draws replace the host rule
    red = core.Reduction(config, 0, hvd.rank(), None, None, TF)
    flow = Flow(table.phases(choice, red, part, x, TF), GraphTransport(part.group.process_set), red, fed=fed)
    red.graph = flow  # before the generator runs
    flow.handle = flow.transport.start(next(flow.gen))
    return flow
