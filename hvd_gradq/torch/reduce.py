"""The PyTorch frontend's three reduction patterns, each a typed context and its phases.

Every compressed tensor takes one pattern (chosen by :func:`hvd_gradq.frontend.patterns.decide`)
and carries one small context from ``compress()`` to ``decompress()``:

* **gather** (:class:`GatherCtx`): one allgather of payloads; each rank decodes and sums them in
  rank order (:func:`hvd_gradq.frontend.codec.decode_sum`). One phase.
* **summable** (:class:`SummableCtx`): even-level schemes with a shared per-bucket scale. Phase 1
  Max-allreduces each bucket's statistics; phase 2 encodes against the shared scale and
  Sum-allreduces the codes packed into int32 lanes (:func:`hvd_gradq.wire.packing.pack_lanes`).
* **scatter** (:class:`ScatterCtx`): phase 1 alltoalls per-chunk payloads, each rank decodes and
  sums its own chunk; phase 2 re-compresses that partial sum with the second-phase scheme
  (:func:`hvd_gradq.frontend.patterns.reduced_scheme`; its own residual, ``<name>#reduce``) and
  allgathers it.

:class:`Reducer` runs them. It only ever *starts* collectives in :meth:`Reducer.start`: the
gather and scatter first phases are jobs (:mod:`.jobs`: encode, then start the collective) that
run on the compressor's worker threads or inline (:mod:`hvd_gradq.frontend.workers`), settled on
the training thread in the order the tensors came; second phases wait in
:attr:`Reducer.pending` until :meth:`Reducer.flush` (see
:mod:`hvd_gradq.torch.compressor` for why no collective may block inside ``compress()``). Error
feedback is :class:`hvd_gradq.feedback.Memory`'s: the patterns call ``compensate`` and
``update`` and own no residual themselves. Encoding and decoding run on the host through
:mod:`hvd_gradq.frontend.codec` (the compiled kernels and ``wire/``), so every rank's bytes are
the reference's.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar

import horovod.torch as hvd
import torch

from ..api import split
from ..errors import GradqError, NonFiniteError, RangeError, RankMismatchError
from ..feedback import Memory, keeps_owner_residuals, reduced_key
from ..frontend import codec
from ..frontend.names import Kind, collective, words
from ..frontend.patterns import Lanes, Pattern, chunk_bounds, cost, lanes_for, reduced_scheme
from ..frontend.stats import Stats
from ..frontend.workers import Workers
from ..policy import Policy
from ..schemes.level import EvenLevelScheme
from ..schemes.options import NonFinite
from ..schemes.scheme import Scheme
from ..schemes.summable import decode_codes, encode_shared, local_stats
from ..spec import Config
from ..wire.packing import pack_lanes, unpack_lanes
from ..xp import Seed
from . import device
from .context import Ctx
from .hier import Hierarchy, HierCtx
from .jobs import Encoded, gather_job, scatter_job, sync
from .ops import TorchOps

_CPU = TorchOps("cpu")


@dataclass
class GatherCtx(Ctx):
    pattern: ClassVar[Pattern] = Pattern.GATHER
    job: Future[Encoded] | None = None  # the encode job, until settled
    x: Any = None  # the compressed input, until settled (error feedback's update needs it)
    handle: Any = None
    own: Any = None  # this rank's decoded payload (NumPy), so it is not decoded twice
    sent: int = 0
    decoded: Future[tuple[torch.Tensor, int, int]] | None = None  # a decode job (threads > 0)


@dataclass
class SummableCtx(Ctx):
    pattern: ClassVar[Pattern] = Pattern.SUMMABLE
    x: Any = None  # the compressed input (gradient + residual), float32, where it is encoded
    ops: Any = None  # TorchOps of that device (:mod:`.device`: only statistics and lanes cross)
    seed: Seed = 0
    stats_handle: Any = None  # phase 1: Max-allreduce of per-bucket statistics
    local_bad: bool = False  # nonfinite=raise and this rank held NaN/Inf
    local_error: GradqError | None = None  # a finite value beyond the scheme's range on this rank
    lanes: Lanes | None = None
    meta: Any = None
    bad_rows: Any = None  # buckets some rank held NaN/Inf in (propagate): decoded as NaN
    handle: Any = None  # phase 2: Sum-allreduce of int32 lanes


@dataclass
class ScatterCtx(Ctx):
    pattern: ClassVar[Pattern] = Pattern.SCATTER
    job: Future[Encoded] | None = None
    x: Any = None
    bounds: list[tuple[int, int]] | None = None
    handle: Any = None  # phase 1: alltoall of per-chunk payloads
    own: Any = None  # this rank's own chunk, decoded
    own_bytes: int = 0
    sent: int = 0
    received: int = 0
    reduced_own: Any = None  # phase 2: this rank's reduced chunk, decoded
    reduced_bytes: int = 0
    gather_handle: Any = None  # phase 2: allgather of the reduced chunks


@dataclass
class Reducer:
    """Runs the patterns for one compressor: its scheme and seed, its error-feedback memory and
    byte counters, and the contexts whose second phase is not launched yet."""

    scheme: Scheme
    policy: Policy
    seed: int
    memory: Memory
    stats: Stats
    workers: Workers = field(default_factory=lambda: Workers(0))
    codec: str = "auto"  # where gather encodes and decodes: :mod:`.device`
    pending: list[SummableCtx | ScatterCtx] = field(default_factory=list)
    encoding: list[GatherCtx | ScatterCtx] = field(default_factory=list)  # first-phase jobs not settled
    gathered: list[GatherCtx] = field(default_factory=list)  # settled, decode not submitted yet
    staged: list[HierCtx] = field(default_factory=list)  # hierarchical tensors whose last phase is not out

    def __post_init__(self) -> None:  # first phases encode with the policy: its nonfinite=raise applies
        self.hier, self.config = Hierarchy(self.scheme, self.policy, self.seed, self.memory, self.stats), Config(
            self.scheme, self.policy)

    def start(self, ctx: Ctx, x: torch.Tensor) -> Ctx:
        """Start ``ctx``'s first phase on ``x`` (float32, flat, error feedback already added)."""
        if isinstance(ctx, GatherCtx):
            return self._gather_start(ctx, x)
        if isinstance(ctx, SummableCtx):
            return self._summable_start(ctx, x)
        if isinstance(ctx, HierCtx):
            self.hier.start(ctx, x)
            self.staged.append(ctx)
            return ctx
        assert isinstance(ctx, ScatterCtx)
        return self._scatter_start(ctx, x)

    def finish(self, ctx: Ctx) -> torch.Tensor:
        """Wait for ``ctx``'s collectives and return the decoded sum over the group (float32, flat)."""
        self.flush()
        if isinstance(ctx, GatherCtx):
            return self._gather_finish(ctx)
        if isinstance(ctx, SummableCtx):
            return self._summable_finish(ctx)
        if isinstance(ctx, HierCtx):
            return self.hier.finish(ctx)
        assert isinstance(ctx, ScatterCtx)
        return self._scatter_finish(ctx)

    def flush(self) -> None:
        """Settle every first-phase job, launch the second phase of every pending tensor and, with
        workers, queue the gathered tensors' decoding: called at the first ``decompress()`` of a
        step, when every ``compress()`` of that step has run on this rank."""
        encoding, self.encoding = self.encoding, []
        error: GradqError | None = None
        for ectx in encoding:
            try:
                self._settle(ectx)
            except GradqError as e:  # settle the others first: their collectives are out already
                error = error or e
        pending, self.pending = self.pending, []
        for ctx in pending:
            try:
                if isinstance(ctx, SummableCtx):
                    self._summable_phase2(ctx)
                else:
                    self._scatter_phase2(ctx)
            except GradqError as e:  # launch the others first: no rank waits for this one
                error = error or e
        staged, self.staged = self.staged, []
        while staged:  # one phase of every tensor is out before any waits for the next
            staged = [c for c in staged if self.hier.advance(c)]
        gathered, self.gathered = self.gathered, []
        if self.workers.threads:
            for gctx in gathered:
                gctx.decoded = self.workers.submit(lambda c=gctx: self._gather_decode(c))  # type: ignore[misc]
        if error is not None:
            raise error

    def _submit(self, ctx: GatherCtx | ScatterCtx, job: Any) -> None:
        """Run a first-phase job (on a worker when there are workers); settle it now if it is done
        (always, inline), so that inline runs raise an unexpected exception where they always did,
        in ``compress()``. A job that sent a poison in place of its payload is settled at the
        first ``decompress()``, as with workers: raising inside ``compress()`` would stop this
        rank's backward before it hands Horovod its later tensors, which the others wait for."""
        ctx.job = self.workers.submit(job)
        if ctx.job.done() and (ctx.job.exception() is not None or ctx.job.result().error is None):
            self._settle(ctx)
        else:
            self.encoding.append(ctx)

    def _settle(self, ctx: GatherCtx | ScatterCtx) -> None:
        """Take a first-phase job's result: error feedback's update, the byte counts, the second
        phase queued; or, for a gradient this rank could not encode (NaN/Inf under nonfinite=raise,
        a value beyond the scheme's range), wait until the poison payload has gone out, so that
        the other ranks raise too, then raise."""
        assert ctx.job is not None
        enc = ctx.job.result()  # a job's unexpected exception is raised here
        self.stats.clock.add("encode", enc.seconds)
        ctx.job, x = None, ctx.x
        ctx.x = None
        if enc.error is not None:
            sync(enc.handle)
            raise enc.error
        ctx.handle = enc.handle
        g = ctx.group
        if isinstance(ctx, GatherCtx):
            ctx.own = enc.own
            ctx.sent = enc.nbytes * (g.size - 1)
            self.gathered.append(ctx)
        else:
            ctx.own = enc.own[g.rank]
            ctx.own_bytes = enc.lens[g.rank]
            ctx.sent = sum(n for j, n in enumerate(enc.lens) if j != g.rank)
            self.pending.append(ctx)
        if self.policy.ef:  # own values: NumPy (host kernels) or tensors (device path), per chunk
            owns = [enc.own] if isinstance(ctx, GatherCtx) else enc.own
            own = torch.cat([(o if isinstance(o, torch.Tensor) else torch.from_numpy(o)).to(x.device) for o in owns])
            self.memory.update(ctx.name, x, own)

    # -- gather: allgather of payloads -------------------------------------------------------------
    def _gather_start(self, ctx: GatherCtx, x: torch.Tensor) -> GatherCtx:
        g = ctx.group
        seed = words(self.seed, hvd.rank(), ctx.name, ctx.step)
        # the job reads x's values; nothing writes the gradient before the step settles the job
        job = gather_job(self.config, x, seed, f"{ctx.name} (step {ctx.step})",
                         collective(g.key, Kind.GATHER, ctx.name), g.process_set, device.on_device(self.codec, x))
        ctx.x = x
        self._submit(ctx, job)
        return ctx

    def _gather_decode(self, ctx: GatherCtx) -> tuple[torch.Tensor, int, int]:
        """The decoded sum over the group (on the device that encoded), its payload count and
        the bytes gathered."""
        gathered = sync(ctx.handle, self.stats.clock)
        with self.stats.clock.timed("decode"):
            total, count = device.sum_any(gathered.numpy(), ctx.group.rank, ctx.own, ctx.name)
        return total, count, int(gathered.numel())

    def _gather_finish(self, ctx: GatherCtx) -> torch.Tensor:
        size = ctx.group.size
        if ctx.decoded is not None:
            total, count, nbytes = ctx.decoded.result()
            ctx.decoded = None
        else:
            total, count, nbytes = self._gather_decode(ctx)
        if count != size:
            raise RankMismatchError(f"{ctx.name}: gathered {count} payloads from {size} ranks")
        own_len = ctx.sent // max(size - 1, 1)
        self.stats.record(ctx.name, ctx.sent, nbytes - own_len)
        return total

    # -- summable: shared scale (Max-allreduce), then integer lanes (Sum-allreduce) ------------------
    def _summable_start(self, ctx: SummableCtx, x: torch.Tensor) -> SummableCtx:
        t0 = time.perf_counter()
        scheme = self.scheme
        assert isinstance(scheme, EvenLevelScheme)
        on_dev = device.on_device(self.codec, x)
        xc = x if on_dev else x.cpu()
        ops = ctx.ops = TorchOps(x.device) if on_dev else _CPU
        rows = -(-xc.numel() // scheme.bucket)
        inside = xc.abs() < scheme.limit  # False for NaN/Inf and for values beyond the scheme's range
        if bool(inside.all()):
            stats = local_stats(scheme, ops, xc)
        elif bool(torch.isfinite(xc).all()):  # finite, too large: every rank stops (quantize raises here)
            ctx.local_error = RangeError(
                f"{ctx.name} (step {ctx.step}): this rank had a finite value of magnitude "
                f"{float(xc.abs().max()):.7g} in this gradient, beyond what {scheme.name} quantizes in float32 "
                f"(|x| < {scheme.limit:.7g}); scale the gradient down (a smaller loss scale), or use "
                "nonfinite=skip to send such tensors uncompressed")
            # a statistic no bucket can have, naming this rank (codec.range_stat): the max names the lowest
            stats = torch.full((rows, scheme.meta_width), codec.range_stat(ctx.group.rank), device=xc.device)
        elif self.policy.nonfinite is NonFinite.RAISE:
            ctx.local_bad = True  # +inf statistics: every rank sees it in the max and stops
            stats = torch.full((rows, scheme.meta_width), float("inf"), device=xc.device)
        else:  # propagate: +inf statistics for the buckets holding NaN/Inf (or, as in quantize, a
            # value beyond the range beside them), zeros sent in them
            pad = torch.ones(rows * scheme.bucket, dtype=torch.bool, device=xc.device)
            pad[: xc.numel()] = inside
            bad = ~pad.reshape(rows, scheme.bucket).all(dim=1)
            xc = torch.where(inside, xc, torch.zeros_like(xc))
            stats = local_stats(scheme, ops, xc)
            stats[bad] = float("inf")
        ctx.x = xc
        ctx.seed = words(self.seed, hvd.rank(), ctx.name, ctx.step)
        g = ctx.group
        self.stats.clock.add("encode", time.perf_counter() - t0)  # the statistics
        ctx.stats_handle = hvd.allreduce_async(stats.cpu().contiguous(), op=hvd.Max,
                                               name=collective(g.key, Kind.STATS, ctx.name), process_set=g.process_set)
        self.pending.append(ctx)
        return ctx

    def _summable_phase2(self, ctx: SummableCtx) -> None:
        scheme = self.scheme
        assert isinstance(scheme, EvenLevelScheme)
        g = ctx.group
        stats = sync(ctx.stats_handle, self.stats.clock).to(ctx.x.device)
        finite = torch.isfinite(stats)
        finite_rows = finite.all(dim=1)
        # a rank beyond the range (codec.range_stat); hidden where another's NaN/Inf made a
        # bucket +inf, so under propagate a rank beyond the range in every such bucket stops alone
        # (after the lanes below, so nobody waits) while the others decode NaN there
        top = float(torch.where(finite, stats, torch.zeros_like(stats)).max()) if stats.numel() else 0.0
        peer = codec.range_rank(top)
        nonfinite = not bool(finite_rows.all())
        if ctx.local_error is not None or peer is not None or (nonfinite and self.policy.nonfinite is NonFinite.RAISE):
            # still launch the lanes (zeros) and wait for them: a rank that raised later must not
            # leave the others waiting, and a rank that raised first must not end Horovod (its
            # exit shuts every rank down) before the slower ranks have reached this same error
            self._launch_lanes(ctx, torch.zeros_like(ctx.x), torch.zeros_like(stats))
            sync(ctx.handle)
            if ctx.local_error is not None:
                raise ctx.local_error
            if ctx.local_bad or (nonfinite and self.policy.nonfinite is NonFinite.RAISE):
                who = "this rank" if ctx.local_bad else "another rank"
                raise NonFiniteError(
                    f"{ctx.name} (step {ctx.step}): {who} had non-finite values (NaN/Inf) in this gradient "
                    "(nonfinite=raise); the default nonfinite=propagate carries them through as Horovod does"
                )
            raise RangeError(f"{ctx.name} (step {ctx.step}): rank {peer} {codec.peer_message(codec.Stop.RANGE)}")
        if nonfinite:
            ctx.bad_rows = ~finite_rows
            stats = torch.where(finite_rows[:, None], stats, torch.zeros_like(stats))
        own = self._launch_lanes(ctx, ctx.x, stats)
        if self.policy.ef:
            self.memory.update(ctx.name, ctx.x, own)
        c = cost(scheme, ctx.x.numel(), 1, g.size, Pattern.SUMMABLE)
        self.stats.record(ctx.name, c.sent, c.received)

    def _launch_lanes(self, ctx: SummableCtx, x: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        scheme = self.scheme
        assert isinstance(scheme, EvenLevelScheme)
        g = ctx.group
        codes, meta = encode_shared(scheme, ctx.ops, x, stats, ctx.seed)
        lay = lanes_for(scheme.symbols, g.size)
        lanes = pack_lanes(ctx.ops, codes, lay.field_bits, lay.fields).to(torch.int32)
        ctx.meta, ctx.lanes = meta, lay
        ctx.handle = hvd.allreduce_async(lanes.cpu(), op=hvd.Sum, name=collective(g.key, Kind.LANES, ctx.name),
                                         process_set=g.process_set)
        own: torch.Tensor = decode_codes(scheme, ctx.ops, codes, meta, x.numel())
        self.stats.clock.add("encode", time.perf_counter() - t0)  # codes, lanes and own values
        return own

    def _summable_finish(self, ctx: SummableCtx) -> torch.Tensor:
        scheme = self.scheme
        assert isinstance(scheme, EvenLevelScheme) and ctx.lanes is not None
        summed = sync(ctx.handle, self.stats.clock).to(ctx.x.device)
        t0 = time.perf_counter()
        n = ctx.x.numel()
        codes = unpack_lanes(ctx.ops, summed.to(torch.int64), ctx.lanes.field_bits, ctx.lanes.fields, n)
        out: torch.Tensor = decode_codes(scheme, ctx.ops, codes, ctx.meta, n, count=ctx.group.size)
        if ctx.bad_rows is not None:
            bad = ctx.bad_rows.repeat_interleave(scheme.bucket)[:n]
            out = torch.where(bad, torch.full_like(out, float("nan")), out)
        self.stats.clock.add("decode", time.perf_counter() - t0)
        return out

    # -- scatter: alltoall of chunks, reduce, re-compress, allgather ----------------------------------
    def _scatter_start(self, ctx: ScatterCtx, x: torch.Tensor) -> ScatterCtx:
        g = ctx.group
        ctx.bounds = chunk_bounds(x.numel(), self.scheme.bucket, g.size)
        seeds: list[Seed] = [words(self.seed, hvd.rank(), f"{ctx.name}#{j}", ctx.step) for j in range(len(ctx.bounds))]
        job = scatter_job(self.config, x, ctx.bounds, seeds, f"{ctx.name} (step {ctx.step})",
                          collective(g.key, Kind.ALLTOALL, ctx.name), g.process_set, device.on_device(self.codec, x))
        ctx.x = x
        self._submit(ctx, job)
        return ctx

    def _scatter_phase2(self, ctx: ScatterCtx) -> None:
        g = ctx.group
        recv, _ = sync(ctx.handle, self.stats.clock)
        with self.stats.clock.timed("decode"):  # where the chunks were encoded
            sent, _count = device.sum_any(recv.numpy(), g.rank, ctx.own, ctx.name)
        ctx.received = int(recv.numel()) - ctx.own_bytes
        key, owner = reduced_key(ctx.name), keeps_owner_residuals(self.policy.ef, second_phase=True)
        if owner:
            sent = self.memory.compensate(key, sent)
        seed = words(self.seed, hvd.rank(), key, ctx.step)
        fine = reduced_scheme(self.scheme, g.size)  # cheap, unbiased, no noisier than the first phase
        what = f"{ctx.name} (step {ctx.step}, reduced)"
        with self.stats.clock.timed("encode"):
            buf, own = device.encode_any(fine, sent, seed, what, isinstance(ctx.own, torch.Tensor))
        if owner:
            self.memory.update(key, sent, own if isinstance(own, torch.Tensor) else torch.from_numpy(own))
        ctx.reduced_own, ctx.reduced_bytes = own, int(buf.shape[0])
        ctx.gather_handle = hvd.allgather_async(
            torch.from_numpy(buf), name=collective(g.key, Kind.REDUCED, ctx.name), process_set=g.process_set)

    def _scatter_finish(self, ctx: ScatterCtx) -> torch.Tensor:
        g = ctx.group
        gathered = sync(ctx.gather_handle, self.stats.clock).numpy()
        own = ctx.reduced_own
        with self.stats.clock.timed("decode"):
            pieces = [own if r == g.rank else device.decode_any(p, own) for r, p in enumerate(split(gathered))]
        sent = ctx.sent + ctx.reduced_bytes * (g.size - 1)
        received = ctx.received + int(gathered.shape[0]) - ctx.reduced_bytes
        self.stats.record(ctx.name, sent, received)
        return torch.cat([p if isinstance(p, torch.Tensor) else torch.from_numpy(p) for p in pieces])
