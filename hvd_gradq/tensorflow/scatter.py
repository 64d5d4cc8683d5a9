"""The scatter pattern (scatter-reduce + allgather) in graph ops: PyTorch's, with the same bytes.

``compress()`` starts phase 1 (:func:`scatter_start`): the flat input, error feedback added, is
cut into N chunks on bucket boundaries (:func:`~hvd_gradq.frontend.patterns.chunk_bounds`), each
chunk encoded on the host as a payload of its own (:func:`.host.chunk_encoder`), and
``hvd.alltoall`` hands rank j every rank's payload of chunk j. ``decompress()`` runs phase 2
(:func:`scatter_finish`): rank j decodes those N payloads and sums them in rank order (the
gather pattern's decoder), adds its own scatter-side residual when ``ef``, re-encodes the sum with
the second-phase :func:`~hvd_gradq.frontend.patterns.reduced_scheme`, and ``hvd.allgather`` spreads the N
reduced chunks; every rank decodes them in rank order and concatenates them (the same bytes and
the same computation on every rank). Error feedback of the rank's own gradient is the gather
pattern's, with this rank's own decoded chunks concatenated as what was sent.

*Draws.* By the seeds' one rule (:mod:`hvd_gradq.frontend.names`), stepped in the graph: chunk j
draws from the stream of ``<key>#j``, the reduced chunk from ``<key>#reduce``
(:func:`hvd_gradq.feedback.reduced_key`), as PyTorch's.

*The scatter side's residual* (``residuals["<key>#reduce"]``, :mod:`.state`) is as wide as the
widest chunk on every rank, the rank's own chunk zero-padded to it: so a checkpoint written on
one rank restores on any other (whose owner check then starts it from zero) even where the
chunks are uneven.

*Non-finite values.* ``nonfinite=raise``: a rank whose input held NaN/Inf sends all-zero poison
payloads for every chunk, so every rank receives one and fails at its phase-1 decode with the
gather pattern's message, after the alltoall and before any rank starts phase 2. ``propagate``:
a level scheme's NaN bucket decodes as NaN in the partial sum, is re-encoded as a NaN bucket
(chunks start on bucket boundaries, so buckets stay whole) and decodes as NaN on every rank.

Collective names (the compressor's docstring): ``a`` the alltoall, ``r`` the reduced allgather.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from ..feedback import REDUCED, Memory, reduced_key
from ..frontend import names
from ..frontend.names import Kind, Streams
from ..frontend.patterns import chunk_bounds, reduced_scheme
from ..schemes.scheme import Scheme
from ..wire.payload import header_size
from ..wire.poison import poisons
from . import host
from .callsite import set_suffix
from .collectives import Ctx
from .ops import TF
from .state import make_residual


@dataclass
class Phase2:
    """What phase 2 needs from phase 1 (``Ctx.scatter``)."""

    bounds: list[tuple[int, int]]
    own: Any  # this rank's decoded chunks, concatenated (f32[n]; ef only, else None)
    words: tuple[Any, Any]  # the reduced chunk's draws
    name: str  # the reduced allgather's name
    ps: Any


def widest(n: int, bucket: int, size: int) -> int:
    """Elements of the widest chunk: the width of every rank's scatter-side residual."""
    return max(hi - lo for lo, hi in chunk_bounds(n, bucket, size))


def server_residual(key: str, n: int, bucket: int, size: int, rank: int) -> tuple[str, Any, Any]:
    """(its key ``<key>#reduce``, residual, owner): the ``tf.Variable`` s of slot ``key``'s
    scatter-side residual, as wide as the widest chunk (:func:`.state.make_residual`)."""
    rk = reduced_key(key)
    return (rk, *make_residual(rk, widest(n, bucket, size), rank))



def _sizes(scheme: Scheme, bounds: list[tuple[int, int]]) -> list[int]:
    return [header_size(scheme.spec, 1) + scheme.nbytes(hi - lo) for lo, hi in bounds]


def scatter_start(scheme: Scheme, cid: str, x: Any, streams: Streams, step: Any, key: str, ctx: Ctx,
                  ps: Any, own: bool) -> None:
    """Encode the N chunks of ``x`` and alltoall them (into ``ctx.result``: rank j's chunk from
    every rank, one row a rank); ``own``: keep this rank's decoded chunks for error feedback."""
    bounds = chunk_bounds(ctx.n, scheme.bucket, ctx.size)
    words = [streams.words(TF, step, f"#{j}") for j in range(ctx.size)]
    a, b = tf.stack([w[0] for w in words]), tf.stack([w[1] for w in words])
    buf, mine = host.chunk_encoder(scheme, tuple(bounds), own)(x, a, b)
    lens = _sizes(scheme, bounds)
    if ctx.finite is not None:  # each chunk the poison (wire/poison.py), padded to its traced size
        buf = tf.where(ctx.finite, buf, tf.constant(poisons(lens)))
    sfx = set_suffix(ps)
    recv, _ = hvd.alltoall(buf, splits=tf.constant(lens, tf.int32),
                           name=names.collective(f"{cid}.", Kind.ALLTOALL, f"{key}{sfx}"),
                           ignore_name_scope=True, process_set=ps)
    ctx.result = tf.reshape(recv, (ctx.size, lens[ctx.rank]))
    ctx.scatter = Phase2(bounds, mine if own else None, streams.words(TF, step, REDUCED),
                         names.collective(f"{cid}.", Kind.REDUCED, f"{key}{sfx}"), ps)


def scatter_finish(scheme: Scheme, ctx: Ctx, memory: Memory | None) -> tuple[Any, Any]:
    """(the sum over ranks, f32[n]; this rank's own decoded chunks or None): reduce this rank's
    chunk, re-encode it finer (its residual through ``memory`` when given), allgather, decode."""
    ph = ctx.scatter
    assert isinstance(ph, Phase2)
    lo, hi = ph.bounds[ctx.rank]
    part, _ = host.gathered_decoder(hi - lo, ctx.size, ctx.rank, ctx.what)(ctx.result)  # in rank order
    pad = [[0, widest(ctx.n, scheme.bucket, ctx.size) - (hi - lo)]]
    if memory is not None:
        assert ctx.slot is not None
        sent = memory.compensate(reduced_key(ctx.slot.key), tf.pad(part, pad))
        part = sent[: hi - lo]
    fine = reduced_scheme(scheme, ctx.size)
    buf = host.payload_encoder(fine, (hi - lo,), "float32", hi - lo)(part, ph.words[0], ph.words[1])
    gathered = hvd.allgather(buf, name=ph.name, ignore_name_scope=True, process_set=ph.ps)
    out, mine = host.chunks_decoder(tuple(h - l for l, h in ph.bounds), ctx.rank)(gathered)
    if memory is not None:
        assert ctx.slot is not None
        memory.update(reduced_key(ctx.slot.key), sent, tf.pad(mine, pad))
    return out, ph.own
