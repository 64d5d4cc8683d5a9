"""The two payload patterns, written once: ``gather`` (one allgather of every rank's payload)
and ``scatter`` (scatter-reduce by an alltoall of per-chunk payloads, then an allgather of each
owner's reduced chunk, re-quantized by the cheap second-phase scheme).

Both are generators over :mod:`.core`'s requests. ``x`` arrives flat float32 with error
feedback already added (the compressor's ``compensate``); the patterns update the residuals of
what they sent themselves (:meth:`~.core.Reduction.sent` for this rank's gradient, ``<key>``;
``<key>#reduce`` for the scatter owner's reduced chunk, :func:`~hvd_gradq.feedback.keeps_owner_residuals`).

*A gradient this rank cannot encode* (NaN/Inf under ``nonfinite=raise``, a finite value beyond
the scheme's float32 range) still sends, in place of its payload, the poison
(:func:`hvd_gradq.wire.poison.poison`) that says why, so that the collective every rank waits
for goes out and every rank learns of it from the same bytes; this rank raises its own error
once the collective is done, the others the error naming it (:func:`hvd_gradq.reduce.stop.stopped`).
In the scatter pattern such a rank poisons *every* chunk: each rank owns one and must learn of
it in the first phase, since the second is then started by nobody.

*Integrity*: every payload carries its CRC-32; each rank checks what it received
(``Codec.verify``) and the ranks compare their findings (:mod:`.integrity`: in a verdict round,
the last collective, or in the driver's one verdict a step), so that a payload corrupted on its
way to one rank stops every rank with an error that names it. A rank that found one decodes
zeros in its place; a scatter owner that received a corrupted chunk sums zeros in its place and
sends that, well-formed (with a verdict round, the verdict names the corruption before anyone
decodes it; with one a step, the other ranks use that chunk's zeros in this step and raise at
the next).

*Draws*: gather from the stream of ``<name>``, scatter chunk j from ``<name>#j``, the reduced
chunk from ``<name>#reduce`` (:meth:`~.core.Reduction.words`: the tags of the part's own rule,
or :func:`hvd_gradq.reduce.names.words` of rank and step).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..errors import GradqError, NonFiniteError, RankMismatchError
from ..feedback import REDUCED, keeps_owner_residuals, reduced_key
from ..plan.layout import chunk_bounds
from ..plan.second_phase import reduced_scheme
from ..wire.poison import Stop, poison
from ..xp import Array
from .core import Allgather, Alltoall, Part, Phases, Reduction, halt
from .integrity import Phase, guard, judged, round_
from .names import Kind, collective
from .stop import stop_of, stops_of


def gather(red: Reduction, t: Part, x: Array) -> Phases:
    """One allgather of payloads; every rank decodes and sums them in rank order."""
    g = t.group
    t0 = time.perf_counter()
    error: GradqError | None = None
    own: Any = None
    n = int(red.ops.shape(x)[0])
    fuse = red.fuse_below > 0 and n <= red.fuse_below  # (x: flat) a graph's driver leaves 0
    seed = red.words(t)
    fed = None
    try:
        fed = None if t.compensated else red.encode_fed(t, x, ((0, n),), (seed,))
        if fed is None:
            x = x if t.compensated else red.compensate(t.key, x)
            buf, own = t.codec.encode(red.config, x, seed, t.what)
        else:
            buf, own = fed[0], fed[2][0]
    except GradqError as e:  # tell the other ranks, so that they raise too
        error, buf = e, poison(stop_of(e))
    red.took("encode", t0)
    if error is None and red.ef and fed is None:
        red.sent(t, x, t.codec.values(own))
    del x  # read: with error feedback a full-size array of its own, not kept while the gather is out
    gathered = yield Allgather(collective(g.key, Kind.GATHER, t.name), buf, last=not red.verdict_round, fuse=fuse)
    found = t.codec.verify(gathered, g.rank, Phase.GATHER)
    verdict = yield from round_(red, t, red.ops, found)
    gathered = yield from judged(red, t, red.ops, verdict, gathered)
    if error is not None:
        yield from halt(t, error)
    try:
        with red.timed("decode"):
            total, count = t.codec.sum(gathered, g.rank, own, t.name, unless=guard(red, found), out=t.out)
    except GradqError as e:
        if not stops_of(e):  # only a poison received is a stop every member meets alike
            raise
        yield from halt(t, e)
    if count and count != g.size:  # (0: zeros in place of a corrupted buffer)
        raise RankMismatchError(f"{t.name}: gathered {count} payloads from {g.size} ranks")
    if red.stats is not None:
        sent = int(buf.shape[0])
        red.stats.record(t.name, sent * (g.size - 1), int(gathered.shape[0]) - sent)
    return total


def scatter(red: Reduction, t: Part, x: Array) -> Phases:
    """Alltoall of per-chunk payloads; the owner of chunk j sums it, re-quantizes it with
    :func:`~hvd_gradq.plan.second_phase.reduced_scheme` and allgathers it."""
    g = t.group
    bounds = chunk_bounds(int(red.ops.shape(x)[0]), red.config.scheme.bucket, g.size)
    t0 = time.perf_counter()
    error: GradqError | None = None
    owns: list[Any] = []
    seeds = [red.words(t, f"#{j}") for j in range(g.size)]
    fed = None
    try:
        fed = None if t.compensated else red.encode_fed(t, x, bounds, seeds)
        if fed is None:
            x = x if t.compensated else red.compensate(t.key, x)
            buf, lens, owns = t.codec.encode_chunks(red.config, x, bounds, seeds, t.what)
        else:
            buf, lens, owns = fed
    except GradqError as e:
        why = stop_of(e)
        bufs = [poison(why)] * len(bounds)
        buf, lens = np.concatenate(bufs), tuple(int(b.shape[0]) for b in bufs)
        error = e
        if why is Stop.NONFINITE:  # the chunk's count of NaN/Inf would mislead: say it plainly
            error = NonFiniteError(
                f"{t.what}: this rank had non-finite values (NaN/Inf) in this gradient (nonfinite=raise); "
                "the default nonfinite=propagate carries them through as Horovod does")
    red.took("encode", t0)
    if error is None and red.ef and fed is None:
        red.sent(t, x, red.ops.concat([t.codec.values(o) for o in owns], 0))
    mine = owns[g.rank] if owns else None
    del x, owns  # read: only this rank's own chunk waits for the alltoall
    recv = yield Alltoall(collective(g.key, Kind.ALLTOALL, t.name), buf, lens)
    found = t.codec.verify(recv, g.rank, Phase.CHUNKS)  # zeros in its place, named in the verdict
    if error is not None:  # every chunk was a poison: every rank stops here
        yield from halt(t, error)
    try:
        with red.timed("decode"):  # where the chunks were encoded
            part, _count = t.codec.sum(recv, g.rank, mine, t.name, unless=found)
    except GradqError as e:
        if not stops_of(e):  # only a poison received is a stop every member meets alike
            raise
        yield from halt(t, e)
    key, owner = reduced_key(t.key), keeps_owner_residuals(red.ef, second_phase=True)
    if owner:
        part = red.compensate(key, part)
    fine = reduced_scheme(red.config.scheme, g.size)  # cheap, unbiased, no noisier than the first phase
    with red.timed("encode"):
        rbuf, rown = t.codec.encode(fine, part, red.words(t, REDUCED), f"{t.name} (step {t.step}, reduced)")
    if owner:
        red.update(key, part, t.codec.values(rown))
    gathered = yield Allgather(collective(g.key, Kind.REDUCED, t.name), rbuf, last=not red.verdict_round)
    found = red.ops.maximum(found, t.codec.verify(gathered, g.rank, Phase.REDUCED, whole=False))
    verdict = yield from round_(red, t, red.ops, found)
    gathered = yield from judged(red, t, red.ops, verdict, gathered)
    with red.timed("decode"):
        out = t.codec.concat(gathered, g.rank, rown, [hi - lo for lo, hi in bounds], t.what,
                             unless=guard(red, found), out=t.out)
    if red.stats is not None:
        sent = sum(n for j, n in enumerate(lens) if j != g.rank)
        received = int(recv.shape[0]) - lens[g.rank]
        rbytes = int(rbuf.shape[0])
        red.stats.record(t.name, sent + rbytes * (g.size - 1), received + int(gathered.shape[0]) - rbytes)
    return out
