"""A Horovod ``Compressor`` for ``horovod.torch.DistributedOptimizer`` that is real on the wire.

Horovod sums whatever ``compress()`` returns, with torch's allreduce refusing 8-bit types (in
Horovod 0.28.1 it takes int32, int64, float16, float32 and float64 only: uint8 and int8 raise
"Tensor type ... is not supported", measured with Gloo and MPI), and no tensor name reaches the
compressor (``_allreduce_grad_async`` calls ``compress(p.grad)`` with the tensor alone). So
``compress()`` starts hvd_gradq's own named collective on the packed payload and hands Horovod a
one-element tensor of 1.0. Horovod reduces that with the call's op and scale factors, so it
comes back as ``v = post * pre`` (op=Average) or ``post * pre * N`` (op=Sum): the decoded sum of
every rank's contribution times ``v / N`` is what stock Horovod would have returned, whatever
the op, ``prescale_factor``, ``postscale_factor`` or ``gradient_predivide_factor``.

**Never blocking on call order.** Horovod compresses the parameters that got no gradient inside
``synchronize()``, iterating a set whose order differs between ranks (unused parameters, GANs,
conditional branches). A collective that *blocks* inside ``compress()`` would then wait for a
tensor the other rank has not reached: a hang. So ``compress()`` only *starts* collectives. The
two-phase patterns (``summable``: statistics, then lanes; ``scatter``: alltoall, then allgather)
launch their second phase for every pending tensor at the first ``decompress()`` of a step, when
every ``compress()`` of that step has run on this rank (Horovod's ``synchronize()`` compresses
everything before it waits on anything); Horovod negotiates asynchronous ops by name, so the
ranks may launch them in any order. The rank-configuration check is an asynchronous allgather too.

**What Horovod's call says** (:mod:`.callsite`): the parameter and its name (so ``sparse_as_dense``
and parameters without a gradient are named), the op (Adasum, Min, Max and reducescatter are
refused with an error that says what to use), and the process set, whose ranks, rank and size
every collective of that tensor uses.

**Non-finite values** follow the scheme's ``nonfinite`` option; the default ``propagate`` carries
NaN/Inf to every rank as stock Horovod does, so ``GradScaler`` skips the step everywhere. Error
feedback (:mod:`.feedback`) keeps its residuals in unscaled units (``loss_scale=``) and rolls back
what a step wrote when that step's reduced gradients were not finite.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import horovod.torch as hvd
import horovod.torch.mpi_ops as mpi_ops
import numpy as np
import torch

from ..api import dequantize, split
from ..errors import GradqError, NonFiniteError, RankMismatchError
from ..frontend import codec
from ..frontend.membership import membership
from ..frontend.patterns import Lanes, Pattern, choose, chunk_bounds, cost, fp32_cost, lanes_for, parse_pattern
from ..frontend.stats import Stats
from ..schemes.base import EvenLevelScheme, NonFinite, Scheme, decode_codes, encode_shared, local_stats
from ..wire.packing import pack_lanes, unpack_lanes
from .callsite import CallSite, inspect_call
from .feedback import LossScale, Memory
from .ops import TorchOps

TAG = "_hvd_gradq_name"
_CPU = TorchOps("cpu")


@dataclass(frozen=True)
class _Group:
    """The ranks a reduction runs on: Horovod's process set, this rank's place and their count."""

    process_set: Any
    rank: int
    size: int
    key: str  # part of collective names: ranks of two process sets never share a name


@dataclass
class _Pass:
    """A tensor handed to Horovod's own allreduce, exactly (tiny tensors, one-rank sets)."""

    name: str
    dtype: torch.dtype


@dataclass
class _Ctx:
    """What every compressed tensor carries from ``compress()`` to ``decompress()``."""

    name: str
    step: int
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    group: _Group
    fp32: int  # bytes an fp32 ring allreduce would move (for stats)


@dataclass
class _Gather(_Ctx):
    pattern: ClassVar[Pattern] = Pattern.GATHER
    handle: Any = None
    own: Any = None  # this rank's decoded payload (NumPy), so it is not decoded twice
    sent: int = 0


@dataclass
class _Summable(_Ctx):
    pattern: ClassVar[Pattern] = Pattern.SUMMABLE
    x: Any = None  # the compressed input (gradient + residual), CPU float32
    seed: int = 0
    stats_handle: Any = None  # phase 1: Max-allreduce of per-bucket statistics
    local_bad: bool = False  # nonfinite=raise and this rank held NaN/Inf
    lanes: Lanes | None = None
    meta: Any = None
    bad_rows: Any = None  # buckets some rank held NaN/Inf in (propagate): decoded as NaN
    handle: Any = None  # phase 2: Sum-allreduce of int32 lanes


@dataclass
class _Scatter(_Ctx):
    pattern: ClassVar[Pattern] = Pattern.SCATTER
    bounds: list[tuple[int, int]] | None = None
    handle: Any = None  # phase 1: alltoall of per-chunk payloads
    own: Any = None  # this rank's own chunk, decoded
    own_bytes: int = 0
    sent: int = 0
    received: int = 0
    reduced_own: Any = None  # phase 2: this rank's reduced chunk, decoded
    reduced_bytes: int = 0
    gather_handle: Any = None  # phase 2: allgather of the reduced chunks


_UNNAMED = itertools.count()


class GradqCompressor:
    """Compress gradients with a hvd_gradq scheme inside ``hvd.DistributedOptimizer``.

    Args:
        scheme: the scheme (``hvd_gradq.parse("orq:levels=5")``).
        named_parameters: ``model.named_parameters()``, optional: Horovod's own parameter names
            are used where Horovod calls the compressor; these let ``load_state_dict`` check a
            checkpoint against the model, and name gradients compressed outside Horovod's optimizer.
        seed: base seed of the rounding noise; draws differ across ranks, steps and tensors.
        pattern: ``auto`` (cost model), ``gather``, ``summable`` or ``scatter``.
        check_ranks: at the first step, allgather the configuration and stop every rank with an
            error naming the ranks and the difference if they disagree.
        process_set: the Horovod process set of the reductions; by default the one Horovod's call
            names (``DistributedOptimizer(process_set=...)``); if both are given they must agree.
        loss_scale: with mixed precision, a callable returning the current loss scale
            (``scaler.get_scale`` for a ``GradScaler``), so that error-feedback residuals stay
            right when the scale changes.

    Example::

        compression = gq.ORQ(levels=5, ef=True, named_parameters=model.named_parameters())
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=compression)
    """

    def __init__(
        self,
        scheme: Scheme,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
        *,
        seed: int = 0,
        pattern: str | Pattern = "auto",
        check_ranks: bool = True,
        process_set: Any = None,
        loss_scale: LossScale | None = None,
    ) -> None:
        if os.environ.get("HOROVOD_ELASTIC") == "1":
            raise GradqError(
                "hvd_gradq does not support elastic Horovod (hvd.elastic): error-feedback residuals, "
                "random streams and the rank-configuration check are per rank and would not follow "
                "workers that join or leave. Run with a fixed number of workers (horovodrun -np N)"
            )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise GradqError(f"seed must be an integer, not {type(seed).__name__}")
        self.scheme = scheme
        self.seed = seed
        self.pattern = parse_pattern(pattern)
        if self.pattern is Pattern.SUMMABLE:
            choose(scheme, 1, 1, 2, Pattern.SUMMABLE)  # refuse now, not at the first step
        self.check_ranks = check_ranks
        self.process_set = process_set
        self._params: dict[str, torch.nn.Parameter] = {}
        seen: set[int] = set()
        for name, p in named_parameters or ():
            if not isinstance(name, str) or not isinstance(p, torch.Tensor):
                raise GradqError("named_parameters must yield (name, parameter) pairs, e.g. model.named_parameters()")
            if id(p) in seen:
                continue
            seen.add(id(p))
            if name in self._params:
                raise GradqError(f"parameter name {name!r} appears twice in named_parameters")
            self._params[name] = p
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(_tagger(name))  # type: ignore[no-untyped-call]
        self._steps: dict[str, int] = {}
        self.memory = Memory(loss_scale)
        self._stats = Stats()
        self._checked: set[str] = set()  # process sets whose ranks' configurations were compared
        self._pending: list[_Summable | _Scatter] = []  # second phases not yet launched
        self._decompressing = True  # the next compress() starts a new step

    @property
    def _residuals(self) -> dict[str, torch.Tensor]:
        return self.memory.residuals

    # -- identity and the call ----------------------------------------------------------------
    def _name_of(self, tensor: torch.Tensor, site: CallSite | None) -> str | None:
        if site is not None and site.name:
            return site.name
        name = getattr(tensor, TAG, None)
        if isinstance(name, str):
            return name
        for n, p in self._params.items():
            if p.grad is tensor:
                return n
        return None

    def _group(self, site: CallSite | None) -> _Group:
        ps = site.process_set if site is not None else None
        if self.process_set is not None:
            if ps is not None and ps is not self.process_set and ps != hvd.global_process_set:
                raise GradqError(
                    f"the compressor was built for {self.process_set}, but Horovod reduces this tensor on {ps}; "
                    "pass the same process_set to the compressor and to DistributedOptimizer, or none to the compressor"
                )
            ps = self.process_set
        if ps is None or ps == hvd.global_process_set:
            return _Group(hvd.global_process_set, hvd.rank(), hvd.size(), "")
        member = membership(mpi_ops._basics, ps)
        if not member.included:
            raise GradqError(f"this rank ({hvd.rank()}) is not in {ps}, the process set of this reduction")
        return _Group(ps, member.rank, member.size, f"ps{ps.process_set_id}.")

    @staticmethod
    def _refuse(site: CallSite | None, tensor: torch.Tensor) -> None:
        if isinstance(tensor, torch.nn.Parameter) or (site is not None and site.kind == "adasum") or (
            site is not None and site.op == hvd.Adasum
        ):
            raise GradqError(
                "hvd_gradq compressors do not support op=hvd.Adasum (it reduces parameter deltas "
                "pairwise, which quantized payloads cannot be); use op=hvd.Average or hvd.Sum"
            )
        if site is not None and site.kind == "reducescatter":
            raise GradqError(
                "hvd_gradq compressors serve allreduce (DistributedOptimizer, hvd.allreduce); "
                "hvd.reducescatter with compression= is not supported: use Compression.none there"
            )
        if site is not None and site.op not in (hvd.Average, hvd.Sum):
            raise GradqError(
                f"hvd_gradq compressors support op=hvd.Average and hvd.Sum only (got op={site.op}): "
                "quantized payloads are summed, not min/max/product-reduced"
            )

    def config(self) -> str:
        """What every rank must agree on."""
        return f"{self.scheme.spec}|pattern={self.pattern.value}|seed={self.seed}|v=1"

    def _check(self, group: _Group) -> None:
        """Once per process set, before anything depends on the configuration: ranks that
        disagree would otherwise hand Horovod tensors of different shapes (one compresses a
        tensor the other passes through) and Horovod would shut down before our check could
        speak. It blocks, but it is the same single collective on every rank, reached at each
        rank's first compress(), so no call order can make it wait for another tensor."""
        if group.key in self._checked:
            return
        self._checked.add(group.key)
        if not self.check_ranks or group.size == 1:
            return
        block = torch.from_numpy(codec.config_block(self.config()))
        gathered = hvd.allgather(block, name=f"hvd_gradq.{group.key}config", process_set=group.process_set)
        codec.check_config_blocks(gathered.numpy())

    # -- Horovod's interface -------------------------------------------------------------------
    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        site = inspect_call()
        self._refuse(site, tensor)
        if self._decompressing:  # the first compress() after a decompress(): a new step
            self._decompressing = False
            self.memory.begin_step()
        group = self._group(site)
        self._check(group)
        name = self._name_of(tensor, site)
        if name is None:
            if self.scheme.ef:
                raise GradqError(
                    "error feedback needs to know which tensor a gradient is: pass name= to hvd.allreduce, "
                    "or use hvd.DistributedOptimizer (Horovod names its parameters)"
                )
            name = f"noname.{next(_UNNAMED)}"
        n = tensor.numel()
        pattern = choose(self.scheme, n, tensor.dim(), group.size, self.pattern) if group.size > 1 else None
        if pattern is None or (
            self.pattern is Pattern.AUTO
            and cost(self.scheme, n, tensor.dim(), group.size, pattern).received >= fp32_cost(n, group.size).received
        ):
            # Tiny tensors (biases): a payload header costs more than the values. Horovod's own
            # fp32 allreduce takes them, exactly (torch's allreduce has no bf16: sent as fp32).
            c = fp32_cost(n, group.size)
            self._stats.record(name, "fp32", c.sent, c.received, c.sent)
            return tensor.to(torch.float32) if tensor.dtype == torch.bfloat16 else tensor, _Pass(name, tensor.dtype)
        if pattern is Pattern.SUMMABLE and self.scheme.nonfinite is NonFinite.SKIP:
            pattern = Pattern.GATHER  # skip changes a rank's payload on its own
        step = self._steps.get(name, 0)
        self._steps[name] = step + 1
        x = tensor.detach().reshape(-1).to(torch.float32)
        if self.scheme.ef:
            x = self.memory.compensate(name, x)
        fp32 = fp32_cost(n, group.size).sent
        base = (name, step, tensor.shape, tensor.dtype, tensor.device, group, fp32)
        ctx: _Ctx
        if pattern is Pattern.GATHER:
            ctx = self._gather_start(_Gather(*base), x)
        elif pattern is Pattern.SUMMABLE:
            ctx = self._summable_start(_Summable(*base), x)
        else:
            ctx = self._scatter_start(_Scatter(*base), x)
        return torch.ones(1, dtype=torch.float32), ctx

    def decompress(self, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        if ctx is None:  # sparse gradients bypass compression
            return tensor
        self._decompressing = True
        if isinstance(ctx, _Pass):
            out = tensor.to(ctx.dtype)
            self._check_output(out)
            return out
        if not isinstance(ctx, _Ctx):
            raise GradqError("decompress() got a context hvd_gradq did not make")
        self._flush()
        if isinstance(ctx, _Gather):
            total = self._gather_finish(ctx)
        elif isinstance(ctx, _Summable):
            total = self._summable_finish(ctx)
        else:
            assert isinstance(ctx, _Scatter)
            total = self._scatter_finish(ctx)
        # Horovod reduced our [1.0] with this call's op and scale factors: v = post*pre (Average)
        # or post*pre*N (Sum). The plain cases keep their exact arithmetic.
        v, size = float(tensor.reshape(-1)[0]), ctx.group.size
        if v == 1.0:
            total = total / size
        elif v != float(size):
            total = total * (v / size)
        out = total.reshape(ctx.shape).to(device=ctx.device, dtype=ctx.dtype)
        self._check_output(out)
        return out

    def _check_output(self, out: torch.Tensor) -> None:
        """A step whose reduced gradients hold NaN/Inf is skipped by GradScaler on every rank
        (every rank sees the same bits): the residuals it wrote are rolled back."""
        if self.scheme.ef and out.is_floating_point() and not bool(torch.isfinite(out).all()):
            self.memory.rollback()

    def _flush(self) -> None:
        """Launch the second phase of every pending tensor (see the module docstring)."""
        pending, self._pending = self._pending, []
        error: GradqError | None = None
        for ctx in pending:
            try:
                if isinstance(ctx, _Summable):
                    self._summable_phase2(ctx)
                else:
                    self._scatter_phase2(ctx)
            except GradqError as e:  # launch the others first: no rank waits for this one
                error = error or e
        if error is not None:
            raise error

    # -- gather: allgather of payloads -------------------------------------------------------------
    def _gather_start(self, ctx: _Gather, x: torch.Tensor) -> _Gather:
        g = ctx.group
        seed = codec.draw_seed(self.seed, hvd.rank(), ctx.step, ctx.name)
        collective = f"hvd_gradq.{g.key}g.{ctx.name}"
        try:
            buf, own = codec.encode(self.scheme, x.cpu().numpy(), seed, f"{ctx.name} (step {ctx.step})")
        except NonFiniteError:
            # Tell the other ranks before stopping, so that they raise too instead of
            # waiting forever for this rank's payload.
            hvd.synchronize(hvd.allgather_async(torch.from_numpy(codec.poison()), name=collective,
                                                process_set=g.process_set))
            raise
        ctx.own = own
        ctx.handle = hvd.allgather_async(torch.from_numpy(buf), name=collective, process_set=g.process_set)
        ctx.sent = buf.shape[0] * (g.size - 1)
        if self.scheme.ef:
            self.memory.update(ctx.name, x, torch.from_numpy(own))
        return ctx

    def _gather_finish(self, ctx: _Gather) -> torch.Tensor:
        size = ctx.group.size
        gathered = hvd.synchronize(ctx.handle)
        total, count = codec.decode_sum(gathered.numpy(), ctx.group.rank, ctx.own, ctx.name)
        if count != size:
            raise RankMismatchError(f"{ctx.name}: gathered {count} payloads from {size} ranks")
        own_len = ctx.sent // max(size - 1, 1)
        self._stats.record(ctx.name, "gather", ctx.sent, int(gathered.numel()) - own_len, ctx.fp32)
        return torch.from_numpy(total)

    # -- summable: shared scale (Max-allreduce), then integer lanes (Sum-allreduce) ------------------
    def _summable_start(self, ctx: _Summable, x: torch.Tensor) -> _Summable:
        scheme = self.scheme
        assert isinstance(scheme, EvenLevelScheme)
        xc = x.cpu()
        rows = -(-xc.numel() // scheme.bucket)
        fin = torch.isfinite(xc)
        if bool(fin.all()):
            stats = local_stats(scheme, _CPU, xc)
        elif scheme.nonfinite is NonFinite.RAISE:
            ctx.local_bad = True  # +inf statistics: every rank sees it in the max and stops
            stats = torch.full((rows, scheme.meta_width), float("inf"))
        else:  # propagate: +inf statistics for the buckets holding NaN/Inf, zeros sent in them
            pad = torch.ones(rows * scheme.bucket, dtype=torch.bool)
            pad[: xc.numel()] = fin
            bad = ~pad.reshape(rows, scheme.bucket).all(dim=1)
            xc = torch.where(fin, xc, torch.zeros_like(xc))
            stats = local_stats(scheme, _CPU, xc)
            stats[bad] = float("inf")
        ctx.x = xc
        ctx.seed = codec.draw_seed(self.seed, hvd.rank(), ctx.step, ctx.name)
        g = ctx.group
        ctx.stats_handle = hvd.allreduce_async(
            stats.contiguous(), op=hvd.Max, name=f"hvd_gradq.{g.key}s.{ctx.name}", process_set=g.process_set
        )
        self._pending.append(ctx)
        return ctx

    def _summable_phase2(self, ctx: _Summable) -> None:
        scheme = self.scheme
        assert isinstance(scheme, EvenLevelScheme)
        g = ctx.group
        stats = hvd.synchronize(ctx.stats_handle)
        finite_rows = torch.isfinite(stats).all(dim=1)
        if not bool(finite_rows.all()):
            if scheme.nonfinite is NonFinite.RAISE:
                who = "this rank" if ctx.local_bad else "another rank"
                # still launch the lanes (zeros): a rank that raised later must not leave others waiting
                self._launch_lanes(ctx, torch.zeros_like(ctx.x), torch.zeros_like(stats))
                raise NonFiniteError(
                    f"{ctx.name} (step {ctx.step}): {who} had non-finite values (NaN/Inf) in this gradient "
                    "(nonfinite=raise); the default nonfinite=propagate carries them through as Horovod does"
                )
            ctx.bad_rows = ~finite_rows
            stats = torch.where(finite_rows[:, None], stats, torch.zeros_like(stats))
        own = self._launch_lanes(ctx, ctx.x, stats)
        if scheme.ef:
            self.memory.update(ctx.name, ctx.x, own)
        c = cost(scheme, ctx.x.numel(), 1, g.size, Pattern.SUMMABLE)
        self._stats.record(ctx.name, "summable", c.sent, c.received, ctx.fp32)

    def _launch_lanes(self, ctx: _Summable, x: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
        scheme = self.scheme
        assert isinstance(scheme, EvenLevelScheme)
        g = ctx.group
        codes, meta = encode_shared(scheme, _CPU, x, stats, ctx.seed)
        lay = lanes_for(scheme.symbols, g.size)
        lanes = pack_lanes(_CPU, codes, lay.field_bits, lay.fields).to(torch.int32)
        ctx.meta, ctx.lanes = meta, lay
        ctx.handle = hvd.allreduce_async(lanes, op=hvd.Sum, name=f"hvd_gradq.{g.key}l.{ctx.name}",
                                         process_set=g.process_set)
        own: torch.Tensor = decode_codes(scheme, _CPU, codes, meta, x.numel())
        return own

    def _summable_finish(self, ctx: _Summable) -> torch.Tensor:
        scheme = self.scheme
        assert isinstance(scheme, EvenLevelScheme) and ctx.lanes is not None
        summed = hvd.synchronize(ctx.handle)
        n = ctx.x.numel()
        codes = unpack_lanes(_CPU, summed.to(torch.int64), ctx.lanes.field_bits, ctx.lanes.fields, n)
        out: torch.Tensor = decode_codes(scheme, _CPU, codes, ctx.meta, n, count=ctx.group.size)
        if ctx.bad_rows is not None:
            bad = ctx.bad_rows.repeat_interleave(scheme.bucket)[:n]
            out = torch.where(bad, torch.full_like(out, float("nan")), out)
        return out

    # -- scatter: alltoall of chunks, reduce, re-compress, allgather ----------------------------------
    def _scatter_start(self, ctx: _Scatter, x: torch.Tensor) -> _Scatter:
        g = ctx.group
        xs = x.cpu().numpy()
        ctx.bounds = chunk_bounds(xs.shape[0], self.scheme.bucket, g.size)
        bufs, owns = [], []
        for j, (lo, hi) in enumerate(ctx.bounds):
            seed = codec.draw_seed(self.seed, hvd.rank(), ctx.step, f"{ctx.name}#{j}")
            try:
                b, own = codec.encode(self.scheme, xs[lo:hi], seed, f"{ctx.name} (step {ctx.step})")
            except NonFiniteError:
                b, own = codec.poison(), None
            bufs.append(b)
            owns.append(own)
        lens = torch.tensor([b.shape[0] for b in bufs], dtype=torch.int32)
        ctx.handle = hvd.alltoall_async(torch.from_numpy(np.concatenate(bufs)), splits=lens,
                                        name=f"hvd_gradq.{g.key}a.{ctx.name}", process_set=g.process_set)
        if any(o is None for o in owns):
            hvd.synchronize(ctx.handle)  # the others learn of it from the poison payload
            raise NonFiniteError(f"{ctx.name} (step {ctx.step}): non-finite values (NaN/Inf) in the gradient")
        ctx.own = owns[g.rank]
        ctx.own_bytes = int(bufs[g.rank].shape[0])
        ctx.sent = sum(b.shape[0] for j, b in enumerate(bufs) if j != g.rank)
        if self.scheme.ef:
            self.memory.update(ctx.name, x, torch.from_numpy(np.concatenate([o for o in owns if o is not None])))
        self._pending.append(ctx)
        return ctx

    def _scatter_phase2(self, ctx: _Scatter) -> None:
        g = ctx.group
        recv, _ = hvd.synchronize(ctx.handle)
        part, _count = codec.decode_sum(recv.numpy(), g.rank, ctx.own, ctx.name)
        ctx.received = int(recv.numel()) - ctx.own_bytes
        key = f"{ctx.name}#reduce"
        sent = torch.from_numpy(part)
        if self.scheme.ef:
            sent = self.memory.compensate(key, sent)
        seed = codec.draw_seed(self.seed, hvd.rank(), ctx.step, key)
        buf, own = codec.encode(self.scheme, sent.numpy(), seed, f"{ctx.name} (step {ctx.step}, reduced)")
        if self.scheme.ef:
            self.memory.update(key, sent, torch.from_numpy(own))
        ctx.reduced_own, ctx.reduced_bytes = own, int(buf.shape[0])
        ctx.gather_handle = hvd.allgather_async(torch.from_numpy(buf), name=f"hvd_gradq.{g.key}r.{ctx.name}",
                                                process_set=g.process_set)

    def _scatter_finish(self, ctx: _Scatter) -> torch.Tensor:
        g = ctx.group
        gathered = hvd.synchronize(ctx.gather_handle).numpy()
        pieces = [ctx.reduced_own if r == g.rank else dequantize(p).reshape(-1) for r, p in enumerate(split(gathered))]
        sent = ctx.sent + ctx.reduced_bytes * (g.size - 1)
        received = ctx.received + int(gathered.shape[0]) - ctx.reduced_bytes
        self._stats.record(ctx.name, "scatter", sent, received, ctx.fp32)
        return torch.from_numpy(np.concatenate(pieces).astype(np.float32, copy=False))

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self, all_ranks: bool = False) -> dict[str, Any]:
        """Error-feedback residuals and per-tensor step counters (the random streams' positions).

        With ``all_ranks=True`` (a collective: call it on every rank) the state holds every rank's
        residuals, so the usual Horovod recipe (save on rank 0, load on every rank) resumes exactly.
        Without it, it holds this rank's; a rank that loads another rank's state keeps the step
        counters and starts its residuals from zero (see :meth:`load_state_dict`).
        """
        residuals = {k: v.detach().clone().cpu() for k, v in self.memory.residuals.items()}
        state: dict[str, Any] = {
            "config": self.config(),
            "rank": hvd.rank(),
            "size": hvd.size(),
            "steps": dict(self._steps),
            "residuals": residuals,
        }
        if all_ranks:
            every = hvd.allgather_object(residuals, name="hvd_gradq.state")
            state["ranks"] = dict(enumerate(every))
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`. Residuals belong to one rank: they are taken from the
        state's ``ranks`` entry (``all_ranks=True``) or from a state this rank saved; a state saved
        by another rank restores the step counters and zeroes this rank's residuals (a one-step
        bias, then error feedback resumes) rather than adopting another rank's."""
        if not isinstance(state, dict) or not {"config", "steps", "residuals"} <= set(state):
            raise GradqError("load_state_dict expects a dict from GradqCompressor.state_dict()")
        if state["config"] != self.config():
            raise GradqError(f"the checkpoint was made with {state['config']!r}, this compressor is {self.config()!r}")
        rank, size = hvd.rank(), hvd.size()
        there = state.get("size", size)
        residuals: dict[str, torch.Tensor] = {}
        if "ranks" in state:
            residuals = dict(state["ranks"].get(rank, {})) if there == size else {}
        elif state.get("rank", rank) == rank:
            residuals = dict(state["residuals"])
        if there != size and (state["residuals"] or state.get("ranks")):
            raise GradqError(
                f"the checkpoint holds error-feedback residuals of {there} ranks; this job has {size}. "
                "Residuals are per rank: resume on the same number of ranks, or drop them with "
                "state['residuals'] = {} and state.pop('ranks', None) (a one-step bias, then EF resumes)"
            )
        if self._params:
            unknown = sorted({k.split("#")[0] for k in residuals} - set(self._params))
            if unknown:
                raise GradqError(f"the checkpoint has residuals for unknown parameters: {unknown[:5]}")
            for k, v in residuals.items():
                if "#" in k:  # a scatter chunk's residual: its size follows the chunking
                    continue
                n = self._params[k].numel()
                if v.numel() != n:
                    raise GradqError(f"residual of {k!r} has {v.numel()} elements; the parameter has {n}")
        self._steps = {str(k): int(v) for k, v in state["steps"].items()}
        self.memory.residuals = {k: v.detach().clone().to(torch.float32) for k, v in residuals.items()}

    def stats(self) -> dict[str, Any]:
        """Bytes this rank sent and received, last step and in total, per pattern, against fp32."""
        return self._stats.summary()

    def digest(self) -> str:
        h = hashlib.sha256(self.config().encode())
        return h.hexdigest()[:16]


def _tagger(name: str) -> Any:
    def hook(p: torch.Tensor) -> None:
        if p.grad is not None:
            setattr(p.grad, TAG, name)

    return hook
