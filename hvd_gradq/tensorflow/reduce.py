"""The TensorFlow frontend's driver of the reduction core (:mod:`hvd_gradq.reduce`): each
pattern's generator runs while Horovod traces the reduction, its requests turned into graph
collectives (:class:`~.transport.GraphTransport`).

Horovod splits a reduction into ``compress()`` and ``decompress()``: :func:`begin` (in
``compress()``) runs the pattern up to its first collective and starts it, :func:`finish` (in
``decompress()``) runs it to its end, starting each later collective as the pattern asks, and
returns the group's sum. What runs at each step is the graph these build.

What the graph does differently from an eager driver, and where it went:

* *seeds*: the words come from the slot's step counter in the graph (:class:`Flow` hands the
  core's :class:`~hvd_gradq.reduce.core.Part` a ``draws`` of
  :meth:`hvd_gradq.frontend.names.Streams.words`);
* *this rank's residual*: the compressor writes it with the step's keep mask once the result's
  finiteness is known, so the core hands it over (:attr:`Flow.own`) instead of writing it;
  the owner residuals (``#reduce``, ``#host``...) the core writes through the compressor's
  memory, handed in by ``decompress()`` (:meth:`Flow.finish`);
* *figures*: bytes come from the slots' static sizes and time from the host functions
  (:mod:`.telemetry`), so the core counts nothing here (``stats=None``);
* *values*: none can be read on the host while tracing (``traced``), and the hierarchical
  pattern's fp32 pieces are added in one exact function (``adds``: :func:`.codec.host_sum`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from .. import feedback
from .. import reduce as core
from ..feedback import Memory
from ..policy import Policy
from ..schemes.scheme import Scheme
from ..spec import Config
from ..xp import Array, Seed
from .codec import host_sum
from .ops import TF
from .transport import GraphTransport


@dataclass
class Flow:
    """A tensor's pattern from ``compress()`` to ``decompress()``: the generator, the
    collective in flight, and this rank's gradient as sent (``own``, decoded; with ``ef``)."""

    gen: core.Phases
    transport: GraphTransport
    red: core.Reduction
    handle: Any = None
    own: Any = None

    def keep(self, sent: Array, decoded: Array) -> None:
        self.own = decoded

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


Make = Callable[[core.Reduction, core.Part, Array], core.Phases]


def begin(make: Make, scheme: Scheme, ef: bool, x: Any, part: core.Part, ps: Any) -> Flow:
    """Start the pattern ``make`` builds on flat float32 ``x`` (its residual added) for ``part``
    (its draws the graph's), up to its first collective on process set ``ps``; ``ef``: whether
    this tensor keeps residuals."""
    config = Config(scheme, Policy(feedback=feedback.CLASSIC if ef else feedback.NONE))
    # seed 0: the part's draws replace the host rule
    red = core.Reduction(config, 0, hvd.rank(), None, None, TF, traced=True, adds=_rows_sum)
    flow = Flow(make(red, part, x), GraphTransport(ps), red)
    red.kept = flow.keep  # before the generator runs
    flow.handle = flow.transport.start(next(flow.gen))
    return flow


def _rows_sum(buf: Any, rows: int, m: int) -> Any:
    """The host's fp32 pieces added in row order, as written (:func:`.codec.host_sum`)."""
    return host_sum(rows, m)(tf.reshape(buf, (rows, m)))


def fixed(words: Any) -> Callable[[str], Seed]:
    """The draws of a pattern that asks for the whole tensor's words only (gather)."""

    def draws(tag: str) -> Seed:
        assert tag == "", f"draws of part {tag!r} from a tensor's words"
        out: Seed = words
        return out

    return draws
