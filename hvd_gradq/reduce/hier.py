"""The hierarchical pattern, written once (what it is and when it wins:
:mod:`hvd_gradq.plan.decide`).

Every collective is an alltoall on the reduction's (global) process set with split sizes that
are zero for every rank outside the group a phase runs in: the host's ranks, or the ranks that
own the same piece on every host. So no process set has to be registered with ``hvd.init``
(Horovod 0.28.1 only adds them at run time with ``HOROVOD_DYNAMIC_PROCESS_SETS``), and a rank's
bytes go only where they are needed. Each phase sends to its own rank too (a local copy), so
what comes back is every member's part in member order, one layout for all. Every phase is
fusable (:class:`~.core.Alltoall`'s ``fuse``): PyTorch's driver sends a round's phases of every
tensor as one alltoall, which keeps a rank that dies mid-step from aborting a survivor.

Phases, for the piece this rank owns (``m`` elements, 1/local of the tensor on bucket bounds):

1. ``h1``: the host's ranks swap pieces, fp32; the owner sums them in local rank order (exact
   and deterministic: no quantization inside a host).
2. ``h2``: the owner adds its residual (``#host`` key, with ``ef``) and sends the host's piece,
   quantized, to its cross peers: whole (cross ``gather``), or cut into one sub-piece a host
   (cross ``scatter``), whose owner sums them, re-quantizes with the second-phase scheme
   (``reduced_scheme(scheme, hosts)``, residual ``#host#reduce``) and sends it back (``h3``).
3. last (``h3``/``h4``): the owner hands the reduced piece, fp32 plus one flag element, to the
   host's ranks; the flag (:func:`hvd_gradq.reduce.stop.stop_flag`) says which rank stopped
   on this gradient and why (NaN/Inf under ``nonfinite=raise``, a value beyond the scheme's
   range: it sent a poison payload, or this owner could not encode its piece), so that every
   rank raises, and none waits for a collective another rank never joined.

Integrity: the fp32 pieces of the first and last phases travel with a CRC-32 each (two float32
elements after a piece: :mod:`hvd_gradq.wire.integrity`), the payloads with theirs; what a rank
finds in any phase goes into the comparison of findings after the last one (:mod:`.integrity`:
a verdict round, or the driver's one verdict a step), where every rank learns of it (a rank that
found a corrupted part goes on with zeros in its place, and sends them on as an owner).

Draws: the ``#host`` tag's stream (sub-piece k: ``#host#k``; the second pass: ``#host#reduce``),
by :meth:`~.core.Reduction.words`; residuals keyed ``<key>#host`` and ``<key>#host#reduce``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..errors import GradqError, NonFiniteError, RangeError
from ..feedback import HOST, REDUCED, host_key, keeps_owner_residuals, reduced_key
from ..plan.hosts import Hosts
from ..plan.layout import chunk_bounds
from ..plan.pattern import Pattern
from ..plan.second_phase import reduced_scheme
from ..spec import Config, SchemeLike
from ..wire.integrity import first_bad_piece, piece_checks
from ..wire.poison import Stop, poison
from ..xp import Array, Ops
from .core import Alltoall, Part, Phases, Reduction, join
from .integrity import Carrier, finding, hier_phase, judged, round_
from .names import Kind, collective
from .stop import flag_stop, peer_message, stop_flag, stop_of, stops_of


@dataclass
class _State:
    """What the phases of one tensor carry: the error that stopped this rank (its own, or one
    naming the peers that stopped) and the flag's facts, and the bytes to and from other hosts."""

    error: GradqError | None = None
    stop: tuple[Stop, int] | None = None
    sent: int = 0
    received: int = 0

    def halt(self, error: GradqError, rank: int) -> None:
        self.error = error
        peers = stops_of(error)
        self.stop = min((why, r) for r, why in peers.items()) if peers else (stop_of(error), rank)


def hierarchical(red: Reduction, t: Part, x: Array, hosts: Hosts, cross: Pattern) -> Phases:
    """The hierarchical reduction of flat float32 ``x``; ``cross`` is the pattern between hosts."""
    ops, h, scheme = red.ops, hosts, red.config.scheme
    st = _State()
    pieces = chunk_bounds(int(ops.shape(x)[0]), scheme.bucket, h.local)
    sizes = [e - s for s, e in pieces]
    got = yield _send(t, 1, _checked(ops, x, sizes), {r: sizes[i] + 2 for i, r in enumerate(h.local_peers())}, h)
    del x  # sent: not kept while the later phases are out
    lo, hi = pieces[h.local_rank]
    m = hi - lo
    got, found = _pieces(ops, got, [m] * h.local, t.group.rank, 1, h)
    total = red.add_rows(got, h.local, m)  # the host's sum of my piece, in local rank order
    key = host_key(t.key)
    owner = keeps_owner_residuals(red.ef, second_phase=True)
    if owner:
        total = red.compensate(key, total)
    first = Config(scheme, red.config.policy)  # the policy's nonfinite=raise applies
    if cross is Pattern.GATHER:
        part = m
        buf, own = _encode(red, t, st, first, total, HOST, h)
        if owner and own is not None:
            red.update(key, total, t.codec.values(own))
        got = yield _to_cross(red, t, 2, [buf] * h.count, h, st)
        found = ops.maximum(found, t.codec.verify(got, t.group.rank, hier_phase(2), h.cross_peers()))
        piece = _sum(red, t, st, got, own, part, h, found)
    else:
        subs = chunk_bounds(m, scheme.bucket, h.count)
        part = subs[h.host][1] - subs[h.host][0]
        parts = [_encode(red, t, st, first, total[s:e], f"{HOST}#{k}", h) for k, (s, e) in enumerate(subs)]
        if owner and all(o is not None for _, o in parts):
            red.update(key, total, ops.concat([t.codec.values(o) for _, o in parts], 0))
        own = parts[h.host][1]
        got = yield _to_cross(red, t, 2, [b for b, _ in parts], h, st)
        found = ops.maximum(found, t.codec.verify(got, t.group.rank, hier_phase(2), h.cross_peers()))
        mine = _sum(red, t, st, got, own, part, h, found)  # my sub-piece's sum, second pass, to every host
        rkey = reduced_key(key)
        if owner and st.error is None:
            mine = red.compensate(rkey, mine)
        buf, rown = _encode(red, t, st, reduced_scheme(scheme, h.count), mine, HOST + REDUCED, h)
        if owner and rown is not None:
            red.update(rkey, mine, t.codec.values(rown))
        got = yield _to_cross(red, t, 3, [buf] * h.count, h, st)
        found = ops.maximum(found, t.codec.verify(got, t.group.rank, hier_phase(3), h.cross_peers(), whole=False))
        piece = _concat(red, t, st, got, rown, [e - s for s, e in subs], h, found)
    flag = ops.full((1,), 0.0 if st.stop is None else stop_flag(*st.stop))
    out = _checked(ops, ops.concat([piece, flag], 0), [m + 1])
    last = 4 if cross is Pattern.SCATTER else 3
    got = yield _send(t, last, ops.concat([out] * h.local, 0), {r: m + 3 for r in h.local_peers()}, h,
                      not red.verdict_round)
    got, more = _pieces(ops, got, [e - s + 1 for s, e in pieces], t.group.rank, last, h)
    verdict = yield from round_(red, t, ops, ops.maximum(found, more))
    res, at, flags = [], 0, []
    for s, e in pieces:
        res.append(got[at:at + e - s])
        flags.append(got[at + e - s:at + e - s + 1])
        at += e - s + 1
    result = yield from judged(red, t, ops, verdict, ops.concat(res, 0))
    stops = [] if red.graph is not None else [flag_stop(float(f[0])) for f in flags]  # a graph's: its host functions'
    if red.stats is not None:
        red.stats.record(t.name, st.sent, st.received)
    if st.error is not None:  # this rank's own (it owned a piece that stopped): the most precise
        raise st.error
    for stop in stops:
        if stop is not None:
            why, who = stop
            cls = {Stop.NONFINITE: NonFiniteError, Stop.RANGE: RangeError}.get(why, GradqError)
            raise cls(f"{t.what}: rank {who} {peer_message(why)}")
    return result


def _send(t: Part, phase: int, buf: Any, sizes: dict[int, int], h: Hosts, last: bool = False) -> Alltoall:
    """``buf`` cut into ``sizes`` ({rank: elements}, in rank order) through the global alltoall,
    fusable with the other tensors' phases of the round (:class:`~.core.Alltoall`)."""
    splits = tuple(sizes.get(r, 0) for r in range(h.nranks))
    return Alltoall(collective(t.group.key, Kind.HIER, t.name, phase), buf, splits, last, fuse=True)


def _checked(ops: Ops, x: Array, sizes: list[int]) -> Array:
    """Flat fp32 ``x`` cut into pieces of ``sizes``, each followed by its CRC-32 (two elements)."""
    checks = ops.host(lambda a: piece_checks(a, sizes), x, (2 * len(sizes),))
    out, at = [], 0
    for i, n in enumerate(sizes):
        out += [x[at:at + n], checks[2 * i:2 * i + 2]]
        at += n
    return ops.concat(out, 0)


def _pieces(ops: Ops, got: Array, sizes: list[int], finder: int, phase: int, h: Hosts) -> tuple[Array, Array]:
    """The pieces of ``got`` (one from each of the host's ranks, of ``sizes``, each with its
    CRC-32), their checks dropped and all zero if one fails, and this rank's finding (float64 (1,))."""
    got = ops.reshape(got, (sum(sizes) + 2 * len(sizes),))  # an alltoall's result: its size known here
    bad = ops.host(lambda a: first_bad_piece(a, sizes), got, (1,))  # [i + 1] for piece i, [0.0]
    first = h.local_peers()[0]  # piece i from rank first + i
    code = ops.f64(ops.f32(bad > 0.0)) * finding(finder, Carrier.PIECE, hier_phase(phase), first - 1) + ops.f64(bad)
    out, at = [], 0
    for n in sizes:
        out.append(got[at:at + n])
        at += n + 2
    flat = ops.concat(out, 0)
    return ops.where(bad == 0.0, flat, ops.zeros(ops.shape(flat), "float32")), code


def _to_cross(red: Reduction, t: Part, phase: int, bufs: list[Any], h: Hosts, st: _State) -> Alltoall:
    """``bufs[k]`` (payload bytes) to the rank on host k that owns the same piece."""
    sizes = {r: int(bufs[k].shape[0]) for k, r in enumerate(h.cross_peers())}
    st.sent += sum(n for k, n in enumerate(sizes.values()) if k != h.host)
    st.received -= sizes[h.rank]  # what comes back from this rank itself is no traffic
    return _send(t, phase, join(red.ops, bufs), sizes, h)


def _encode(red: Reduction, t: Part, st: _State, scheme: SchemeLike, x: Array, tag: str,
            h: Hosts) -> tuple[Any, Any]:
    """Payload and own decoded values; the poison payload (and the error kept) for a piece this
    rank cannot encode (NaN/Inf under ``nonfinite=raise``, a value beyond the scheme's range) or
    after an earlier phase's error, so that the others still get a part and learn why."""
    if st.error is None:
        try:
            t0 = time.perf_counter()
            out = t.codec.encode(scheme, x, red.words(t, tag), t.what)
            red.took("encode", t0)
            return out
        except GradqError as e:
            st.halt(e, h.rank)
    assert st.stop is not None
    return poison(*st.stop), None


def _sum(red: Reduction, t: Part, st: _State, got: Any, own: Any, part: int, h: Hosts, found: Any) -> Array:
    """Decoded sum of the cross peers' payloads (host order; this rank's own not decoded again);
    zeros after an error (the flag of the last phase carries it) or a corrupted payload (``found``:
    the verdict names it)."""
    _received(red, st, got)
    if st.error is None:
        try:
            with red.timed("decode"):
                total, _ = t.codec.sum(got, h.host, own, t.name, h.cross_peers(), unless=found)
            return t.codec.values(total)
        except GradqError as e:
            st.halt(e, h.rank)
    return red.ops.zeros((part,), "float32")


def _concat(red: Reduction, t: Part, st: _State, got: Any, own: Any, sizes: list[int], h: Hosts, found: Any) -> Array:
    """Every host's reduced sub-piece (of ``sizes`` elements), decoded, in host order: this rank's
    piece (zeros as :func:`_sum`'s)."""
    _received(red, st, got)
    if st.error is None:
        try:
            with red.timed("decode"):
                return t.codec.concat(got, h.host, own, sizes, t.what, h.cross_peers(), unless=found)
        except GradqError as e:
            if not stops_of(e):  # not a peer's poison: a payload that cannot be read
                raise
            st.halt(e, h.rank)
    return red.ops.zeros((sum(sizes),), "float32")


def _received(red: Reduction, st: _State, got: Any) -> None:
    """The bytes of a cross phase's result (counted where the driver counts none itself)."""
    if red.stats is not None:
        st.received += int(got.shape[0])
