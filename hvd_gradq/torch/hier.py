"""The hierarchical pattern in the PyTorch frontend (what it is and when it wins:
:mod:`hvd_gradq.frontend.patterns`).

Every collective is Horovod's ``alltoall`` on the reduction's (global) process set with split
sizes that are zero for every rank outside the group a phase runs in: the host's ranks, or the
ranks that own the same piece on every host. So no process set has to be registered with
``hvd.init`` (Horovod 0.28.1 only adds them at run time with ``HOROVOD_DYNAMIC_PROCESS_SETS``),
and a rank's bytes go only where they are needed. Each phase sends to its own rank too (a
local copy), so what comes back is every member's part in member order, one layout for all.

Phases, for the piece this rank owns (``m`` elements, 1/local of the tensor on bucket bounds):

1. ``h1`` (in ``compress``): the host's ranks swap pieces, fp32; the owner sums them in local
   rank order (exact and deterministic: no quantization inside a host).
2. ``h2``: the owner adds its residual (``#host`` key, with ``ef``) and sends the host's piece,
   quantized, to its cross peers: whole (cross ``gather``), or cut into one sub-piece a host
   (cross ``scatter``), whose owner sums them, re-quantizes with the finer scheme
   (``reduced_scheme(scheme, hosts)``, residual ``#host#reduce``) and sends it back (``h3``).
3. last (``h3``/``h4``): the owner hands the reduced piece, fp32 plus one flag element, to the
   host's ranks; the flag (:func:`hvd_gradq.frontend.codec.stop_flag`) says which rank stopped
   on this gradient and why (NaN/Inf under ``nonfinite=raise``, a value beyond the scheme's
   range: it sent a poison payload, or this owner could not encode its piece), so that every
   rank raises, and none waits for a collective another rank never joined.

The owner's work between phases runs in :meth:`Hierarchy.advance`, called by
:meth:`hvd_gradq.torch.reduce.Reducer.flush` for every pending tensor before any waits for the
next phase (the same order-free rule as the other patterns' second phases).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import horovod.torch as hvd
import numpy as np
import torch

from ..api import dequantize, split
from ..errors import GradqError, NonFiniteError, RangeError
from ..feedback import Memory, host_key, keeps_owner_residuals, reduced_key
from ..frontend import codec, names
from ..frontend.hosts import Hosts
from ..frontend.names import Kind
from ..frontend.patterns import Pattern, chunk_bounds, reduced_scheme
from ..frontend.stats import Stats
from ..policy import Policy
from ..schemes.scheme import Scheme
from ..spec import Config, SchemeLike
from .context import Ctx
from .jobs import sync


@dataclass
class HierCtx(Ctx):
    pattern: ClassVar[Pattern] = Pattern.HIERARCHICAL
    hosts: Hosts | None = None
    cross: Pattern = Pattern.GATHER
    pieces: list[tuple[int, int]] | None = None  # each local rank's piece of the tensor
    part: int = 0  # elements of this rank's part in the cross phase in flight
    self_bytes: int = 0  # what this rank sent itself in the cross phase in flight
    stage: int = 0  # the phase whose collective is in flight
    handle: Any = None
    own: Any = None  # this rank's decoded part of the cross phase in flight (NumPy)
    error: GradqError | None = None
    stop: tuple[codec.Stop, int] | None = None  # with ``error``: why and which rank stopped (the flag)
    sent: int = 0  # bytes sent to other hosts
    received: int = 0


@dataclass
class Hierarchy:
    scheme: Scheme
    policy: Policy
    seed: int
    memory: Memory
    stats: Stats

    @property
    def owner(self) -> bool:
        """Whether this rank keeps its piece's residuals (``#host``, ``#host#reduce``)."""
        return keeps_owner_residuals(self.policy.ef, second_phase=True)

    def start(self, ctx: HierCtx, x: torch.Tensor) -> None:
        """Phase 1: this rank's tensor, cut into the host's pieces, to the host's ranks."""
        h = ctx.hosts
        assert h is not None
        ctx.pieces = chunk_bounds(x.numel(), self.scheme.bucket, h.local)
        splits = [0] * h.nranks
        for i, r in enumerate(h.local_peers()):
            splits[r] = ctx.pieces[i][1] - ctx.pieces[i][0]
        self._send(ctx, x.detach().cpu().contiguous(), splits, 1)

    def advance(self, ctx: HierCtx) -> bool:
        """Wait for the phase in flight and start the next; False once the last is out."""
        h = ctx.hosts
        assert h is not None and ctx.pieces is not None
        got, _ = sync(ctx.handle, self.stats.clock)
        key = host_key(ctx.name)
        if ctx.stage == 1:  # the host's sum of my piece, then quantized to the cross peers
            m = ctx.pieces[h.local_rank][1] - ctx.pieces[h.local_rank][0]
            total = got[:m].clone()
            for i in range(1, h.local):
                total += got[i * m:(i + 1) * m]
            if self.owner:
                total = self.memory.compensate(key, total)
            if ctx.cross is Pattern.GATHER:
                ctx.part = m
                buf, own = self._encode(ctx, Config(self.scheme, self.policy), total, key)
                self._to_cross(ctx, [buf] * h.count, 2)
            else:
                subs = chunk_bounds(m, self.scheme.bucket, h.count)
                ctx.part = subs[h.host][1] - subs[h.host][0]
                first = Config(self.scheme, self.policy)  # the policy's nonfinite=raise applies
                parts = [self._encode(ctx, first, total[lo:hi], f"{key}#{k}") for k, (lo, hi) in enumerate(subs)]
                own = np.concatenate([o for _, o in parts]) if all(o is not None for _, o in parts) else None
                ctx.own = parts[h.host][1]
                self._to_cross(ctx, [b for b, _ in parts], 2)
            if self.owner and own is not None:
                self.memory.update(key, total, torch.from_numpy(own))
            if ctx.cross is Pattern.GATHER:
                ctx.own = own
            return True
        if ctx.stage == 2 and ctx.cross is Pattern.SCATTER:  # my sub-piece's sum, finer, to every host
            part = self._sum(ctx, got)
            rkey = reduced_key(key)
            if self.owner and ctx.error is None:
                part = self.memory.compensate(rkey, part)
            buf, own = self._encode(ctx, reduced_scheme(self.scheme, h.count), part, rkey)
            if self.owner and own is not None:
                self.memory.update(rkey, part, torch.from_numpy(own))
            ctx.own = own
            self._to_cross(ctx, [buf] * h.count, 3)
            return True
        if ctx.cross is Pattern.GATHER:  # the piece's sum over every rank
            piece = self._sum(ctx, got)
        else:  # every host's reduced sub-piece, decoded, in host order
            piece = self._concat(ctx, got)
        flag = torch.tensor([0.0 if ctx.stop is None else codec.stop_flag(*ctx.stop)])
        out = torch.cat([piece, flag])
        splits = [0] * h.nranks
        for r in h.local_peers():
            splits[r] = out.numel()
        self._send(ctx, out.repeat(h.local), splits, ctx.stage + 1)
        return False

    def finish(self, ctx: HierCtx) -> torch.Tensor:
        """The last phase's pieces, one from each of the host's ranks: the reduced tensor."""
        h = ctx.hosts
        assert h is not None and ctx.pieces is not None
        got, _ = sync(ctx.handle, self.stats.clock)
        out, at = [], 0
        stops = []
        for lo, hi in ctx.pieces:
            out.append(got[at:at + hi - lo])
            stops.append(codec.flag_stop(float(got[at + hi - lo])))
            at += hi - lo + 1
        self.stats.record(ctx.name, ctx.sent, ctx.received)
        if ctx.error is not None:  # this rank's own (it owned a piece that stopped): the most precise
            raise ctx.error
        for stop in stops:
            if stop is not None:
                why, who = stop
                cls = {codec.Stop.NONFINITE: NonFiniteError, codec.Stop.RANGE: RangeError}.get(why, GradqError)
                raise cls(f"{ctx.name} (step {ctx.step}): rank {who} {codec.peer_message(why)}")
        return torch.cat(out)

    # -- helpers -------------------------------------------------------------------------------------
    def _send(self, ctx: HierCtx, t: torch.Tensor, splits: list[int], stage: int) -> None:
        ctx.stage = stage
        ctx.handle = hvd.alltoall_async(t, splits=torch.tensor(splits, dtype=torch.int32),
                                        name=names.collective(ctx.group.key, Kind.HIER, ctx.name, stage),
                                        process_set=ctx.group.process_set)

    def _to_cross(self, ctx: HierCtx, bufs: list[Any], stage: int) -> None:
        """``bufs[k]`` (payload bytes) to the rank on host k that owns the same piece."""
        h = ctx.hosts
        assert h is not None
        splits = [0] * h.nranks
        for k, r in enumerate(h.cross_peers()):
            splits[r] = int(bufs[k].shape[0])
            if k != h.host:
                ctx.sent += splits[r]
        ctx.self_bytes = splits[h.rank]
        self._send(ctx, torch.from_numpy(np.concatenate(bufs)), splits, stage)

    def _encode(self, ctx: HierCtx, scheme: SchemeLike, x: torch.Tensor, key: str) -> tuple[Any, Any]:
        """Payload and own decoded values; the poison payload (and the error kept) for a piece
        this rank cannot encode (NaN/Inf under ``nonfinite=raise``, a value beyond the scheme's
        range) or after an earlier phase's error, so the others still get a part and learn why."""
        if ctx.error is None:
            try:
                seed = names.words(self.seed, hvd.rank(), key, ctx.step)
                with self.stats.clock.timed("encode"):
                    return codec.encode(scheme, x.numpy(), seed, f"{ctx.name} (step {ctx.step})")
            except GradqError as e:
                self._stop(ctx, e)
        assert ctx.stop is not None
        return codec.poison(*ctx.stop), None

    @staticmethod
    def _stop(ctx: HierCtx, error: GradqError) -> None:
        """Keep ``error`` (this rank's, or one naming the peers that stopped) and the flag's facts."""
        assert ctx.hosts is not None
        ctx.error = error
        peers = codec.stops_of(error)
        ctx.stop = min((why, r) for r, why in peers.items()) if peers else (codec.stop_of(error), ctx.hosts.rank)

    def _sum(self, ctx: HierCtx, got: torch.Tensor) -> torch.Tensor:
        """Decoded sum of the cross peers' payloads (host order; this rank's own not decoded again);
        zeros after an error (the flag of the last phase carries it)."""
        h = ctx.hosts
        assert h is not None
        ctx.received += int(got.numel()) - ctx.self_bytes
        if ctx.error is None:
            try:
                with self.stats.clock.timed("decode"):
                    total, _ = codec.decode_sum(got.numpy(), h.host, ctx.own, ctx.name, h.cross_peers())
                return torch.from_numpy(total)
            except GradqError as e:
                self._stop(ctx, e)
        return torch.zeros(ctx.part)

    def _concat(self, ctx: HierCtx, got: torch.Tensor) -> torch.Tensor:
        """Every host's reduced sub-piece, decoded, in host order: this rank's piece."""
        h = ctx.hosts
        assert h is not None
        ctx.received += int(got.numel()) - ctx.self_bytes
        peers = codec.stops_in(got.numpy(), h.cross_peers())
        if ctx.error is None and peers:
            self._stop(ctx, codec.stopped(f"{ctx.name} (step {ctx.step})", peers))
        if ctx.error is not None:
            return torch.zeros(self._own_len(ctx))
        payloads = split(got.numpy())
        with self.stats.clock.timed("decode"):
            return torch.from_numpy(np.concatenate([
                ctx.own if k == h.host and ctx.own is not None else dequantize(p).astype(np.float32).reshape(-1)
                for k, p in enumerate(payloads)]))

    @staticmethod
    def _own_len(ctx: HierCtx) -> int:
        h = ctx.hosts
        assert h is not None and ctx.pieces is not None
        lo, hi = ctx.pieces[h.local_rank]
        return hi - lo
