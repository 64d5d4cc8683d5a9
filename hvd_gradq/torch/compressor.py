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

The patterns themselves (typed contexts, phases) are :mod:`.reduce`; checkpoints are
:mod:`.checkpoint`, resuming Horovod's way (rank 0 loads, then broadcasts; the first step's check of
the step counters) :mod:`.resume`; this module is Horovod's interface: identity, the call, the policy.

**What Horovod's call says** (:mod:`.callsite`): the parameter and its name (so ``sparse_as_dense``
and parameters without a gradient are named), the op (Adasum, Min, Max and reducescatter are
refused with an error that says what to use), and the process set, whose ranks, rank and size
every collective of that tensor uses.

**Corruption in transit** (:mod:`.verdict`): what each rank found wrong with the bytes it
received is compared once a step, in one collective a process set that runs during the next
forward pass; the rank that found it raises at that tensor's ``decompress()``, the others during
the next step's ``compress()`` calls, all with the same :class:`~hvd_gradq.errors.CorruptionError`
(after the last step, :meth:`GradqCompressor.check_last_step` reads it).

**Non-finite values** follow the policy's ``nonfinite`` option (:mod:`hvd_gradq.policy`; under
``raise``, tensors Horovod reduces itself are checked by :mod:`.plain_check`); the default
``propagate`` carries NaN/Inf to every rank as stock Horovod does, so ``GradScaler`` skips the step
everywhere. Error feedback keeps its residuals in unscaled units (``loss_scale=``) and rolls back
what a step wrote when that step's reduced gradients were not finite.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from typing import Any

import horovod.torch as hvd
import horovod.torch.mpi_ops as mpi_ops
import torch

from ..errors import GradqError
from ..feedback import Memory
from ..frontend import elastic as elastic_jobs
from ..frontend.compressor import CompressorCore, final_scale, ranks_on_host
from ..frontend.guards import check_tensor, instance_only
from ..frontend.membership import host_count, membership, ranks_a_host
from ..frontend.workers import Workers
from ..plan.decide import fp16_cost, fp32_cost
from ..plan.pattern import Pattern, compresses, why_tag
from ..plan.trial import MEASURED
from ..reduce import Group
from ..schemes.scheme import Scheme
from ..spec import Config
from . import checkpoint, handshake, resume
from .callsite import CallSite, inspect_call, refuse
from .context import Ctx, Pass
from .device import resolve_codec
from .elastic import Elastic, register
from .ops import HOST, all_finite
from .plain_check import PlainCheck
from .reduce import Reducer
from .store import LossScale, TensorStore, check_loss_scale, read_loss_scale
from .telemetry import Telemetry

TAG = "_hvd_gradq_name"


_UNNAMED = itertools.count()


class GradqCompressor(CompressorCore):
    """Compress gradients with a hvd_gradq scheme inside ``hvd.DistributedOptimizer``.

    Args:
        scheme: the scheme and its policy (``hvd_gradq.parse("orq:levels=5,ef=true")``); a bare
            scheme gets its class's default policy.
        named_parameters: ``model.named_parameters()``, optional: Horovod's own parameter names
            are used where Horovod calls the compressor; these let ``load_state_dict`` check a
            checkpoint against the model, and name gradients compressed outside Horovod's optimizer.
        seed: base seed of the rounding noise; draws differ across ranks, steps and tensors.
        pattern: ``auto`` (the cost model, then measured: ``fallback``), ``gather``, ``summable``,
            ``scatter`` or ``hierarchical`` (:mod:`hvd_gradq.plan.decide`).
        link_gbps: the link rate (Gbit/s) the cost model weighs bytes with against encoding and
            decoding time under ``auto``. Default: ``HVD_GRADQ_LINK_GBPS``, else 10.
        fallback: under ``auto``, race the plans on the job's steps and keep the fastest
            (:mod:`hvd_gradq.plan.trial`): compressed as the cost model decides, Horovod's fp16 or
            fp32 (as ``hvd.Compression.fp16`` / ``none``), or the largest compressed and the rest
            fp16; ``stats()['auto']`` says what it measured. False: the cost model's plan.
            Default: ``HVD_GRADQ_FALLBACK`` (1 or 0), else True.
        check_ranks: at the first step, stop every rank with an error naming the ranks and the
            fields that differ if their configurations disagree (compared by digest), or if their
            step counters do (a checkpoint loaded on some ranks only: :mod:`.resume`). Every rank
            takes part in the configuration check whatever it says, and the check stops the job
            if any rank asks for it; False on every rank: a warning instead. A rank waits for the
            others at most ``HVD_GRADQ_HANDSHAKE_TIMEOUT`` seconds (60), then fails saying what it
            waited for.
        process_set: the Horovod process set of the reductions; by default the one Horovod's call
            names (``DistributedOptimizer(process_set=...)``); if both are given they must agree.
        loss_scale: with mixed precision, a callable returning the current loss scale
            (``scaler.get_scale`` for a ``GradScaler``), so that error-feedback residuals stay
            right when the scale changes.
        threads: threads that encode and decode each tensor (split in ranges of whole buckets), with
            one worker that encodes, starts collectives and decodes off the training thread
            (:mod:`hvd_gradq.frontend.workers`); 0 runs everything inline on one thread. Default:
            ``HVD_GRADQ_THREADS``, else this rank's cores (cores // local_size) when 2 or more, else 0.
            The bits are the same whatever the count.
        codec: where gather encodes and decodes (:mod:`.device`): ``auto`` (on the gradient's
            device for CUDA tensors, only payload bytes to the host; the compiled host kernels for
            CPU tensors), ``host`` or ``device``. Default: ``HVD_GRADQ_CODEC``, else ``auto``.
        log_every: log the first-step line's figures again every this many steps, on rank 0
            (:mod:`hvd_gradq.log`). Default: ``HVD_GRADQ_LOG_EVERY``, else 0 (off).

    Example::

        compression = gq.ORQ(levels=5, ef=True, named_parameters=model.named_parameters())
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=compression)
    """

    FRONTEND, WORLD_NAME, CONFIG_TAG = "hvd_gradq.torch", "torch", "torch"
    PASSES_ONE_RANK = True  # a one-rank set passes through exactly, as Horovod's own allreduce
    MEASURES = True  # auto times its plans in the job: a tensor's plan may change from one step to the next

    def __init__(
        self,
        scheme: Config | Scheme,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
        *,
        seed: int = 0,
        pattern: str | Pattern = "auto",
        check_ranks: bool = True,
        process_set: Any = None,
        loss_scale: LossScale | None = None,
        threads: int | None = None,
        codec: str | None = None,
        link_gbps: float | None = None,
        fallback: bool | None = None,
        log_every: int | None = None,
    ) -> None:
        super().__init__(scheme, seed=seed, pattern=pattern, check_ranks=check_ranks, process_set=process_set,
                         link_gbps=link_gbps, threads=threads, fallback=fallback, local_size=ranks_on_host(hvd),
                         log_every=log_every)
        self._local: int | None = None  # ranks a host (plan/hosts.py), asked of Horovod once
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
        self._loss_scale = check_loss_scale(loss_scale)
        self._store = TensorStore()
        self.memory = Memory(HOST, self._store, variant=self.policy.feedback)
        self._plain = PlainCheck(self.policy)
        self._telemetry: Telemetry = Telemetry(self._stats, self.world, self.log_every, self._step_end)
        self.workers = Workers(min(self.threads, 1))  # the pipelining pool: one worker, or inline
        self._reducer = Reducer(self.scheme, self.policy, seed, self.memory, self._stats, self.workers,
                                resolve_codec(codec))
        self._decompressing = True  # the next compress() starts a new step
        self._trained: set[str] = set()  # DistributedOptimizer's tensors of this step not yet back
        self._elastic = Elastic(self)  # elastic Horovod: generation, commit/restore/sync (.elastic)
        # resuming: the first step's check of the counters (not in elastic jobs: state.sync() aligns them)
        # armed on every rank whatever its check_ranks, as the handshake: ranks run the same collectives
        self._resume = resume.Resume(armed=not elastic_jobs.active())

    @property
    def _residuals(self) -> dict[str, torch.Tensor]:
        return self._store.residuals

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

    def _group(self, site: CallSite | None) -> Group:
        ps = self.reduction_set(site.process_set if site is not None else None, hvd.global_process_set)
        if ps is hvd.global_process_set:
            if self._local is None:
                self._local = ranks_a_host(hvd, mpi_ops._basics, ps)
            return Group(hvd.rank(), hvd.size(), self._elastic.prefix(), self._local, hvd.global_process_set)
        member = membership(mpi_ops._basics, ps)
        if not member.included:
            raise GradqError(f"this rank ({hvd.rank()}) is not in {ps}, the process set of this reduction")
        return Group(member.rank, member.size, f"{self._elastic.prefix()}ps{ps.process_set_id}.", 1, ps)

    def _check(self, group: Group) -> None:
        """The handshake (:meth:`CompressorCore.handshake`, over :mod:`.handshake`'s allgather),
        before anything depends on the configuration."""
        self.handshake(group.key, group.size, group.local, handshake.gatherer(group), handshake.fp16_round_trip)

    # -- Horovod's interface -------------------------------------------------------------------
    @instance_only
    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        t0 = time.perf_counter()  # stats: the training thread's time in here
        check_tensor(tensor, "hvd_gradq.torch")  # before Horovod: a TF tensor means the wrong frontend
        site = inspect_call()
        refuse(site, tensor)
        if self._decompressing:  # the first compress() after a decompress(): a new step
            self._elastic.begin_step()  # an elastic reset: a new generation, decisions made again
            self._reducer.begin_step()  # the previous step's verdicts (.verdict), after any reset
            self._decompressing = False
            self._telemetry.begin_step()
            self._plain.begin_step()
            self.memory.begin_step(read_loss_scale(self._loss_scale))
            self._resume.begin_step(self._steps)
        self._reducer.verdicts.compressed()  # read them (at the previous step's last call: waited for)
        group = self._group(site)
        self._check(group)
        # auto's trial times DistributedOptimizer's steps, whatever direct hvd.allreduce calls come between
        trained = site is not None and site.writes_back
        if trained and not self._trained:
            self.trial_step(group.key, group.size, handshake.gatherer(group))
        resume.check_first_step(self._resume, group, self.policy.warmup)  # before any counter moves
        name = self._name_of(tensor, site)
        if name is None:
            if self.policy.ef:
                raise GradqError(
                    "error feedback needs to know which tensor a gradient is: pass name= to hvd.allreduce, "
                    "or use hvd.DistributedOptimizer (Horovod names its parameters)"
                )
            name = f"noname.{next(_UNNAMED)}"
        if self.policy.ef:  # a loaded residual must fit its gradient; state_dict() records the shape
            resume.check_fits(self._resume, self._store, name, tensor.shape)
            self._resume.note(name, tensor.shape)
        n = tensor.numel()
        # one-rank sets pass through exactly; otherwise the shared policy (plan/decide.py)
        if trained:
            self._trained.add(name)
        choice = self.decide(n, tensor.dim(), group.size, group.local, self.agreed(group.key),
                             name if trained else None)
        step = self._steps.get(name, 0)
        if compresses(choice.pattern):
            self._steps[name] = step + 1
            choice = self.warm(choice, step)  # the recipe's first steps: exact, no residual kept
        pattern = choice.pattern
        self._stats.decide(name, pattern.value, choice.why, n, group.size)
        if pattern in (Pattern.FP32, Pattern.FP16):
            # Horovod's own fp32 allreduce, exactly (torch's allreduce has no bf16: sent as fp32), or
            # what hvd.Compression.fp16 does: cast to float16, Horovod's allreduce, cast back
            c = (fp32_cost if pattern is Pattern.FP32 else fp16_cost)(n, group.size)
            self._stats.record(name, c.sent, c.received)
            if self.policy.ef and why_tag(choice.why) in MEASURED:  # earlier steps' residuals go with this one
                tensor = self._flushed(name, tensor, group)
            out = tensor.to(torch.float16) if pattern is Pattern.FP16 else (
                tensor.to(torch.float32) if tensor.dtype == torch.bfloat16 else tensor)
            how = f"Horovod's own {'fp16' if pattern is Pattern.FP16 else 'fp32'} allreduce ({choice.why})"
            return self._telemetry.compressed(t0, (out, Pass(name, tensor.dtype, how)))
        x = tensor.detach().reshape(-1).to(torch.float32)  # its residual is added as the pattern starts
        ctx = Ctx(name, step, tensor.shape, tensor.dtype, tensor.device, group, choice)
        # where Horovod sets the gradient to the result, the result goes into the gradient's own
        # storage as stock Horovod's in-place allreduce: no second full-size copy of a huge tensor
        into = site is not None and site.writes_back and tensor.dtype == torch.float32 and tensor.is_contiguous()
        ctx.flow = self._reducer.start(choice, name, step, group, x, tensor.detach().view(-1) if into else None)
        return self._telemetry.compressed(t0, (torch.ones(1, dtype=torch.float32), ctx))

    def _flushed(self, name: str, tensor: torch.Tensor, group: Group) -> torch.Tensor:
        """``tensor`` plus the residuals its compressed steps left, delivered by this uncompressed
        step (:meth:`hvd_gradq.feedback.Memory.flush`); ``tensor`` itself where there are none."""
        x = tensor.detach().reshape(-1).to(torch.float32)
        out = self.memory.flush(name, x, self.owned(name, x.numel(), tensor.dim(), group))
        return tensor if out is x else out.reshape(tensor.shape).to(tensor.dtype)

    def decompress(self, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        if ctx is None:  # sparse gradients bypass compression
            return tensor
        t0 = time.perf_counter()
        self._decompressing = True
        if isinstance(ctx, (Pass, Ctx)):
            self._trained.discard(ctx.name)
        if isinstance(ctx, Pass):
            self._reducer.verdicts.read()  # a step of fewer compress() calls than the last
            out = tensor.to(ctx.dtype)
            self._check_output(out, ctx)
            return self._telemetry.decompressed(t0, out, ctx.name)
        if not isinstance(ctx, Ctx) or ctx.flow is None:
            raise GradqError("decompress() got a context hvd_gradq did not make")
        # Horovod reduced our [1.0] with this call's op and scale factors (frontend/compressor.py)
        total: torch.Tensor = self._reducer.finish(ctx.flow)  # the sum is this call's own buffer: scaled in place
        view = HOST.host_view(total)  # on the CPU, NumPy's arithmetic: no parallel region of torch's pool
        v = float(tensor.reshape(-1)[0])
        if view is None:
            total = final_scale(total, v, ctx.group.size, in_place=True)
        else:
            final_scale(view, v, ctx.group.size, in_place=True)
        out = total.reshape(ctx.shape).to(device=ctx.device, dtype=ctx.dtype)
        self._check_output(out)
        return self._telemetry.decompressed(t0, out, ctx.name)

    def _step_end(self, added: dict[str, float]) -> None:
        """The step's last ``decompress()`` (:class:`.telemetry.Telemetry`): ``added``, each tensor's
        seconds after backward, for ``auto``'s trial; a non-finite sum under ``nonfinite=raise``."""
        self._measured.after_backward(added)
        self._plain.end_of_step()

    def _check_output(self, out: torch.Tensor, plain: Pass | None = None) -> None:
        """A step whose reduced gradients hold NaN/Inf is skipped by GradScaler on every rank
        (every rank sees the same bits): the residuals it wrote are rolled back; and under
        ``nonfinite=raise`` the sum of a tensor Horovod reduced itself (``plain``) is noted, to be
        raised at the step's end (:mod:`.plain_check`). One compiled pass over ``out`` for both."""
        watched = self.policy.ef or (plain is not None and self._plain.on)
        if watched and out.is_floating_point() and not all_finite(out):
            if self.policy.ef:
                self.memory.rollback()
            if plain is not None:
                self._plain.saw(plain)

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self, all_ranks: bool = False, timeout: float | None = checkpoint.STATE_TIMEOUT) -> dict[str, Any]:
        """Error-feedback residuals and per-tensor step counters; see :func:`.checkpoint.state_dict`
        (``all_ranks=True`` is a collective: every rank calls it, or it fails after ``timeout`` s)."""
        return checkpoint.state_dict(self.config(), self._steps, self._store, all_ranks, timeout,
                                     self._elastic.state_name() if all_ranks else None, self._resume.shapes)

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Restore :meth:`state_dict`; ``strict=False`` takes another scheme's state (step counters
        only); see :func:`.checkpoint.load_state_dict`. Loaded on rank 0 only (Horovod's habit), it
        must be followed by :meth:`broadcast_state` on every rank."""
        loaded = checkpoint.load_state_dict(state, self.config(), self._params, self._store, strict)
        self._steps = loaded.steps
        self._resume.loaded(loaded, self._store.residuals)

    def broadcast_state(self, root_rank: int = 0) -> None:
        """Rank ``root_rank``'s compressor state for every rank, beside ``hvd.broadcast_parameters``
        and ``hvd.broadcast_optimizer_state`` after loading a checkpoint on that rank only. A
        collective: call it on every rank, between steps. Every rank takes the root's step
        counters; each takes its own residuals from a ``state_dict(all_ranks=True)`` the root
        loaded, else keeps those it loaded itself for the same counters, else starts them from
        zero (a warning says so); see :mod:`.resume`."""
        self._steps = resume.broadcast_state(self._resume, self._steps, self._store, root_rank,
                                             self._elastic.prefix(), self.policy.ef)

    def check_last_step(self) -> None:
        """Read the verdict of the last step taken: what the ranks found wrong with the bytes they
        received is compared once a step and read at the next step's first ``compress()``
        (:mod:`.verdict`), so after the last step nothing reads it. A collective: call it on every
        rank, between steps (after training, before a final checkpoint); it raises the step's
        CorruptionError where a rank found corruption in it, and returns at once otherwise."""
        self._reducer.begin_step()
        self._reducer.verdicts.read()

    # -- what stats() says of the run (CompressorCore.world) -------------------------------------
    def _ranks(self) -> int | None:
        return int(hvd.size()) if hvd.is_initialized() else None

    def _ranks_a_host(self) -> int:
        return self._local or 1

    def _hosts(self) -> int | None:
        return host_count(hvd, mpi_ops._basics) if hvd.is_initialized() else None

    def _intra_op_threads(self) -> int | None:
        return int(torch.get_num_threads())

    def _world_extra(self) -> dict[str, Any]:
        return {"threads": self.workers.threads, "codec": self._reducer.codec}


def _tagger(name: str) -> Any:
    def hook(p: torch.Tensor) -> None:
        if p.grad is not None:
            setattr(p.grad, TAG, name)

    return hook


register(GradqCompressor)  # hvd.elastic.TorchState commits, restores and syncs it (.elastic)
