"""The hierarchical pattern in graph ops: PyTorch's (:mod:`hvd_gradq.torch.hier`), the same
phases and bytes, with the host work in :mod:`.host`'s ``numpy_function`` s.

Every collective is ``hvd.alltoall`` on the global process set with zero split sizes for the
ranks outside a phase's group (the host's ranks, or the ranks that own the same piece on every
host), each sending to itself too, so what comes back is every member's part in member order:

1. ``h1`` (in ``compress``): this rank's input cut into the host's pieces
   (``chunk_bounds(n, bucket, local)``), each with one more float, this rank's "my input held
   NaN/Inf" flag (``nonfinite=raise``), to the host's ranks.
2. ``h2`` (in ``decompress``): the owner sums the host's rows in local rank order, adds its
   ``#host`` residual (with ``ef``), and sends its piece quantized to its cross peers, whole
   (cross ``gather``) or one sub-piece a host (cross ``scatter``; then ``h3``: each owner sums
   its sub-piece over the hosts, adds its ``#host#reduce`` residual, re-encodes it with
   ``reduced_scheme(scheme, hosts)`` and sends it to every host). A raised flag on the host makes
   the owner send the poison (:mod:`hvd_gradq.wire.poison`) instead, so every owner on every host fails at its next
   decode with the same message, and no rank waits for one that failed.
3. last: the reduced piece to the host's ranks; concatenated in local rank order, what comes
   back is the whole tensor's sum.

Draws: the ``#host`` tag's stream (sub-piece k: ``#host#k``; the finer pass: ``#host#reduce``),
as PyTorch's keys. Residuals (:mod:`.state`): as wide as the widest piece (sub-piece) on any
rank, this rank's zero-padded, like the scatter pattern's, so a checkpoint restores anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import horovod.tensorflow as hvd
import horovod.tensorflow.mpi_ops as mpi_ops
import tensorflow as tf

from ..feedback import Memory, host_key, reduced_key
from ..frontend import names
from ..frontend.hosts import Hosts, ranks_per_host
from ..frontend.names import Kind, Streams
from ..frontend.patterns import Pattern, chunk_bounds, hier_cross, reduced_scheme
from ..schemes.scheme import Scheme
from ..wire.payload import header_size
from ..wire.poison import poisons
from . import codec, host
from .collectives import Ctx
from .ops import TF
from .state import make_residual


@dataclass
class Hier:
    """What ``decompress()`` needs from ``compress()`` (``Ctx.scatter`` of a hierarchical tensor)."""

    hosts: Hosts
    cross: Pattern
    pieces: list[tuple[int, int]]
    streams: Streams
    step: Any
    scope: str  # collective names (:func:`hvd_gradq.frontend.names.collective`): the compressor's
    tag: str  # ... and the slot's part

    def collective(self, phase: int) -> str:
        return names.collective(self.scope, Kind.HIER, self.tag, phase)


def widths(n: int, bucket: int, hosts: Hosts) -> tuple[int, int]:
    """(the widest piece, the widest sub-piece): the widths of the two residuals."""
    pieces = [hi - lo for lo, hi in chunk_bounds(n, bucket, hosts.local)]
    subs = [hi - lo for m in pieces for lo, hi in chunk_bounds(m, bucket, hosts.count)]
    return max(pieces), max(subs)


def ranks_per_host_of(ps: Any) -> int:
    """Ranks a host for the cost model and this pattern (:mod:`hvd_gradq.frontend.hosts`), asked of
    Horovod; 1 for any process set but the global one."""
    if ps.process_set_id != hvd.global_process_set.process_set_id:
        return 1
    return ranks_per_host(hvd.size(), hvd.rank(), hvd.local_size(), hvd.local_rank(), hvd.cross_rank(),
                          bool(mpi_ops._basics.is_homogeneous()))


def residuals(scheme: Scheme, key: str, n: int, size: int, local: int, link_gbps: float) -> list[tuple[str, Any, Any]]:
    """(key, residual, owner) of the ``tf.Variable`` s a hierarchical slot keeps with ``ef``."""
    hosts = Hosts(size, local, hvd.rank())
    piece, sub = widths(n, scheme.bucket, hosts)
    cross = hier_cross(scheme, n, size, local, link_gbps)
    out = [(host_key(key), *make_residual(host_key(key), piece, hosts.rank))]
    if cross is Pattern.SCATTER:
        rk = reduced_key(host_key(key))
        out.append((rk, *make_residual(rk, sub, hosts.rank)))
    return out



def _send(t: Any, peers: list[int], sizes: list[int], nranks: int, name: str) -> Any:
    """``t`` cut into ``sizes`` for ``peers`` (in order) through the global alltoall."""
    splits = [0] * nranks
    for r, k in zip(peers, sizes):
        splits[r] = k
    out, _ = hvd.alltoall(t, splits=tf.constant(splits, tf.int32), name=name, ignore_name_scope=True)
    return out


def hier_start(scheme: Scheme, x: Any, ctx: Ctx, local: int, link_gbps: float, streams: Streams, step: Any,
               scope: str, tag: str) -> None:
    """Phase 1: this rank's pieces and its NaN flag to the host's ranks (into ``ctx.result``)."""
    hosts = Hosts(ctx.size, local, hvd.rank())
    cross = hier_cross(scheme, ctx.n, ctx.size, local, link_gbps)
    pieces = chunk_bounds(ctx.n, scheme.bucket, hosts.local)
    flag = tf.zeros((1,), tf.float32) if ctx.finite is None else 1.0 - tf.cast(tf.reshape(ctx.finite, (1,)),
                                                                               tf.float32)
    send = tf.concat([part for lo, hi in pieces for part in (x[lo:hi], flag)], 0)
    hi_ = Hier(hosts, cross, pieces, streams, step, scope, tag)
    ctx.result = _send(send, hosts.local_peers(), [hi - lo + 1 for lo, hi in pieces], hosts.nranks, hi_.collective(1))
    ctx.scatter = hi_


def hier_finish(scheme: Scheme, ctx: Ctx, memory: Memory | None) -> Any:
    """The sum over every rank, f32[n]: the owner's phases, then the pieces from the host's ranks."""
    hi_ = ctx.scatter
    assert isinstance(hi_, Hier) and (memory is None or ctx.slot is not None)
    h, key = hi_.hosts, ctx.slot.key if ctx.slot is not None else ""
    lo, hi = hi_.pieces[h.local_rank]
    m = hi - lo
    total, flagged = codec.host_sum(h.local, m)(tf.reshape(ctx.result, (h.local, m + 1)))  # local rank order
    bad = None
    if ctx.finite is not None:  # nonfinite=raise: a flag from any rank of the host poisons my payloads
        bad = flagged
        total = tf.where(bad, tf.zeros_like(total), total)
    piece_w, sub_w = widths(ctx.n, scheme.bucket, h)
    hk = host_key(key)
    if memory is not None:
        sent = memory.compensate(hk, tf.pad(total, [[0, piece_w - m]]))
        total = sent[:m]

    def poisoned(buf: Any, rows: list[int]) -> Any:
        """``buf`` (payloads of ``rows`` bytes one after the other), or poisons in their places."""
        if bad is None:
            return buf
        return tf.where(bad, tf.constant(poisons(rows)), buf)

    if hi_.cross is Pattern.GATHER:
        a, b = hi_.streams.words(TF, hi_.step, "#host")
        size = header_size(scheme.spec, 1) + scheme.nbytes(m)
        buf = poisoned(host.payload_encoder(scheme, (m,), "float32", m)(total, a, b), [size])
        got = _send(tf.tile(buf, [h.count]), h.cross_peers(), [size] * h.count, h.nranks, hi_.collective(2))
        piece, own = host.gathered_decoder(m, h.count, h.host, ctx.what, tuple(h.cross_peers()))(
            tf.reshape(got, (h.count, size)))
        if memory is not None:
            memory.update(hk, sent, tf.pad(own, [[0, piece_w - m]]))
    else:
        subs = chunk_bounds(m, scheme.bucket, h.count)
        words = [hi_.streams.words(TF, hi_.step, f"#host#{k}") for k in range(h.count)]
        a, b = tf.stack([w[0] for w in words]), tf.stack([w[1] for w in words])
        buf, mine = host.chunk_encoder(scheme, tuple(subs), memory is not None)(total, a, b)
        sizes = [header_size(scheme.spec, 1) + scheme.nbytes(e - s) for s, e in subs]
        buf = poisoned(buf, sizes)
        got = _send(buf, h.cross_peers(), sizes, h.nranks, hi_.collective(2))
        s0, s1 = subs[h.host]
        k = s1 - s0
        part, _ = host.gathered_decoder(k, h.count, h.host, ctx.what, tuple(h.cross_peers()))(
            tf.reshape(got, (h.count, sizes[h.host])))
        if memory is not None:
            memory.update(hk, sent, tf.pad(mine, [[0, piece_w - m]]))
            rk = reduced_key(hk)
            psent = memory.compensate(rk, tf.pad(part, [[0, sub_w - k]]))
            part = psent[:k]
        fine = reduced_scheme(scheme, h.count)
        a, b = hi_.streams.words(TF, hi_.step, "#host#reduce")
        rbuf = host.payload_encoder(fine, (k,), "float32", k)(part, a, b)
        rsize = header_size(fine.spec, 1) + fine.nbytes(k)
        got = _send(tf.tile(rbuf, [h.count]), h.cross_peers(), [rsize] * h.count, h.nranks, hi_.collective(3))
        piece, rmine = host.chunks_decoder(tuple(e - s for s, e in subs), h.host)(got)
        if memory is not None:
            memory.update(reduced_key(hk), psent, tf.pad(rmine, [[0, sub_w - k]]))
    out = _send(tf.tile(piece, [h.local]), h.local_peers(), [m] * h.local, h.nranks, hi_.collective(4))
    return tf.ensure_shape(out, (ctx.n,))
