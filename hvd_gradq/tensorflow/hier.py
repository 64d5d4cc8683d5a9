"""The hierarchical pattern in TensorFlow: the reduction core's
(:func:`hvd_gradq.reduce.hierarchical`: what it is and its phases), driven while Horovod traces
the reduction (:mod:`.reduce`), with PyTorch's bytes and bits.

``compress()`` starts phase 1 (``h1``: this rank's input cut into the host's pieces, to the
host's ranks); ``decompress()`` runs the rest: the owner sums the host's rows in local rank
order (:func:`.codec.host_sum`, the driver's ``adds``: exact, where Grappler would reorder an
inlined chain of adds),
adds its ``#host`` residual (with ``ef``) and sends its piece quantized to its cross peers, whole
(cross ``gather``) or one sub-piece a host (cross ``scatter``, then a second pass with the
``#host#reduce`` residual), and hands the reduced piece back to the host's ranks.

``nonfinite=raise`` and ``fp16:overflow=raise`` are refused with this pattern (its later phases
start in ``decompress()``), so no rank stops on a value while encoding; a payload that cannot be
read stops every rank in its host decoder, and the stop flags of the last phase are not read
(:class:`hvd_gradq.reduce.core.Reduction`'s ``traced``).

Draws: the ``#host`` tag's stream (sub-piece k: ``#host#k``; the finer pass: ``#host#reduce``),
as PyTorch's keys. Residuals (:mod:`.state`): as wide as the widest piece (sub-piece) on any
rank, this rank's zero-padded (:class:`.state.SlotStore`), like the scatter pattern's, so a
checkpoint restores anywhere.
"""
from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import horovod.tensorflow.mpi_ops as mpi_ops
import tensorflow as tf

from .. import reduce as core
from ..feedback import Memory, host_key, reduced_key
from ..plan.decide import hier_cross
from ..plan.hosts import Hosts, ranks_per_host
from ..plan.layout import chunk_bounds
from ..plan.pattern import Pattern
from ..reduce.names import Streams
from ..schemes.scheme import Scheme
from . import reduce
from .collectives import Ctx
from .ops import TF
from .state import make_residual
from .transport import GraphCodec


def widths(n: int, bucket: int, hosts: Hosts) -> tuple[int, int]:
    """(the widest piece, the widest sub-piece): the widths of the two residuals."""
    pieces = [hi - lo for lo, hi in chunk_bounds(n, bucket, hosts.local)]
    subs = [hi - lo for m in pieces for lo, hi in chunk_bounds(m, bucket, hosts.count)]
    return max(pieces), max(subs)


def ranks_per_host_of(ps: Any) -> int:
    """Ranks a host for the cost model and this pattern (:mod:`hvd_gradq.plan.hosts`), asked of
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


def hier_start(scheme: Scheme, x: Any, ctx: Ctx, local: int, link_gbps: float, streams: Streams, step: Any,
               scope: str, tag: str) -> None:
    """Phase 1: this rank's pieces to the host's ranks (the core's pattern up to ``h1``)."""
    hosts = Hosts(ctx.size, local, hvd.rank())
    cross = hier_cross(scheme, ctx.n, ctx.size, local, link_gbps)
    ef = ctx.slot is not None and ctx.slot.residual is not None

    def pattern(red: core.Reduction, t: core.Part, x: Any) -> core.Phases:
        return core.hierarchical(red, t, x, hosts, cross)

    part = core.Part(tag, step, core.Group(ctx.rank, ctx.size, scope, local), GraphCodec(ctx.size, ctx.what, ef),
                     ctx.slot.key if ctx.slot is not None else "", lambda t: streams.words(TF, step, t), ctx.what)
    ctx.flow = reduce.begin(pattern, scheme, ef, x, part, hvd.global_process_set)


def hier_finish(scheme: Scheme, ctx: Ctx, memory: Memory | None) -> Any:
    """The sum over every rank, f32[n]: the owner's phases, then the pieces from the host's ranks."""
    assert isinstance(ctx.flow, reduce.Flow)
    return tf.ensure_shape(ctx.flow.finish(memory), (ctx.n,))
