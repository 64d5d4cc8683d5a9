"""The gather and summable patterns' collectives: what ``compress()`` starts and ``decompress()``
finishes (the scatter pattern's: :mod:`.scatter`).

Horovod splits a reduction into ``compress()`` (before its allreduce of our ``[1.0]``) and
``decompress()`` (after it), and our own collectives have to be issued in between from the
first call, so each pattern is a start and a finish joined by a :class:`Ctx`, the object
Horovod hands back to ``decompress()``. They live here, apart from the compressor, because they
are the part that differs by pattern; the compressor keeps what both share: the call site, the
slot, the step's seed words, error feedback (:meth:`GradqCompressor._compensate` and
``_store_residual``, kept together there) and the final scaling by Horovod's ``[1.0]``.

``gather``: the payload is encoded on the host (:mod:`.host`: the compiled kernels, the
``hvd_gradq.wire`` layout, a static size) and ``hvd.allgather`` ed; the finish parses, checks
and decodes every payload, its own included, in rank order from the gathered bytes (one
computation on the same bytes on every rank) and sums them. ``summable`` (evenly spaced
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

from ..frontend import codec as fcodec
from ..frontend import names
from ..frontend.names import Kind
from ..frontend.patterns import Pattern
from ..schemes.level import EvenLevelScheme
from ..schemes.options import NonFinite
from ..schemes.scheme import Scheme
from . import codec, host, masks
from .callsite import set_suffix
from .state import Slot


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
    result: Any = None  # gathered bytes (gather), summed int32 lanes (summable), this rank's chunks (scatter)
    meta: Any = None  # the shared meta (summable)
    x: Any = None  # the compressed input g + e (gather with ef: the residual is set in decompress)
    slot: Slot | None = None
    finite: Any = None  # nonfinite=raise: whether this rank's x held no NaN/Inf (a bool tensor)
    bad: Any = None  # summable propagate: elements of buckets that were non-finite on some rank
    what: str = ""  # "gradient <key> [shape]" for messages
    warm: Any = None  # warmup > 0: whether this step was a warm-up step (a bool tensor) ...
    total: Any = None  # ... the sum over ranks either way ...
    own: Any = None  # ... and what error feedback subtracts (x itself on warm steps: no change)
    scatter: Any = None  # the scatter pattern's phase-2 facts (:class:`.scatter.Phase2`)
    step: Any = None  # the slot's step counter before this step (stats' time: :func:`.host.recording`)


def nonfinite_message(ctx: Ctx) -> str:
    return (f"hvd_gradq: {ctx.what}: non-finite values (NaN/Inf) in this gradient on at least one rank "
            "(nonfinite=raise, checked on every rank); set nonfinite=propagate to send NaN buckets instead")


def gather_start(scheme: Scheme, cid: str, x: Any, words: Any, key: str, ctx: Ctx, ps: Any) -> None:
    """Encode ``x`` into a payload and allgather it into ``ctx.result``."""
    # on the host, by the compiled kernels PyTorch uses (host.py says why the graph stays right)
    payload = host.payload_encoder(scheme, ctx.shape, ctx.dtype.name, ctx.n)(
        x, words[0], words[1])
    if ctx.finite is not None:  # the poison (wire/poison.py), padded to the payload's traced size
        row = int(payload.shape[0])
        payload = tf.where(ctx.finite, payload, tf.constant(fcodec.poison(fcodec.Stop.NONFINITE, width=row)))
    ctx.result = hvd.allgather(payload, name=names.collective(f"{cid}.", Kind.GATHER, f"{key}{set_suffix(ps)}"),
                               ignore_name_scope=True, process_set=ps)


def gather_finish(ctx: Ctx) -> Any:
    """(sum, own): every rank's payload decoded and summed in rank order (the same bytes and
    the same computation on every rank), and this rank's own (for error feedback)."""
    rows = tf.reshape(ctx.result, (ctx.size, -1))
    return host.gathered_decoder(ctx.n, ctx.size, ctx.rank, ctx.what)(rows)


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
