"""A Horovod ``Compressor`` for ``horovod.tensorflow`` that is real on the wire, built in the graph.

Horovod (0.28.1) calls ``compress()`` / ``decompress()`` while it traces the gradient reduction
(``DistributedGradientTape``, ``horovod.tensorflow.keras.DistributedOptimizer``; even eager tapes
are reduced inside a ``tf.function`` Horovod makes), each inside ``tf.cond(size() > 1, reduce,
identity)``. Everything here is therefore graph ops (summable: :class:`.ops.TFOps`; gather: the
host's code, :mod:`.host`), bit-identical to the NumPy reference.

**The call.** No name, op or process set reaches a compressor; :mod:`.callsite` reads them from
Horovod's calling frames: ``op`` (``Adasum``, ``Min``, ``Max``, ``Product`` are refused: only a
sum or an average of decoded payloads is served), the pre/post scale factors, the process set
(every collective here runs on it, with its rank and size; a constructor ``process_set=`` must
agree) and the variable of the gradient. **State** is keyed by that variable (see
:mod:`.slots` and :mod:`.store`: per slot a step counter, and with ``ef`` a residual and the rank that owns it,
``tf.Variable`` s tracked by this ``tf.Module`` for ``tf.train.Checkpoint``). Collective names
are ``hvd_gradq.<name>.<kind>.<i>[.p<set>]`` (:mod:`hvd_gradq.reduce.names`), ``i`` the slot's
creation order, identical on every rank; ``<name>`` is ``name=`` or ``c<k>`` for the k-th compressor this process built,
which the one-time configuration check (an eager allgather on the process set) compares.

**Patterns** (the reduction core's, looked up in its table: :mod:`hvd_gradq.reduce.table`;
started in ``compress``, finished in ``decompress`` by :mod:`.reduce`): ``gather`` (host-made
payloads ``hvd.allgather`` ed, each decoded in rank order), ``summable`` (a shared table agreed
by a Max-allreduce, int32 code lanes Sum-allreduced), ``scatter`` (per-chunk payloads
alltoall'ed, each rank's chunk summed, re-encoded finer with its residual ``<key>#reduce`` and
allgathered), ``hierarchical`` (fp32 sums inside a host, each owner's piece reduced among
hosts; the residual variables of the owned parts sized by the table); ``auto``: the cost model
(:func:`hvd_gradq.plan.decide.decide`, bytes at ``link_gbps`` against CPU) picks each tensor's
pattern; a tensor it would not gain on, or without a static shape, goes to Horovod's own allreduce
(whose fusion makes a sum's bits beyond 2 ranks depend on what it fused: ``HOROVOD_FUSION_THRESHOLD=0``
or ``pattern=gather`` reproduce runs bit for bit); then, with ``fallback`` on, it measures its plans
in the job (:mod:`hvd_gradq.plan.trial`): the gradients switch between compressed, Horovod's fp16
and fp32 by a ``tf.switch_case`` a gradient (:mod:`.switch`). Horovod's ``[1.0]`` scales the result
as in PyTorch (:func:`hvd_gradq.frontend.compressor.final_scale`).

**Warm-up** (``warmup=K``): the first K steps of each variable's gradient are an exact fp32
sum (``hvd.allreduce``, named ``w<i>``), chosen by a ``tf.switch_case`` on the slot's step counter.
**Not compressed.** ``tf.IndexedSlices`` (embeddings): Horovod allgathers them itself, unless
``sparse_as_dense=True``. **Non-finite values** (``nonfinite=propagate``, as Horovod carries
infs): a level scheme's bucket holding NaN/Inf on any rank decodes to NaN on every rank (its
scale sent as NaN; summable: +inf statistics); ``none`` and ``fp16`` carry the values; other
schemes make Horovod's ``[1.0]`` NaN, the whole tensor. Error feedback keeps its previous
residual wherever the result is not finite (``loss_scale=`` keeps residuals unscaled).
``nonfinite=raise`` stops the step on every rank with an ``InvalidArgumentError`` that says so
(the rank with NaN takes part, with a poison payload or +inf statistics, so no rank waits for
that tensor; another's may: docs/usage.md); ``nonfinite=skip`` is refused (sizes are traced). **Elastic**:
eager steps in the world of the moment (:mod:`.elastic`). **Resuming**: ranks whose counters differ stop.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar, cast

import horovod.tensorflow as hvd
import horovod.tensorflow.mpi_ops as mpi_ops
import numpy as np
import tensorflow as tf

from .. import reduce as core
from ..errors import GradqError
from ..feedback import Memory
from ..frontend.compressor import CompressorCore, ranks_on_host
from ..frontend.guards import check_tensor, instance_only
from ..frontend.measured import Measured
from ..frontend.membership import host_count, membership, ranks_a_host
from ..plan.decide import Choice, fp32_cost
from ..plan.pattern import Pattern
from ..plan.rank_cost import rank_cost
from ..reduce import names, table
from ..reduce.names import Kind, Streams
from ..schemes.options import NonFinite
from ..spec import SchemeLike
from ..wire.payload import DTYPE_CODES, MAX_NDIM
from . import codec, handshake, reduce, residuals, resume, switch, telemetry
from . import elastic as tf_elastic
from .callsite import check_op, horovod_call_site, set_suffix
from .context import Ctx
from .ops import TF
from .slots import Bookkeeping, Slot, check_slot, describe, variable_key
from .store import SlotStore, broadcast_state, make_residual, make_variables
from .transport import GraphCodec, words

_F = TypeVar("_F", bound=Callable[..., Any])


def _no_convert(f: _F) -> _F:
    """Keep AutoGraph out of hvd_gradq's code (plain Python control flow on static values)."""
    return cast(_F, tf.autograph.experimental.do_not_convert(f))


class GradqCompressor(tf.Module, CompressorCore):  # type: ignore[misc]
    """Compress gradients with a hvd_gradq scheme inside Horovod's TensorFlow reductions.

    Args:
        scheme: the scheme and its policy (``hvd_gradq.parse("orq:levels=5,ef=true")``; a scheme alone: its default).
        seed: base seed of the rounding noise; draws differ across ranks, steps and tensors.
        pattern: ``auto`` (cost model), ``gather``, ``summable``, ``scatter`` or ``hierarchical``.
        link_gbps: the link rate (Gbit/s) ``auto`` weighs bytes with against encoding and decoding
            time. Default: ``HVD_GRADQ_LINK_GBPS``, else 10.
        fallback: ``auto`` measures its plans in the job and runs the fastest (:mod:`hvd_gradq.plan.trial`,
            ``stats()['auto']``); False: the cost model's plan. Default ``HVD_GRADQ_FALLBACK``, else on.
        check_ranks: at the first trace, compare the ranks' configurations (eagerly, by digest) and
            raise RankMismatchError on every rank naming the fields if they disagree. Every rank
            takes part whatever it says, and the check stops the job if any rank asks for it
            (False on every rank: a warning). Each wait is bounded by ``HVD_GRADQ_HANDSHAKE_TIMEOUT``.
        name: the collectives' name prefix (letters, digits, ``_.-``); default ``c<k>`` for the
            k-th compressor built in this process (same on every rank when they build the same).
        process_set: the Horovod process set; by default the one Horovod's call names (they
            must agree when both are given). Needed only when ``compress()`` is called by hand.
        loss_scale: the current loss scale (a callable returning it, or a ``tf.Variable``) when
            gradients arrive scaled (mixed precision): residuals are stored divided by it.
        threads: host codec threads a tensor (:mod:`hvd_gradq.frontend.workers`). Default:
            ``HVD_GRADQ_THREADS``, else this rank's cores.
        log_every: log the first-step line's figures again every this many steps, on rank 0
            (:mod:`hvd_gradq.log`). Default: ``HVD_GRADQ_LOG_EVERY``, else 0 (off).
    """

    FRONTEND, WORLD_NAME, CONFIG_TAG = "hvd_gradq.tensorflow", "tensorflow", "tf"
    MEASURES = True  # auto times its plans in the job: a tf.switch_case a gradient (.switch)
    #: Patterns with collectives started in ``decompress()``, after a decode that may raise
    UNPOISONABLE = frozenset({Pattern.SCATTER, Pattern.HIERARCHICAL})
    UNPOISONABLE_WHY = ("its later phases start in decompress(), and a step that stops on one tensor's values could "
                        "leave another tensor's later phase started on some ranks only (a TF graph cannot hold back "
                        "its other ops)")

    def __init__(self, scheme: SchemeLike, *, seed: int = 0, pattern: str | Pattern = "auto",
                 check_ranks: bool = True, name: str | None = None, process_set: Any = None, loss_scale: Any = None,
                 link_gbps: float | None = None, threads: int | None = None, fallback: bool | None = None,
                 log_every: int | None = None) -> None:
        tf.Module.__init__(self, name="hvd_gradq_compressor")
        handshake.check_frontend()
        CompressorCore.__init__(self, scheme, seed=seed, pattern=pattern, check_ranks=check_ranks,
                                process_set=process_set, link_gbps=link_gbps, threads=threads, fallback=fallback,
                                local_size=ranks_on_host(hvd), log_every=log_every)
        self.cid = handshake.check_arguments(self.settings, loss_scale, name)
        self.steps: dict[str, Any] = {}  # tracked: checkpoint keys steps/<variable name>
        self.residuals: dict[str, Any] = {}  # residuals/<variable name> (ef only), unscaled
        self.owners: dict[str, Any] = {}  # owners/<variable name>: the rank whose residual it is
        self._host = Bookkeeping(loss_scale)
        self._store = SlotStore(self.residuals, self.owners, hvd.rank())
        self.memory = Memory(TF, self._store, undo=False, variant=self.policy.feedback)
        self._switch = switch.Switch(self, self._stats)
        self._telemetry = telemetry.Telemetry(self._stats, self.world, self._host.slots.values, self.log_every,
                                              self._switch.rows)
        self._elastic = tf_elastic.attach(self, self.cid)
        self._measured = self._new_measured()  # not in an elastic job
        self._resume = resume.FirstStep(self._elastic is None, f"{self.cid}.", self.policy.warmup)  # elastic: sync()

    # -- the core's hooks (frontend/compressor.py) -----------------------------------------------
    def _scope(self) -> str:
        return str(self.cid)  # the collectives' prefix: part of what ranks compare

    def _ranks(self) -> int | None:
        return int(hvd.size()) if hvd.is_initialized() else None

    def _ranks_a_host(self) -> int:
        return ranks_a_host(hvd, mpi_ops._basics, hvd.global_process_set) if hvd.is_initialized() else 1

    def _intra_op_threads(self) -> int | None:
        return int(tf.config.threading.get_intra_op_parallelism_threads())

    def _new_measured(self) -> Measured:
        if getattr(self, "_elastic", None) is not None:  # its steps run eagerly, outside the traced switch
            return Measured(None, "not measured in an elastic job (hvd.elastic): the cost model decides")
        return super()._new_measured()

    def _hosts(self) -> int | None:
        return host_count(hvd, mpi_ops._basics) if hvd.is_initialized() else None

    def _check_ranks(self, ps: Any, size: int, local: int) -> None:
        """The handshake over ``ps``, eagerly (even while a graph is being traced)."""
        with tf.init_scope():
            self.handshake(ps.process_set_id, size, local, handshake.gatherer(ps), handshake.fp16_round_trip)

    def _choice_for(self, n: int, ndim: int, size: int, local: int) -> Choice | None:
        """A tensor's choice (:meth:`CompressorCore.decide`); None: Horovod's fp32."""
        choice = self.decide(n, ndim, size, local, self._host.agreed)
        return None if choice.pattern is Pattern.FP32 else choice

    def _slot(self, shape: tuple[int, ...], dtype: str, variable: Any, size: int, local: int,
              key: str | None = None) -> Slot:
        """The slot of this gradient: by its variable, else by its position in this trace."""
        h = self._host
        if variable is not None:
            key, ident = variable_key(variable, h.keys)
        else:
            key, ident = key or self._host.position_key(), None
        slot = h.slots.get(key)
        if slot is not None:
            check_slot(slot, key, shape, dtype, size)
            return slot
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        decided = self.decide(n, len(shape), size, local, self._host.agreed)
        choice = None if decided.pattern is Pattern.FP32 else decided
        self._stats.decide(key, decided.pattern.value, self.warm_note(decided), n, size)
        c = rank_cost(self.scheme, n, len(shape), size, local, hvd.rank(), choice)
        step, residual, owner = self.steps.get(key), self.residuals.get(key), self.owners.get(key)
        if step is None:  # elastic: a new world's slot keeps its variables (tf_elastic.new_world)
            step, residual, owner = make_variables(key, n, self.policy.ef, hvd.rank())
            if self._elastic is not None and (synced := self._elastic.step_of(key)) is not None:
                step.assign(synced)
        self.steps[key] = step
        if residual is not None:
            self.residuals[key] = residual
            self.owners[key] = owner
            if choice is not None and choice.pattern is not Pattern.FP16:
                # the scatter side's, or the hierarchical owner's pieces: sized by the core's table
                group = core.Group(hvd.rank(), size, "", local)
                for rk, width in table.owner_residuals(choice, True, key, n, self.scheme.bucket, group):
                    if rk not in self.residuals:  # kept across an elastic reset in the same world
                        self.residuals[rk], self.owners[rk] = make_residual(rk, width, hvd.rank())
        h.slots[key] = slot = Slot(len(h.slots), key, ident, shape, dtype, n, size, choice, step, residual, owner,
                                   c.sent, c.received, fp32_cost(n, size).sent)
        return slot

    # -- Horovod's interface -------------------------------------------------------------------
    @instance_only
    @_no_convert
    def compress(self, tensor: Any) -> tuple[Any, Any]:
        check_tensor(tensor, "hvd_gradq.tensorflow")  # before Horovod: a torch tensor means the wrong frontend
        site = horovod_call_site(tensor)
        if isinstance(tensor, tf.IndexedSlices):  # Horovod allgathers these itself
            return tensor, None
        check_op(site)
        ps = self.reduction_set(site.process_set, hvd.global_process_set)
        member = membership(mpi_ops._basics, ps)
        if not member.included:  # Horovod traces the reduction on every rank; this branch never runs here
            return tensor, None
        if self._elastic is not None and not tf.executing_eagerly():
            return self._elastic.trace(tf.convert_to_tensor(tensor), site, ps)
        with tf.control_dependencies(gate := self._resume.gate(self.steps, ps, member.size)):  # nothing before it
            return self._compress_at(tf.identity(tensor) if gate else tensor, site, ps, member)

    def _compress_at(self, tensor: Any, site: Any, ps: Any, member: Any, key: str | None = None,
                     host: bool = False) -> tuple[Any, Any]:
        size, prank = member.size, member.rank
        tensor = tf.convert_to_tensor(tensor)
        if not tensor.dtype.is_floating:
            raise GradqError(f"hvd_gradq compresses floating-point gradients, not {tensor.dtype.name}")
        dtype = tensor.dtype.name
        if dtype not in DTYPE_CODES:
            raise GradqError(f"gradient dtype {dtype} is not supported; valid: {', '.join(DTYPE_CODES)}")
        if not tensor.shape.is_fully_defined():
            vshape = getattr(site.variable, "shape", None)
            if vshape is None or not vshape.is_fully_defined():
                return tensor, Ctx(-1, (), tensor.dtype, 0, None)  # no static size: Horovod's own allreduce
            tensor = tf.ensure_shape(tensor, vshape)
        shape = TF.shape(tensor)
        if len(shape) > MAX_NDIM:
            raise GradqError(f"a gradient of {len(shape)} dimensions; at most {MAX_NDIM}")
        local = ranks_a_host(hvd, mpi_ops._basics, ps)
        if ps.process_set_id not in self._checked:
            self._check_ranks(ps, size, local)
        self._host.agreed = self.agreed(ps.process_set_id)  # what _pattern_for prices with
        slot = None
        if tf.executing_eagerly() and not host:
            if self.policy.ef:
                raise GradqError("error feedback needs to know which variable a gradient belongs to, and an eager "
                                 "hvd.allreduce(t, compression=...) does not say: reduce gradients with "
                                 "DistributedGradientTape / DistributedOptimizer (Horovod traces those) or inside a "
                                 "tf.function")
            key = f"e{self._host.eager_calls}"
            step: Any = self._host.eager_calls
            self._host.eager_calls += 1
            n = int(np.prod(shape, dtype=np.int64)) if shape else 1
            choice = self._choice_for(n, len(shape), size, local)
            index, stream = -1, Streams(self.seed, hvd.rank(), "eager")  # stepped by the call count
        else:
            slot = self._slot(shape, dtype, site.variable, size, local, key)
            key, n, choice, index = f"{slot.index}", slot.n, slot.choice, slot.index
            step = slot.step.assign_add(1, read_value=True) - 1
            stream = Streams(self.seed, hvd.rank(), key)  # the seeds' one rule (reduce/names.py)
        ctx = Ctx(index, shape, tensor.dtype, n, choice, size, prank, slot=slot, step=step, local=local)
        pattern = ctx.pattern
        with self._telemetry.recording(step):  # counts the step; the host functions' time (stats)
            if pattern is None or pattern is Pattern.FP16:  # Horovod's own allreduce: fp32, or fp16 as stock
                return codec.horovod_operand(tensor, pattern is Pattern.FP16), ctx
            switched = self._switch.applies(slot, site.variable)
            if slot is not None and n > 0 and (self.policy.warmup > 0 or switched):
                return self._branched(tensor, ctx, step, stream, key, ps, switched)
            return self._start(tensor, ctx, step, stream, key, ps), ctx

    def _start(self, tensor: Any, ctx: Ctx, step: Any, stream: Streams, key: str, ps: Any) -> Any:
        """Start the pattern's collectives on ``tensor`` (+ its residual); returns Horovod's operand."""
        n, shape, slot = ctx.n, ctx.shape, ctx.slot
        one = self._host.one()  # a variable's [1.0]: Grappler would fold a constant operand (see Bookkeeping.one)
        if n == 0:
            return one
        flat = tf.reshape(tf.cast(tensor, tf.float32), (n,))
        assert ctx.choice is not None
        row = table.entry(ctx.choice.pattern)
        fed = residuals.fed(self.memory, self.policy, self.scheme, ctx.slot, row, flat, self._host.scale(),
                            ctx.branched)
        x = flat if fed is not None else residuals.compensate(self.memory, ctx.slot, flat, self._host.scale())
        ctx.what = f"gradient {slot.key if slot is not None else '#' + key} {list(shape)}"
        raw = x  # the summable pattern decides on NaN/Inf itself (the core's summable)
        if self.policy.nonfinite is NonFinite.RAISE:
            # Failing here, before the collective, would leave the other ranks waiting for this
            # rank's payload forever. Instead the collective goes ahead with a signal (a poison
            # payload, or +inf statistics) and every rank fails after it, with the same message.
            ctx.finite = tf.reduce_all(tf.math.is_finite(x))
            x = tf.where(ctx.finite, x, tf.zeros_like(x))
        elif switch.operand_carries_nan(self.scheme, self.policy):
            # no per-bucket scale to carry a NaN: Horovod's [1.0] does, for the whole tensor
            finite = tf.reduce_all(tf.math.is_finite(x))
            one = tf.where(finite, one, tf.fill((1,), float("nan")))
            x = tf.where(tf.math.is_finite(x), x, tf.zeros_like(x))
        ctx.x = x
        ef = slot is not None and slot.residual is not None
        codec = GraphCodec(ctx.size, ctx.what, ef, ctx.finite, (shape, ctx.dtype.name) if row.whole else None)
        group = core.Group(ctx.rank, ctx.size, f"{self.cid}.", ctx.local, ps)
        part = core.Part(f"{key}{set_suffix(ps)}", step, group, codec, slot.key if slot is not None else "",
                         lambda tag: words(stream(tag), step), ctx.what, compensated=fed is None)
        ctx.flow = reduce.begin(ctx.choice, self.scheme, ef, raw if row.raw else x, part, fed)
        ctx.result = ctx.flow.handle  # the first collective's result: a tensor of the graph, as callers may want it
        return one

    def _branched(self, tensor: Any, ctx: Ctx, step: Any, stream: Streams, key: str, ps: Any,
                  switched: bool) -> tuple[Any, Any]:
        """The gradient reduced by a branch of a ``tf.switch_case`` (:mod:`.switch`): ``warmup=K``'s
        exact fp32 sum while the slot's step is below K, else the pattern, started and finished in
        its branch, or where ``auto`` measures (``switched``) Horovod's fp16 or fp32, as the
        trial's plan says. Every rank takes the same branch (their counters and figures agree).
        Error feedback is written in the branches (:func:`.switch.plain_branches`) or in ``decompress``."""
        flat = tf.reshape(tf.cast(tensor, tf.float32), (ctx.n,))
        ctx.kept = switch.plain_branches(self.scheme, self.policy, ctx.slot)

        def named(kind: Kind, phase: int | None = None) -> str:
            return names.collective(f"{self.cid}.", kind, f"{key}{set_suffix(ps)}", phase)

        def compressed() -> tuple[Any, ...]:
            inner = dataclasses.replace(ctx, branched=True)  # the branch's tensors stay in the branch
            one = self._start(tensor, inner, step, stream, key, ps)
            total, own = self._finish(inner)
            own = inner.x if own is None else own
            if ctx.kept:  # the sum is finite where the result is: Horovod's [1.0] carries no NaN here
                residuals.keep(self.memory, inner, own, total, self._host.scale())
            return total, one, inner.x, own

        branches = [lambda: switch.exact(flat, named(Kind.WARM), ps), compressed]
        if switched:
            assert ctx.slot is not None and ctx.choice is not None
            owned = table.owned(ctx.choice, ctx.slot.key, ctx.n, self.scheme.bucket,
                                core.Group(ctx.rank, ctx.size, "", ctx.local))
            branches += switch.measured(self.memory, self._store, ctx.slot, flat, owned, self._host.scale,
                                        lambda bits: named(Kind.PLAN, bits), ps, ctx.kept)
            with tf.init_scope():
                gather = handshake.gatherer(ps)
            index = self._switch.index(ctx.slot, ps, ctx.size, ctx.local, gather, step, ctx.kept)
        else:
            index = tf.cast(step >= self.policy.warmup, tf.int32)
        ctx.total, one, ctx.x, ctx.own = (tf.ensure_shape(t, s) for t, s in zip(
            tf.switch_case(index, branches), ((ctx.n,), (1,), (ctx.n,), (ctx.n,)), strict=True))
        ctx.warm = tf.equal(index, switch.WARM)
        return one if switch.operand_carries_nan(self.scheme, self.policy) else self._host.one(), ctx

    @_no_convert
    def decompress(self, tensor: Any, ctx: Any) -> Any:
        if ctx is None:  # IndexedSlices, or a rank outside the process set: untouched
            return tensor
        if isinstance(ctx, tf_elastic.Traced):
            return ctx.finish(tensor)
        if not isinstance(ctx, Ctx):
            raise GradqError("decompress() got a context hvd_gradq did not make")
        if ctx.pattern is None or ctx.pattern is Pattern.FP16:  # fp16: hvd.Compression.fp16's cast back
            return tf.cast(tensor, ctx.dtype)
        if ctx.n == 0:
            return tf.zeros(ctx.shape, ctx.dtype)
        if ctx.warm is not None:
            out, own = ctx.total, ctx.own
        else:
            with self._telemetry.timing(ctx.step):
                out, own = self._finish(ctx)
        # Horovod's [1.0] came back as v = post * op(pre * 1): the result is out * v / N, written
        # as out / N (v == 1) and out (v == N) so that the plain cases keep their bits.
        out = codec.final_scale(ctx.n, ctx.size)(out, tf.reshape(tensor, (-1,))[0])
        if not ctx.kept:
            residuals.keep(self.memory, ctx, own, out, self._host.scale())
        return tf.cast(tf.reshape(out, ctx.shape), ctx.dtype)

    def _finish(self, ctx: Ctx) -> tuple[Any, Any]:
        """(sum over ranks, this rank's own decoded payload, or None where it was used already).
        The owner residuals a pattern keeps (scatter's, hierarchical's) are written here, through
        the compressor's memory."""
        assert ctx.flow is not None and ctx.choice is not None
        owners = ctx.slot is not None and table.keeps_owners(ctx.choice, self.policy.ef)
        if owners:
            self.memory.begin_step(self._host.scale())
        out = tf.ensure_shape(ctx.flow.finish(self.memory if owners else None), (ctx.n,))
        return out, ctx.flow.own

    # -- state and accounting ----------------------------------------------------------------------
    def broadcast_state(self, root_rank: int = 0) -> None:
        """Rank ``root_rank``'s step counters and residuals for every rank, after a trace made them
        (a checkpoint restored there only; each other rank's residuals start from zero): :mod:`.store`."""
        broadcast_state(self.steps, self.residuals, self.owners, root_rank)

    def slots(self) -> list[dict[str, Any]]:
        """One entry per gradient (creation order): key, shape, dtype, pattern, steps, bytes per step."""
        return describe(self._host.slots.values())
