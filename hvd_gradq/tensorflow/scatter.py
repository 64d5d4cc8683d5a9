"""The scatter pattern (scatter-reduce + allgather) in TensorFlow: the reduction core's
(:func:`hvd_gradq.reduce.scatter`), driven while Horovod traces the reduction (:mod:`.reduce`),
with PyTorch's bytes.

``compress()`` starts phase 1 (:func:`scatter_start`): the flat input, error feedback added, is
cut into N chunks on bucket boundaries (:func:`~hvd_gradq.plan.layout.chunk_bounds`), each
encoded as a payload of its own (one host function for all: :func:`.host.chunk_encoder`), and
``hvd.alltoall`` hands rank j every rank's payload of chunk j. ``decompress()`` runs phase 2
(:func:`scatter_finish`): rank j decodes those N payloads and sums them in rank order, adds its
own scatter-side residual when ``ef``, re-encodes the sum with the second-phase
:func:`~hvd_gradq.plan.second_phase.reduced_scheme`, and ``hvd.allgather`` spreads the N reduced
chunks; every rank decodes them in rank order and concatenates them (the same bytes and the same
computation on every rank). Error feedback of the rank's own gradient is the gather pattern's
(the compressor's), with this rank's own decoded chunks concatenated as what was sent.

*Draws.* By the seeds' one rule (:mod:`hvd_gradq.reduce.names`), stepped in the graph: chunk j
draws from the stream of ``<key>#j``, the reduced chunk from ``<key>#reduce``
(:func:`hvd_gradq.feedback.reduced_key`), as PyTorch's.

*The scatter side's residual* (``residuals["<key>#reduce"]``, :mod:`.state`) is as wide as the
widest chunk on every rank, the rank's own chunk zero-padded to it (:class:`.state.SlotStore`):
so a checkpoint written on one rank restores on any other (whose owner check then starts it
from zero) even where the chunks are uneven.

*Non-finite values.* ``propagate``: a level scheme's NaN bucket decodes as NaN in the partial
sum, is re-encoded as a NaN bucket (chunks start on bucket boundaries, so buckets stay whole)
and decodes as NaN on every rank. ``nonfinite=raise`` is refused with this pattern (its later
phase starts in ``decompress()``: :data:`.compressor.LATE_PHASES`).

Collective names (the compressor's docstring): ``a`` the alltoall, ``r`` the reduced allgather.
"""
from __future__ import annotations

from typing import Any

from .. import reduce as core
from ..feedback import Memory, reduced_key
from ..plan.layout import chunk_bounds
from ..reduce.names import Streams
from ..schemes.scheme import Scheme
from . import reduce
from .callsite import set_suffix
from .collectives import Ctx
from .ops import TF
from .state import make_residual
from .transport import GraphCodec


def widest(n: int, bucket: int, size: int) -> int:
    """Elements of the widest chunk: the width of every rank's scatter-side residual."""
    return max(hi - lo for lo, hi in chunk_bounds(n, bucket, size))


def server_residual(key: str, n: int, bucket: int, size: int, rank: int) -> tuple[str, Any, Any]:
    """(its key ``<key>#reduce``, residual, owner): the ``tf.Variable`` s of slot ``key``'s
    scatter-side residual, as wide as the widest chunk (:func:`.state.make_residual`)."""
    rk = reduced_key(key)
    return (rk, *make_residual(rk, widest(n, bucket, size), rank))


def scatter_start(scheme: Scheme, cid: str, x: Any, streams: Streams, step: Any, key: str, ctx: Ctx,
                  ps: Any, own: bool) -> None:
    """Encode the N chunks of ``x`` and alltoall them; ``own``: error feedback (this rank's
    decoded chunks kept for the compressor, its scatter-side residual kept in phase 2)."""
    codec = GraphCodec(ctx.size, ctx.what, own, ctx.finite)
    part = core.Part(f"{key}{set_suffix(ps)}", step, core.Group(ctx.rank, ctx.size, f"{cid}."), codec,
                     ctx.slot.key if ctx.slot is not None else "", lambda tag: streams.words(TF, step, tag), ctx.what)
    ctx.flow = reduce.begin(core.scatter, scheme, own, x, part, ps)


def scatter_finish(scheme: Scheme, ctx: Ctx, memory: Memory | None) -> tuple[Any, Any]:
    """(the sum over ranks, f32[n]; this rank's own decoded chunks or None): reduce this rank's
    chunk, re-encode it finer (its residual through ``memory`` when given), allgather, decode."""
    assert isinstance(ctx.flow, reduce.Flow)
    return ctx.flow.finish(memory), ctx.flow.own
