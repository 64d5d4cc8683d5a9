"""The gather and summable patterns' collectives: what ``compress()`` starts and ``decompress()``
finishes (the scatter pattern's: :mod:`.scatter`).

Horovod splits a reduction into ``compress()`` (before its allreduce of our ``[1.0]``) and
``decompress()`` (after it), and our own collectives have to be issued in between from the
first call, so each pattern is a start and a finish joined by a :class:`Ctx`, the object
Horovod hands back to ``decompress()``. They live here, apart from the compressor, because they
are the part that differs by pattern; the compressor keeps what both share: the call site, the
slot, the step's seed words, error feedback (:meth:`GradqCompressor._compensate` and
``_store_residual``, kept together there) and the final scaling by Horovod's ``[1.0]``.

``gather`` is the reduction core's (:func:`hvd_gradq.reduce.gather`, driven by :mod:`.reduce`):
the payload is encoded on the host (:mod:`.transport`'s codec: the compiled kernels, the
``hvd_gradq.wire`` layout, a static size) and ``hvd.allgather`` ed; the finish parses, checks
and decodes every payload in rank order from the gathered bytes (one computation on the same
bytes on every rank; this rank's own, with error feedback, decoded once where it was encoded)
and sums them. ``summable`` (evenly spaced
levels): a Max-allreduce of per-bucket statistics fixes a shared table, codes are packed into
int32 lanes and Sum-allreduced; the mathematics runs in :mod:`.codec` (traced once per scheme
and size, shielded from Grappler's float rewrites). The collectives' ``<kind>`` in the names the
compressor's docstring describes: ``g`` the payloads, ``s`` the statistics, ``l`` the lanes.

Both start their collective even when this rank's input is not finite, since a rank that
failed before it would leave the others waiting: under ``nonfinite=raise`` the gather payload is
the poison (:mod:`hvd_gradq.wire.poison`, PyTorch's too) and the summable statistics are +inf,
and every rank fails after the collective, naming the ranks; under ``propagate`` a summable
bucket with NaN/Inf on some rank sends +inf statistics and decodes as NaN everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from .. import reduce as core
from ..frontend import names
from ..frontend.names import Kind
from ..frontend.patterns import Pattern
from ..schemes.level import EvenLevelScheme
from ..schemes.options import NonFinite
from ..schemes.scheme import Scheme
from . import codec, masks, reduce
from .callsite import set_suffix
from .state import Slot
from .transport import GraphCodec


@dataclass
class Ctx:
    """What ``compress()`` hands Horovod for ``decompress()``: the tensor's facts, the pattern's
    collective result, and what error feedback needs after it (``x``, ``residual``)."""

    slot_index: int
    shape: tuple[int, ...]
    dtype: Any
    n: int
    pattern: Pattern | None
    size: int = 1
    rank: int = 0
    result: Any = None  # gathered bytes (gather), summed int32 lanes (summable)
    meta: Any = None  # the shared meta (summable)
    flow: Any = None  # the pattern on the reduction core (gather, scatter, hierarchical: :class:`.reduce.Flow`)
    x: Any = None  # the compressed input g + e (gather with ef: the residual is set in decompress)
    slot: Slot | None = None
    finite: Any = None  # nonfinite=raise: whether this rank's x held no NaN/Inf (a bool tensor)
    bad: Any = None  # summable propagate: elements of buckets that were non-finite on some rank
    what: str = ""  # "gradient <key> [shape]" for messages
    warm: Any = None  # warmup > 0: whether this step was a warm-up step (a bool tensor) ...
    total: Any = None  # ... the sum over ranks either way ...
    own: Any = None  # ... and what error feedback subtracts (x itself on warm steps: no change)
    step: Any = None  # the slot's step counter before this step (stats' time: :func:`.host.recording`)


def nonfinite_message(ctx: Ctx) -> str:
    return (f"hvd_gradq: {ctx.what}: non-finite values (NaN/Inf) in this gradient on at least one rank "
            "(nonfinite=raise, checked on every rank); set nonfinite=propagate to send NaN buckets instead")


def gather_start(scheme: Scheme, cid: str, x: Any, words: Any, key: str, ctx: Ctx, ps: Any) -> None:
    """Encode ``x`` into a payload and allgather it: the core's gather pattern (:mod:`.reduce`)
    up to its collective (``words``: this step's seed words)."""
    ef = ctx.slot is not None and ctx.slot.residual is not None
    codec = GraphCodec(ctx.size, ctx.what, ef, ctx.finite, (ctx.shape, ctx.dtype.name))
    part = core.Part(f"{key}{set_suffix(ps)}", ctx.step, core.Group(ctx.rank, ctx.size, f"{cid}."), codec,
                     ctx.slot.key if ctx.slot is not None else "", reduce.fixed(words))
    ctx.flow = reduce.begin(core.gather, scheme, ef, x, part, ps)
    ctx.result = ctx.flow.handle  # the gathered payloads: a tensor of the graph, as callers may want them


def gather_finish(ctx: Ctx) -> Any:
    """(sum, own): every rank's payload decoded and summed in rank order (the same bytes and
    the same computation on every rank), and this rank's own decoded payload (error feedback;
    None without it)."""
    assert isinstance(ctx.flow, reduce.Flow)
    return ctx.flow.finish(), ctx.flow.own


def summable_start(scheme: Scheme, nonfinite: NonFinite, cid: str, x: Any, words: Any, key: str, ctx: Ctx,
                   ps: Any) -> Any:
    """Agree on the shared table, then Sum-allreduce this rank's codes into ``ctx.result``;
    returns this rank's own decoded contribution (for error feedback). ``scheme`` without ``ef``."""
    assert isinstance(scheme, EvenLevelScheme)
    sfx = set_suffix(ps)
    propagate = nonfinite is NonFinite.PROPAGATE
    if propagate:  # a bucket with NaN/Inf sends +inf statistics: every rank decodes it NaN
        bad_b = masks.bad_buckets(x, scheme.bucket, ctx.n)
        x = tf.where(masks.per_element(bad_b, scheme.bucket, ctx.n), tf.zeros_like(x), x)
    stats = codec.shared_stats(scheme, ctx.n)(x)
    if ctx.finite is not None:  # a rank with NaN/Inf sends +inf statistics: every rank sees it
        stats = tf.where(ctx.finite, stats, tf.fill(tf.shape(stats), float("inf")))
    if propagate:
        stats = tf.where(bad_b[:, None], tf.fill(tf.shape(stats), float("inf")), stats)
    stats = hvd.allreduce(stats, op=hvd.Max, name=names.collective(f"{cid}.", Kind.STATS, f"{key}{sfx}"),
                          ignore_name_scope=True, process_set=ps)
    if ctx.finite is not None:
        stats = tf.debugging.assert_all_finite(stats, nonfinite_message(ctx))
    if propagate:
        all_bad = tf.reduce_any(tf.logical_not(tf.math.is_finite(stats)), axis=1)
        stats = tf.where(all_bad[:, None], tf.zeros_like(stats), stats)
        ctx.bad = masks.per_element(all_bad, scheme.bucket, ctx.n)
        x = tf.where(ctx.bad, tf.zeros_like(x), x)
    lanes, meta, own = codec.lane_encoder(scheme, ctx.n, ctx.size)(x, stats, words[0], words[1])
    ctx.meta = meta
    ctx.result = hvd.allreduce(lanes, op=hvd.Sum, name=names.collective(f"{cid}.", Kind.LANES, f"{key}{sfx}"),
                               ignore_name_scope=True, process_set=ps)
    return own


def summable_finish(scheme: Scheme, ctx: Ctx) -> Any:
    """The sum of every rank's decoded codes (NaN in buckets that were non-finite somewhere)."""
    assert isinstance(scheme, EvenLevelScheme)
    out = codec.lane_decoder(scheme, ctx.n, ctx.size)(ctx.result, ctx.meta)
    if ctx.bad is not None:
        out = tf.where(ctx.bad, tf.fill((ctx.n,), float("nan")), out)
    return out
