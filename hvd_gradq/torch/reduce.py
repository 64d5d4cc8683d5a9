"""The PyTorch frontend's driver of the reduction core (:mod:`hvd_gradq.reduce`): each compressed
tensor's pattern runs as a generator of collective requests, started with Horovod's
asynchronous ops (:class:`~hvd_gradq.torch.transport.HorovodTransport`).

Every compressed tensor takes one pattern (chosen by :func:`hvd_gradq.plan.decide.decide`, its
phases looked up in the core's table: :func:`hvd_gradq.reduce.table.phases`) and carries its
:class:`~.context.Ctx` from ``compress()`` to ``decompress()``, the pattern in flight in it
(:class:`Flow`: its generator, the request in flight and its handle). :class:`Reducer` only
ever *starts* collectives inside ``compress()`` (see :mod:`hvd_gradq.torch.compressor` for why none may block there):

* the first segment of a pattern (up to its first collective) runs in :meth:`Reducer.start`:
  where it is the encode (the table's ``encodes_first``: gather, scatter), on the compressor's
  worker thread (:mod:`hvd_gradq.frontend.workers`) while backward goes on, settled in the order
  the tensors came; otherwise (summable: statistics only; hierarchical: fp32 pieces) inline;
* :meth:`Reducer.flush`, at the first ``decompress()`` of a step, when every ``compress()`` of
  that step has run on this rank, waits for each tensor's collective and starts its next one,
  one round for all tensors before any waits on the next (so no rank waits on a phase another
  rank starts only after a phase it waits on), until every tensor's last collective is out;
  with workers, what remains (decoding) is queued on the worker;
* fusable alltoalls (the hierarchical pattern's phases: :class:`~hvd_gradq.reduce.core.Alltoall`'s
  ``fuse``) are not started one a tensor: a round's go out as ONE Horovod alltoall, its first
  round at the step's first ``decompress()``, so that a rank dying mid-step cannot leave a
  survivor two of hvd_gradq's alltoalls in one Horovod cycle (issue 35, item 10: an abort);
* a small tensor's gather (at most :func:`fuse_below` elements: ``Allgather``'s ``fuse``) joins
  that round too, its payload sent whole to every rank: a step's small tensors then cost one
  collective, not one each. Below ~64K elements a gather's own collective (Horovod's negotiation
  of it, its handle, its wait) costs as much as encoding it; above, starting it in ``compress()``
  overlaps it with the rest of backward, which a fused round (at the first ``decompress()``)
  would not;
* :meth:`Reducer.finish` hands ``decompress()`` the decoded sum over the group, or raises the
  step's CorruptionError where this rank found corruption in that tensor.

Integrity: the patterns note what each rank found wrong with the bytes it received in the step's
record (no collective a tensor); the step's findings are compared once, in one verdict a step
and process set (:mod:`.verdict`, :mod:`hvd_gradq.reduce.verdicts`), started as the step's last
tensor is handed to ``decompress()`` and read during the next step's ``compress()`` calls.

Bits: a pattern's result depends on its inputs only (seeds are per rank, step and tensor; sums
run in rank order), so threads, rounds and the order of tensors change no bit.
"""
from __future__ import annotations

from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import horovod.torch as hvd
import torch

from .. import reduce as core
from ..errors import GradqError
from ..feedback import Memory
from ..frontend.settings import env_elements
from ..frontend.workers import Workers
from ..plan.decide import Choice
from ..policy import Policy
from ..reduce import table
from ..reduce.names import Kind, collective
from ..reduce.stats import Stats
from ..reduce.verdicts import StepRecord
from ..schemes.scheme import Scheme
from ..spec import Config
from . import device
from .ops import HOST, TorchOps
from .transport import HorovodTransport, TorchCodec
from .verdict import StepVerdicts


@dataclass
class Flow:
    """A compressed tensor's pattern in flight: its generator, the collective in flight and its
    handle, and where its first and last segments run."""

    gen: core.Phases
    transport: HorovodTransport
    scope: str = ""  # the group's key: the scope of its collectives' names (reduce/names.py)
    request: core.Request | None = None  # the collective in flight
    handle: Any = None
    job: Future[None] | None = None  # the first segment, on a worker
    result: Future[torch.Tensor] | None = None  # the last segment (decoding), on a worker
    error: GradqError | None = None  # the reduction stopped with this error earlier in the step
    record: StepRecord | None = None  # the step's record its pattern notes its finding in
    name: str = ""


#: Elements up to which a gather is fused into the step's round by default (:func:`fuse_below`)
FUSE_BELOW = 1 << 16
FUSE_ENV = "HVD_GRADQ_FUSE_BELOW"


def fuse_below() -> int:
    """Elements up to which a tensor's gather travels in the round's one collective:
    ``HVD_GRADQ_FUSE_BELOW`` (0: every gather alone), else :data:`FUSE_BELOW`. The same bits
    either way (a request's result is what its own collective would return); the setting must
    be the same on every rank, as the tensors' rounds must."""
    return env_elements(FUSE_ENV, FUSE_BELOW, "no gather is fused")


@dataclass
class Reducer:
    """Drives the patterns for one compressor: its scheme and seed, its error-feedback memory and
    byte counters, and the tensors of the step in flight."""

    scheme: Scheme
    policy: Policy
    seed: int
    memory: Memory
    stats: Stats
    workers: Workers = field(default_factory=lambda: Workers(0))
    codec: str = "auto"  # where payloads are encoded and decoded: :mod:`.device`
    encoding: list[Flow] = field(default_factory=list)  # first segments on a worker, not settled
    flows: list[Flow] = field(default_factory=list)  # a collective out, another to follow
    done: list[Flow] = field(default_factory=list)  # the last collective out, decoding not queued
    decoding: list[Future[torch.Tensor]] = field(default_factory=list)  # the last step's queued decodings
    fusing: list[Flow] = field(default_factory=list)  # fusable alltoalls of this round, not started yet
    rounds: dict[str, int] = field(default_factory=dict)  # fused alltoalls started this step, by scope

    def __post_init__(self) -> None:  # the patterns encode with the policy: its nonfinite=raise applies
        self.config = Config(self.scheme, self.policy)
        self.fuse_below = fuse_below()  # read once: every rank's rounds must hold the same requests
        self.verdicts = StepVerdicts(self.stats.clock)

    def begin_step(self) -> None:
        """At the first ``compress()`` of a step, before anything of it starts: the previous
        step's verdicts read (a CorruptionError on every rank where one names a finding)."""
        self.verdicts.begin_step()

    def start(self, choice: Choice, name: str, step: int, group: core.Group, x: torch.Tensor,
              out: torch.Tensor | None = None) -> Flow:
        """Start the chosen pattern for tensor ``name`` at ``step`` over ``group`` on ``x`` (float32,
        flat, the raw gradient): its first segment, up to its first collective. With error
        feedback the residual is added here, or by a pattern that ``feeds`` (gather, scatter) in
        one pass with its encode.
        ``out``: a flat float32 tensor of ``x``'s size the result may be written into once ``x``
        is read (the gradient's storage, where Horovod sets the gradient to the result), or None.

        The codec keeps this rank's decoded values (own) only where error feedback needs them:
        otherwise a full-size array would wait, for every tensor of the step, from the encode to
        the decode, where decoding the own payload with the others costs the same work."""
        row = table.entry(choice.pattern)
        record = self.verdicts.record(group, name, step)
        red = core.Reduction(self.config, self.seed, hvd.rank(), self.memory, self.stats, HOST, findings=record,
                             fuse_below=self.fuse_below)
        on_dev = device.on_device(self.codec, x) and not row.host_fp32  # host_fp32: pieces on the host
        where = "cpu" if row.host_fp32 else x.device
        if out is not None and (out.device != torch.device(where) or out.dtype != torch.float32
                                or not out.is_contiguous() or out.numel() != x.numel()):
            out = None
        fed = self.policy.ef and row.feeds
        if self.policy.ef and not fed:
            x = self.memory.compensate(name, x)
        part = core.Part(name, step, group, TorchCodec(on_dev, where, own=self.policy.ef), out=out, compensated=not fed)
        if not on_dev and not row.encodes_first:  # the host codec's encode copies to the host itself
            x = x.detach().cpu()
        transport = HorovodTransport(group.process_set, self.stats.clock)
        flow = Flow(row.run(red, part, x, TorchOps(x.device) if on_dev else HOST, choice), transport, group.key,
                    record=record, name=name)
        if row.encodes_first:
            # the job reads x's values; nothing writes the gradient before the step settles the job
            flow.job = self.workers.submit(lambda: self._advance(flow))
            if flow.job.done():  # inline: an unexpected exception is raised here, in compress()
                flow.job.result()
                flow.job = None
                self.flows.append(flow)
            else:
                self.encoding.append(flow)
        else:
            self._advance(flow)
            self.flows.append(flow)
        return flow

    def _advance(self, ctx: Flow) -> None:
        """Wait for the collective in flight (none at the start), run the pattern on to its next
        collective and start that, or leave it for the round's fused alltoall (:meth:`_start_fused`)."""
        got = None if ctx.request is None else ctx.transport.wait(ctx.handle)
        ctx.request = next(ctx.gen) if ctx.request is None else ctx.gen.send(got)
        if isinstance(ctx.request, (core.Alltoall, core.Allgather)) and ctx.request.fuse:
            ctx.handle = None
            self.fusing.append(ctx)
        else:
            ctx.handle = ctx.transport.start(ctx.request)

    def _start_fused(self) -> None:
        """Start the round's fusable alltoalls, one Horovod alltoall a process set, the requests in
        name order (the same on every rank: every rank runs the same tensors' same phases in a
        round), named for the round (``hvd_gradq.<scope>f<k>``, k counted in the step: names that
        come back every step, which Horovod's response cache keeps). Why one:
        :class:`~hvd_gradq.reduce.core.Alltoall`."""
        pending, self.fusing = self.fusing, []
        by_scope: dict[str, list[Flow]] = {}
        for ctx in pending:
            by_scope.setdefault(ctx.scope, []).append(ctx)
        for scope, flows in by_scope.items():
            flows.sort(key=lambda c: c.request.name if c.request is not None else "")
            k = self.rounds.get(scope, 0)
            self.rounds[scope] = k + 1
            requests = [c.request for c in flows if isinstance(c.request, (core.Alltoall, core.Allgather))]
            assert len(requests) == len(flows)
            handles = flows[0].transport.start_fused(requests, collective(scope, Kind.FUSED, "", k))
            for ctx, handle in zip(flows, handles):
                ctx.handle = handle

    def _finish(self, ctx: Flow) -> torch.Tensor:
        """Wait for the last collective and run the pattern to its end: the group's sum (or its
        error, after the stop's barrier when it stops: :func:`hvd_gradq.reduce.core.halt`)."""
        while True:
            got = ctx.transport.wait(ctx.handle)
            try:
                ctx.request = ctx.gen.send(got)
            except StopIteration as stop:
                out: torch.Tensor = stop.value
                return out
            ctx.handle = ctx.transport.start(ctx.request)

    def finish(self, flow: Flow) -> torch.Tensor:
        """Wait for the flow's collectives and return the decoded sum over the group (float32,
        flat); where this rank found corruption in it, the step's CorruptionError instead."""
        self.flush()
        if flow.error is not None:
            raise flow.error
        if flow.result is not None:
            future, flow.result = flow.result, None
            out = future.result()
        else:
            out = self._finish(flow)
        self.verdicts.handed(flow.record, flow.name)
        return out

    def flush(self) -> None:
        """Settle the first segments, run every tensor's phases up to its last collective (one
        round for all tensors at a time) and, with workers, queue their decoding: called at the
        first ``decompress()`` of a step, when every ``compress()`` of that step has run here."""
        encoding, self.encoding = self.encoding, []
        error: GradqError | None = None
        flows = self.flows
        if flows or encoding:  # a new step's rounds: the fused alltoalls' names count from 0 again
            self.rounds.clear()
        for ctx in encoding:
            assert ctx.job is not None
            ctx.job.result()  # an unexpected exception is raised here
            ctx.job = None
            flows.append(ctx)
        # the first phases the step's compress() calls left for one alltoall, once every encoding
        # job has put its own there: a worker's timing must not decide which round a request
        # travels in (every rank fuses the same requests a round, or the ranks' rounds differ)
        self._start_fused()
        self.flows = []
        while flows:  # one phase of every tensor is out before any waits for the next
            later = []
            for ctx in flows:
                assert ctx.request is not None
                if ctx.request.last:
                    self.done.append(ctx)
                    continue
                try:
                    self._advance(ctx)
                except GradqError as e:  # go on with the others: no rank waits for their phases
                    ctx.error, error = e, error or e
                    continue
                later.append(ctx)
            self._start_fused()
            flows = later
        done, self.done = self.done, []
        if self.workers.threads:
            self.decoding = [f for f in self.decoding if not f.done()]
            for ctx in done:
                ctx.result = self.workers.submit(lambda c=ctx: self._finish(c))  # type: ignore[misc]
                self.decoding.append(ctx.result)
        if error is not None:
            raise error

    def forget(self) -> None:
        """Drop the tensors of a step that will not finish (its collectives died with the world),
        once the jobs already on a worker are over, whatever their outcome, so none starts a
        collective later."""
        jobs: list[Future[Any]] = [c.job for c in self.encoding if c.job is not None]
        futures.wait(jobs + self.decoding)
        self.encoding.clear()
        self.flows.clear()
        self.done.clear()
        self.decoding.clear()
        self.verdicts.forget()
        self.fusing.clear()
