"""The summable pattern, written once: even-level schemes with a shared per-bucket scale.

Phase 1 Max-allreduces each bucket's statistics (:func:`hvd_gradq.schemes.summable.local_stats`);
phase 2 encodes against the shared table they fix (``encode_shared``) and Sum-allreduces the
codes packed into integer lanes (:func:`hvd_gradq.wire.packing.pack_lanes`, laid out by
:func:`hvd_gradq.plan.layout.lanes_for` so that the sum over the group cannot carry into
the next field). Every step is ``Ops`` arithmetic on the tensor's own device: only the
statistics and the lanes cross. The arithmetic is four pure functions (:func:`_local`,
:func:`_verdict`, :func:`_encode`, :func:`_decode`) that a graph builds once and runs exactly as
written (:meth:`~.core.Reduction.pure`); between them the pattern only yields its collectives.

*Integrity.* The lanes carry the digest of the statistics the rank received and a checksum
linear over their sum (:mod:`hvd_gradq.wire.integrity`: four and eight more int32 lanes), so
every rank checks the summed lanes, and whether the summed digests are the group's size times
its own: where they are not, the ranks received different statistics, every rank whose lanes
arrived intact knows it after the lanes, and every rank stops there (before deciding anything on
statistics that may have been corrupted into a peer's stop signal). Each rank also checks that
the statistics it received are not below those it sent. A rank whose lanes or statistics failed
hands its finding to the comparison of findings (:mod:`.integrity`: the verdict round, the last
collective; or the driver's one verdict a step, where that rank decodes zeros in their place).

*Values it cannot take.* The statistics carry the news, so nobody waits: a rank with NaN/Inf
under ``nonfinite=raise`` sends +inf in every bucket; a rank with a finite value beyond the
scheme's float32 range sends :func:`hvd_gradq.reduce.stop.range_stat` (the max names the
lowest such rank); under ``propagate`` the buckets holding NaN/Inf send +inf and decode as NaN
everywhere. A rank that must stop still sends its lanes (zeros) and waits for them: a rank that
raised later must not leave the others waiting, and one that raised first must not end Horovod
(its exit shuts every rank down) before the slower ranks reached the same error. Whether to stop
is decided from values: eagerly the pattern reads them on the host after the lanes
(:meth:`~.core.Reduction.read`) and raises, after the stop's barrier where every rank stops; in a
graph the same decision is a check on the result (:meth:`~.core.Graph.check`), raised by a host
function on every rank that stops.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..errors import GradqError, NonFiniteError, RangeError
from ..plan.decide import cost
from ..plan.layout import lanes_for
from ..plan.pattern import Pattern
from ..schemes.level import EvenLevelScheme
from ..schemes.options import NonFinite
from ..schemes.summable import decode_codes, encode_shared, local_stats
from ..wire.integrity import checked, digest, digest_lanes, digests_agree, with_check
from ..wire.packing import pack_lanes, unpack_lanes
from ..wire.poison import Stop
from ..xp import Array, Ops, Seed
from .core import Allreduce, Part, Phases, Reduction, halt
from .integrity import Carrier, Phase, error_of, everyone, finding, raise_if, round_
from .names import Kind, collective
from .stop import names_a_rank, peer_message, range_rank, range_stat

_NONFINITE = ("had non-finite values (NaN/Inf) in this gradient (nonfinite=raise); the default "
              "nonfinite=propagate carries them through as Horovod does")


def summable(red: Reduction, t: Part, x: Array, ops: Ops) -> Phases:
    """Shared scale (Max-allreduce of statistics), then integer lanes (Sum-allreduce); ``ops``
    are those of ``x``'s device."""
    scheme = red.config.scheme
    assert isinstance(scheme, EvenLevelScheme)
    g, policy = t.group, red.config.policy
    raise_ = policy.nonfinite is NonFinite.RAISE
    t0 = time.perf_counter()
    n = int(ops.shape(x)[0])
    sent, x, mine = red.pure(_local, scheme, raise_, g.rank)(ops, x)
    seed = red.words(t)
    red.took("encode", t0)  # the statistics
    received = yield Allreduce(collective(g.key, Kind.STATS, t.name), sent, "max")

    t0 = time.perf_counter()
    send, stats, bad_rows, ours = red.pure(_verdict, raise_)(ops, x, received, mine)
    lanes, meta, own, digest_ = red.pure(_encode, scheme, g.size)(ops, send, stats, received, seed)
    red.took("encode", t0)  # codes, lanes (the digest and the checksum) and own values
    summed = yield Allreduce(collective(g.key, Kind.LANES, t.name), lanes, "sum", last=not red.verdict_round)
    t0 = time.perf_counter()
    summed, found = red.pure(_check, g.rank, g.size)(ops, summed, received, sent, digest_)
    red.took("decode", t0)
    verdict = yield from round_(red, t, ops, found)

    read = red.read(ops, ops.concat([mine, ours], 0), found if verdict is None else verdict)
    if read is not None:  # eagerly: stop here, or know whether a bucket was non-finite
        corrupt = error_of(t.what, read[1], g.size)
        # every rank read the same verdict, or (one a step) made the same finding: the stop's barrier
        if corrupt is not None and (verdict is not None or everyone(float(read[1][0]))):
            yield from halt(t, corrupt)
        facts = read[0]
        error = _stop(t, scheme, policy.nonfinite, facts[:3], facts[3:])
        if error is not None:
            if facts[3] == 2.0:  # every rank read these statistics and stops here: the stop's barrier
                yield from halt(t, error)
            raise error
    if red.ef:
        red.sent(t, x, own)
    c = cost(scheme, n, 1, g.size, Pattern.SUMMABLE)
    if red.stats is not None:
        red.stats.record(t.name, c.sent, c.received)
    t0 = time.perf_counter()
    nan = not raise_ and (read is None or read[0][4] > 0.0)  # buckets that were non-finite somewhere
    if read is not None and read[1][0] != 0.0:  # one verdict a step: this rank found corruption
        red.took("decode", t0)
        return ops.zeros((n,), "float32")  # in place of what it could not read (the driver raises)
    out: Array = red.pure(_decode, scheme, g.size, n, nan)(ops, summed, meta, bad_rows)
    if red.graph is not None:  # in a graph: the same decisions, as a check on the result
        def decide(a: Any, b: Any, v: Any) -> None:
            raise_if(error_of(t.what, v, g.size))  # corruption first: it may be why a rank stopped
            _raise(_stop(t, scheme, policy.nonfinite, a, b))

        out = red.graph.check(out, decide, [mine, ours, verdict])
    red.took("decode", t0)
    return out


def _raise(error: GradqError | None) -> None:
    if error is not None:
        raise error


# -- the arithmetic: pure functions of Ops and arrays (a graph builds each once) --------------------


def _row_min(ops: Ops, mask: Array, bucket: int, n: int) -> Array:
    """Each bucket's least element of ``mask`` as float32 (1.0: all set; the padding is set)."""
    rows = -(-n // bucket)
    pad = rows * bucket - n
    m = ops.f32(mask)
    if pad:
        m = ops.concat([m, ops.full((pad,), 1.0)], 0)
    return ops.amin(ops.reshape(m, (rows, bucket)), 1)


def _one(ops: Ops, v: Array) -> Array:
    return ops.reshape(v, (1,))


def _local(scheme: EvenLevelScheme, raise_: bool, rank: int, ops: Ops, x: Array) -> tuple[Array, Array, Array]:
    """Before the statistics cross: (the statistics this rank sends, ``x`` with the values it
    cannot take zeroed, this rank's facts f32[3]: 1.0 if it holds a finite value beyond the range
    and no NaN/Inf (it stops, and every rank with it), 1.0 if it holds NaN/Inf, its largest
    finite magnitude)."""
    n = int(ops.shape(x)[0])
    rows, width = -(-n // scheme.bucket), scheme.meta_width
    inside = ops.abs(x) < scheme.limit  # False for NaN/Inf and for values beyond the scheme's range
    finite = ops.isfinite(x)
    bad = 1.0 - ops.amin(ops.f32(finite), 0)
    beyond = (1.0 - ops.amin(ops.f32(inside), 0)) * (1.0 - bad)
    top = ops.amax(ops.where(finite, ops.abs(x), ops.zeros((n,), "float32")), 0)
    x = ops.where(inside, x, ops.zeros((n,), "float32"))
    stats = local_stats(scheme, ops, x)
    inf = ops.full((rows, width), float("inf"))
    if raise_:  # +inf statistics: every rank sees it in the max and stops
        stats = ops.where(ops.reshape(bad > 0.0, (1, 1)), inf, stats)
    else:  # propagate: +inf statistics for the buckets holding NaN/Inf (or, as in quantize, a
        # value beyond the range beside them), zeros sent in them
        stats = ops.where(ops.reshape(_row_min(ops, inside, scheme.bucket, n) < 1.0, (rows, 1)), inf, stats)
    # finite, too large: every rank stops (quantize raises here)
    stats = ops.where(ops.reshape(beyond > 0.0, (1, 1)), ops.full((rows, width), range_stat(rank)), stats)
    return stats, x, ops.concat([_one(ops, beyond), _one(ops, bad), _one(ops, top)], 0)


def _verdict(raise_: bool, ops: Ops, x: Array, stats: Array, mine: Array) -> tuple[Array, Array, Array, Array]:
    """After the statistics crossed: (what this rank encodes: ``x``, or zeros where it stops; the
    statistics it encodes against, zero in the buckets that were non-finite somewhere; 1.0 for
    those buckets; the group's facts f32[3]: 0.0 go on, 1.0 this rank stops alone, 2.0 every rank
    stops (they read the same statistics); 1.0 if a bucket was non-finite somewhere; the largest
    finite statistic, which names the lowest rank beyond the range
    (:func:`hvd_gradq.reduce.stop.range_rank`) unless another rank's NaN/Inf hid it)."""
    rows = int(ops.shape(stats)[0])
    finite = ops.isfinite(stats)
    row_ok = ops.reshape(ops.amin(ops.f32(finite), 1), (rows,))
    nonfinite = 1.0 - ops.amin(ops.concat([row_ok, ops.full((1,), 1.0)], 0), 0)
    zeros = ops.zeros(ops.shape(stats), "float32")
    top = ops.amax(ops.reshape(ops.concat([ops.where(finite, stats, zeros), ops.zeros((1, ops.shape(stats)[1]),
                                                                                       "float32")], 0), (-1,)), 0)
    every = ops.f32(names_a_rank(top))
    if raise_:
        every = ops.maximum(every, nonfinite)
    stop = ops.maximum(2.0 * every, mine[0])  # a rank beyond the range whose statistic another's NaN hid
    go = ops.reshape(stop == 0.0, (1,))
    n = int(ops.shape(x)[0])
    send = ops.where(go, x, ops.zeros((n,), "float32"))
    stats = ops.where(ops.reshape(row_ok == 1.0, (rows, 1)), stats, zeros)
    stats = ops.where(ops.reshape(go, (1, 1)), stats, zeros)
    return send, stats, 1.0 - row_ok, ops.concat([_one(ops, stop), _one(ops, nonfinite), _one(ops, top)], 0)


def _encode(scheme: EvenLevelScheme, size: int, ops: Ops, x: Array, stats: Array, received: Array,
            seed: Seed) -> tuple[Array, Array, Array, Array]:
    """(lanes of ``x``'s codes against the shared ``stats``, then the digest of the statistics
    this rank ``received`` and their checksum; the shared meta; ``x`` as the others decode it:
    what error feedback subtracts; the digest, float32 (2,))."""
    codes, meta = encode_shared(scheme, ops, x, stats, seed)
    lay = lanes_for(scheme.symbols, size)
    d = ops.host(digest, received, (2,))
    lanes = with_check(ops, ops.concat([ops.i64(pack_lanes(ops, codes, lay.field_bits, lay.fields)),
                                        digest_lanes(ops, d)], 0))
    return lanes, meta, decode_codes(scheme, ops, codes, meta, int(ops.shape(x)[0])), d


def _check(rank: int, size: int, ops: Ops, summed: Array, received: Array, sent: Array,
           d: Array) -> tuple[Array, Array]:
    """After the lanes crossed: (the summed lanes without their digest and check lanes, this
    rank's finding float64 (1,): the summed lanes fail their checksum; else the summed digests
    are not ``size`` times its own ``d`` (the ranks received different statistics: every rank
    finds it); else the statistics it received are below those it sent; else 0.0
    (:func:`hvd_gradq.reduce.integrity.finding`))."""
    lanes, ok = checked(ops, summed)
    lanes, agree = digests_agree(ops, lanes, d, size)
    flat_r, flat_s = ops.reshape(received, (-1,)), ops.reshape(sent, (-1,))
    low = 1.0 - ops.amin(ops.f32(ops.concat([flat_r >= flat_s, ops.full((1,), 1.0) > 0.0], 0)), 0)
    code = (ops.f64(1.0 - ok) * finding(rank, Carrier.LANES, Phase.LANES)
            + ops.f64(ok * (1.0 - agree)) * finding(rank, Carrier.DIFFER, Phase.STATS)
            + ops.f64(ok * agree * low) * finding(rank, Carrier.STATS, Phase.STATS))
    return lanes, code


def _decode(scheme: EvenLevelScheme, size: int, n: int, nan: bool, ops: Ops, summed: Array, meta: Array,
            bad_rows: Array) -> Array:
    """The sum of every rank's decoded codes (``n`` of them); with ``nan``, NaN in the buckets that
    were non-finite somewhere (``bad_rows`` 1.0)."""
    lay = lanes_for(scheme.symbols, size)
    codes = unpack_lanes(ops, ops.i64(summed), lay.field_bits, lay.fields, n)
    out: Array = decode_codes(scheme, ops, codes, meta, n, count=size)
    if nan:
        rows = -(-n // scheme.bucket)
        wide = ops.where(ops.reshape(bad_rows == 1.0, (rows, 1)), ops.full((rows, scheme.bucket), 1.0),
                         ops.full((rows, scheme.bucket), 0.0))
        bad = ops.reshape(wide, (-1,))[:n] == 1.0
        out = ops.where(bad, ops.full((n,), float("nan")), out)
    return out


def _stop(t: Part, scheme: EvenLevelScheme, nonfinite: NonFinite, mine: np.ndarray[Any, Any],
          ours: np.ndarray[Any, Any]) -> GradqError | None:
    """The error this rank raises, from its facts and the group's (:func:`_local`,
    :func:`_verdict`, host values), or None where it goes on."""
    if ours[0] == 0.0:
        return None
    if mine[0] > 0.0:
        return RangeError(
            f"{t.what}: this rank had a finite value of magnitude {float(mine[2]):.7g} in this gradient, beyond what "
            f"{scheme.name} quantizes in float32 (|x| < {scheme.limit:.7g}); scale the gradient down (a smaller "
            "loss scale), or use nonfinite=skip to send such tensors uncompressed")
    if nonfinite is NonFinite.RAISE and ours[1] > 0.0:
        return NonFiniteError(f"{t.what}: {'this rank' if mine[1] > 0.0 else 'another rank'} {_NONFINITE}")
    peer = range_rank(float(ours[2]))
    return RangeError(f"{t.what}: rank {peer} {peer_message(Stop.RANGE)}")
