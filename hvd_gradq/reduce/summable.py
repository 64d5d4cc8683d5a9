"""The summable pattern, written once: even-level schemes with a shared per-bucket scale.

Phase 1 Max-allreduces each bucket's statistics (:func:`hvd_gradq.schemes.summable.local_stats`);
phase 2 encodes against the shared table they fix (``encode_shared``) and Sum-allreduces the
codes packed into integer lanes (:func:`hvd_gradq.wire.packing.pack_lanes`, laid out by
:func:`hvd_gradq.frontend.patterns.lanes_for` so that the sum over the group cannot carry into
the next field). Every step is ``Ops`` arithmetic on the tensor's own device: only the
statistics and the lanes cross.

*Values it cannot take.* The statistics carry the news, so nobody waits: a rank with NaN/Inf
under ``nonfinite=raise`` sends +inf in every bucket; a rank with a finite value beyond the
scheme's float32 range sends :func:`hvd_gradq.frontend.codec.range_stat` (the max names the
lowest such rank); under ``propagate`` the buckets holding NaN/Inf send +inf and decode as NaN
everywhere. A rank that must stop still sends its lanes (zeros) and waits for them: a rank that
raised later must not leave the others waiting, and one that raised first must not end Horovod
(its exit shuts every rank down) before the slower ranks reached the same error.
"""
from __future__ import annotations

import time
from typing import Any

from ..errors import GradqError, NonFiniteError, RangeError
from ..frontend import codec as fcodec
from ..frontend.names import Kind, collective
from ..frontend.patterns import Lanes, Pattern, cost, lanes_for
from ..schemes.level import EvenLevelScheme
from ..schemes.options import NonFinite
from ..schemes.summable import decode_codes, encode_shared, local_stats
from ..wire.packing import pack_lanes, unpack_lanes
from ..xp import Array, Ops
from .core import Allreduce, Part, Phases, Reduction, halt

_NONFINITE = ("had non-finite values (NaN/Inf) in this gradient (nonfinite=raise); the default "
              "nonfinite=propagate carries them through as Horovod does")


def _all(ops: Ops, mask: Array) -> bool:
    """Whether every element of a 1-D (or 2-D, per row: then a mask of rows) mask is set."""
    return bool(float(ops.to_numpy(ops.amin(ops.f32(ops.reshape(mask, (-1,))), 0))) == 1.0)


def _row_min(ops: Ops, mask: Array, bucket: int, n: int) -> Array:
    """Each bucket's least element of ``mask`` as float32 (1.0: all set; the padding is set)."""
    rows = -(-n // bucket)
    pad = rows * bucket - n
    m = ops.f32(mask)
    if pad:
        m = ops.concat([m, ops.full((pad,), 1.0)], 0)
    return ops.amin(ops.reshape(m, (rows, bucket)), 1)


def summable(red: Reduction, t: Part, x: Array, ops: Ops) -> Phases:
    """Shared scale (Max-allreduce of statistics), then integer lanes (Sum-allreduce); ``ops``
    are those of ``x``'s device."""
    scheme = red.config.scheme
    assert isinstance(scheme, EvenLevelScheme)
    g, policy = t.group, red.config.policy
    t0 = time.perf_counter()
    n = int(ops.shape(x)[0])
    rows = -(-n // scheme.bucket)
    local_error: GradqError | None = None
    local_bad = False
    inside = ops.abs(x) < scheme.limit  # False for NaN/Inf and for values beyond the scheme's range
    if _all(ops, inside):
        stats = local_stats(scheme, ops, x)
    elif _all(ops, ops.isfinite(x)):  # finite, too large: every rank stops (quantize raises here)
        top = float(ops.to_numpy(ops.amax(ops.abs(x), 0)))
        local_error = RangeError(
            f"{t.what}: this rank had a finite value of magnitude {top:.7g} in this gradient, beyond what "
            f"{scheme.name} quantizes in float32 (|x| < {scheme.limit:.7g}); scale the gradient down (a smaller "
            "loss scale), or use nonfinite=skip to send such tensors uncompressed")
        stats = ops.full((rows, scheme.meta_width), fcodec.range_stat(g.rank))
    elif policy.nonfinite is NonFinite.RAISE:
        local_bad = True  # +inf statistics: every rank sees it in the max and stops
        stats = ops.full((rows, scheme.meta_width), float("inf"))
    else:  # propagate: +inf statistics for the buckets holding NaN/Inf (or, as in quantize, a
        # value beyond the range beside them), zeros sent in them
        bad = ops.reshape(_row_min(ops, inside, scheme.bucket, n) < 1.0, (rows, 1))
        x = ops.where(inside, x, ops.zeros((n,), "float32"))
        stats = local_stats(scheme, ops, x)
        stats = ops.where(bad, ops.full((rows, scheme.meta_width), float("inf")), stats)
    seed = red.words(t)
    red.took("encode", t0)  # the statistics
    stats = yield Allreduce(collective(g.key, Kind.STATS, t.name), stats, "max")

    finite = ops.isfinite(stats)
    row_min = ops.amin(ops.f32(finite), 1)
    finite_rows = row_min == 1.0
    # a rank beyond the range (range_stat); hidden where another's NaN/Inf made a bucket +inf,
    # so under propagate a rank beyond the range in every such bucket stops alone (after the
    # lanes below, so nobody waits) while the others decode NaN there
    top = float(ops.to_numpy(ops.amax(ops.reshape(ops.where(finite, stats, ops.zeros(ops.shape(stats), "float32")),
                                                  (-1,)), 0))) if rows else 0.0
    peer = fcodec.range_rank(top)
    nonfinite = not _all(ops, finite_rows)
    raise_ = nonfinite and policy.nonfinite is NonFinite.RAISE
    if local_error is not None or peer is not None or raise_:
        zeros = ops.zeros((n,), "float32")
        yield from _lanes(red, t, ops, zeros, ops.zeros(ops.shape(stats), "float32"), seed)
        error: GradqError
        if local_error is not None:
            error = local_error
        elif local_bad or raise_:
            error = NonFiniteError(f"{t.what}: {'this rank' if local_bad else 'another rank'} {_NONFINITE}")
        else:
            error = RangeError(f"{t.what}: rank {peer} {fcodec.peer_message(fcodec.Stop.RANGE)}")
        if peer is not None or raise_:  # every rank read these statistics and stops here: the stop's barrier
            yield from halt(t, error)
        raise error
    bad_rows: Any = None
    if nonfinite:
        bad_rows = row_min < 1.0
        stats = ops.where(ops.reshape(finite_rows, (rows, 1)), stats, ops.zeros(ops.shape(stats), "float32"))
    meta, layout, summed = yield from _lanes(red, t, ops, x, stats, seed, ef=red.ef)
    c = cost(scheme, n, 1, g.size, Pattern.SUMMABLE)
    if red.stats is not None:
        red.stats.record(t.name, c.sent, c.received)
    return _decode(red, t, ops, meta, layout, summed, n, bad_rows)


def _lanes(red: Reduction, t: Part, ops: Ops, x: Array, stats: Array, seed: Any,
           ef: bool = False) -> Phases:
    """Encode ``x`` against the shared ``stats`` (with ``ef``, the residual of what it sends
    updated) and Sum-allreduce its lanes: returns (meta, lane layout, summed lanes)."""
    scheme = red.config.scheme
    assert isinstance(scheme, EvenLevelScheme)
    t0 = time.perf_counter()
    codes, meta = encode_shared(scheme, ops, x, stats, seed)
    lay = lanes_for(scheme.symbols, t.group.size)
    lanes = pack_lanes(ops, codes, lay.field_bits, lay.fields)
    n = int(ops.shape(x)[0])
    own = decode_codes(scheme, ops, codes, meta, n)
    red.took("encode", t0)  # codes, lanes and own values
    if ef:
        red.sent(t, x, own)
    summed = yield Allreduce(collective(t.group.key, Kind.LANES, t.name), lanes, "sum", last=True)
    return meta, lay, summed


def _decode(red: Reduction, t: Part, ops: Ops, meta: Array, layout: Lanes, summed: Array, n: int,
            bad_rows: Any) -> Array:
    """The sum of every rank's decoded codes (NaN in buckets that were non-finite somewhere)."""
    scheme = red.config.scheme
    assert isinstance(scheme, EvenLevelScheme)
    t0 = time.perf_counter()
    codes = unpack_lanes(ops, ops.i64(summed), layout.field_bits, layout.fields, n)
    out: Array = decode_codes(scheme, ops, codes, meta, n, count=t.group.size)
    if bad_rows is not None:
        rows = -(-n // scheme.bucket)
        wide = ops.where(ops.reshape(bad_rows, (rows, 1)), ops.full((rows, scheme.bucket), 1.0),
                         ops.full((rows, scheme.bucket), 0.0))
        bad = ops.reshape(wide, (-1,))[:n] == 1.0
        out = ops.where(bad, ops.full((n,), float("nan")), out)
    red.took("decode", t0)
    return out
