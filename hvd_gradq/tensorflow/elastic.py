"""Elastic Horovod for the TensorFlow compressor: a reduction that runs in the world of the moment.

**Why it differs from PyTorch.** Horovod's elastic recipe keeps running the graphs it traced before
a reset (the training ``tf.function``, Keras' ``train_function``): only Horovod's own ops read the
world at run time (``size_op()``). The compressor's graph would hold the world it was traced in:
payload sizes, the ranks it decodes, each tensor's pattern, this rank's chunk. So in an elastic job
(:func:`hvd_gradq.frontend.elastic.active`) the traced graph holds one ``tf.py_function`` per
gradient (:meth:`Elastic.trace`), and the whole reduction runs inside it, eagerly, when the graph
runs: the compressor's usual code (patterns, payloads, error feedback, warm-up) with the size,
rank, ranks a host and decisions of the world current at that step, and Horovod's ``[1.0]``
reduced there too (so its scale factors and a NaN marker act as without elastic). A
``tf.function`` runs stateful ops in program order, which these functions are, so every rank
starts the tensors' collectives in the same order (eager collectives block: another order on two
ranks would wait for ever). The cost is Python's: an eager step, not a traced one.

**State** follows :mod:`hvd_gradq.frontend.elastic`'s rules, as in PyTorch. Horovod 0.28.1's
TensorFlow states (``TensorFlowKerasState``, ``TensorFlowState``, Keras' ``KerasState``) have no
handler registry, so the first compressor built in an elastic job wraps their ``save``,
``restore`` and ``on_reset`` (once, calling Horovod's own first) to do the same for every live
hvd_gradq compressor of the process: ``commit()`` copies residuals, owners and step counters;
``restore()`` puts them back (a residual made after the commit goes back to zero); a reset marks
the compressor for a sync. The sync itself happens at the first reduction of the new world, inside
the host function, where every rank of that world is sure to be (a rank that joined may build its
compressor only when it first traces its step, after Horovod's own ``sync()``, and a fresh
compressor always syncs): rank 0's generation + 1, step counters and seed for every rank (so a
joining rank's warm-up and streams agree), then the new world: decisions made again, the rank
check run again, collective names under the new generation, owner residuals dropped where the
world changed, this rank's worker residuals kept and stamped with its new rank.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import horovod.tensorflow as hvd
import horovod.tensorflow.mpi_ops as mpi_ops
import numpy as np
import tensorflow as tf

from ..errors import GradqError
from ..feedback import Memory
from ..frontend import elastic
from ..frontend.elastic import Generation, World
from ..frontend.membership import membership
from ..reduce import names
from ..reduce.names import Kind
from .slots import Bookkeeping
from .store import SlotStore

if TYPE_CHECKING:
    from .callsite import CallSite

class Host(Protocol):
    """What the elastic side reads and resets of its compressor (:class:`.compressor.GradqCompressor`
    is one; this module names no compressor class, so the two modules do not import each other)."""

    cid: str
    seed: int
    memory: Memory
    steps: dict[str, Any]
    residuals: dict[str, Any]
    owners: dict[str, Any]
    _host: Bookkeeping

    def forget_handshakes(self) -> None: ...

    def decompress(self, tensor: Any, ctx: Any) -> Any: ...

    def _compress_at(self, tensor: Any, site: Any, ps: Any, member: Any, key: str | None = None,
                     host: bool = False) -> tuple[Any, Any]: ...


_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()  # the Elastic of every compressor of this process
_WRAPPED: list[type] = []
_CALLS = {"save": "commit", "restore": "restore", "on_reset": "reset"}  # Horovod's state method -> Elastic's


def world() -> World:
    """Horovod's world as this rank sees it now."""
    return elastic.world_of(hvd)


@dataclass
class Traced:
    """The context ``compress()`` hands Horovod in an elastic job: the finished reduction."""

    out: Any

    def finish(self, v: Any) -> Any:
        # Horovod's own [1.0] was reduced in the graph too: keep it (the same collectives on every
        # rank, whatever TF would prune) and return what the eager reduction gave
        with tf.control_dependencies([v]):
            return tf.identity(self.out)


@dataclass
class Saved:
    residuals: dict[str, np.ndarray[Any, Any]]
    owners: dict[str, int]
    steps: dict[str, int]
    made_in: World | None


@dataclass(eq=False)
class Elastic:
    """One TensorFlow compressor's elastic side (see the module docstring)."""

    c: Host
    base: str  # the compressor's name without a generation
    generation: Generation = field(default_factory=Generation)
    made_in: World | None = None
    saved: Saved | None = None
    synced_steps: dict[str, int] = field(default_factory=dict)  # rank 0's, for slots made after sync()
    pending: bool = True  # sync at the next reduction: a fresh compressor, or a reset since

    # -- the trace ----------------------------------------------------------------------------
    def trace(self, tensor: Any, site: CallSite, ps: Any) -> tuple[Any, Traced]:
        """What ``compress()`` builds in an elastic job: one host function that reduces ``tensor``
        when the graph runs, in that moment's world."""
        if ps.process_set_id != 0:
            raise GradqError("hvd_gradq.tensorflow in an elastic job reduces over the global process set only "
                             "(Horovod re-forms the world at each reset); drop process_set=")
        if not tensor.shape.is_fully_defined():
            raise GradqError("hvd_gradq.tensorflow in an elastic job needs gradients of a static shape")
        key = None if site.variable is not None else self.c._host.position_key()
        shape, dtype = tensor.shape, tensor.dtype

        def reduce(x: Any) -> Any:  # the compressor's own path, eagerly, and Horovod's [1.0] reduced here
            self.begin_step()
            c = self.c
            one, ctx = c._compress_at(x, site, ps, membership(mpi_ops._basics, ps), key, host=True)
            v = hvd.allreduce(one, op=site.op, prescale_factor=site.prescale, postscale_factor=site.postscale,
                              name=names.collective(f"{c.cid}.", Kind.VALUE, str(ctx.slot_index)),
                              ignore_name_scope=True, process_set=ps)
            return c.decompress(v, ctx), tf.ones((1,), tf.float32)

        def run(x: Any) -> Any:
            try:
                return reduce(x)
            except tf.errors.UnknownError as e:
                if "Horovod" not in e.message:
                    raise
                # A peer failed mid-collective. Horovod's elastic.run turns an UnknownError into a
                # reset only when it names one of its graph ops; an alltoall (scatter) does not.
                text = f"HorovodAllreduce (hvd_gradq, elastic): {e.message}"
                raise tf.errors.UnknownError(e.node_def, e.op, text) from e

        # Horovod's operand comes out of the host function too: a constant [1.0] would be folded
        # by Grappler, which runs Horovod's allreduce while it optimizes the graph (once, in the
        # world of the first step) and bakes its value in; a rank that joins later would fold
        # alone and wait for ever.
        out, one = tf.py_function(run, [tensor], [dtype, tf.float32], name="hvd_gradq_elastic")
        return tf.ensure_shape(one, (1,)), Traced(tf.ensure_shape(out, shape))

    # -- at each reduction ----------------------------------------------------------------------
    def begin_step(self) -> None:
        """Before each reduction: the first one after a reset (or of a fresh compressor) takes rank
        0's generation, steps and seed, here, where every rank of the new world is (a rank that
        joined may build its compressor only when it first traces its step, after Horovod's own
        ``sync()``); a world change that no reset announced counts as one too."""
        now = world()
        if self.pending or (self.generation.world is not None and self.generation.world != now):
            self.pending = False
            self.sync()

    # -- Horovod's state calls -------------------------------------------------------------------
    def commit(self) -> None:
        c = self.c
        self.saved = Saved({k: v.numpy().copy() for k, v in c.residuals.items()},
                           {k: int(v.numpy()) for k, v in c.owners.items()},
                           {k: int(v.numpy()) for k, v in c.steps.items()}, self.made_in)

    def restore(self) -> None:
        s, c = self.saved, self.c
        if s is None:
            return
        for k, var in c.residuals.items():
            var.assign(s.residuals[k] if k in s.residuals and s.residuals[k].shape == tuple(var.shape)
                       else np.zeros(var.shape, np.float32))
        for k, var in c.owners.items():
            var.assign(s.owners.get(k, hvd.rank()))
        for k, var in c.steps.items():
            var.assign(s.steps.get(k, 0))
        self.made_in = s.made_in

    def reset(self) -> None:
        """Horovod re-formed the world (``state.on_reset()``): sync at the next reduction."""
        self.pending = True

    def sync(self) -> None:
        c = self.c
        steps = {k: int(v.numpy()) for k, v in c.steps.items()}
        number, self.synced_steps, c.seed = elastic.agree(hvd, f"hvd_gradq.elastic.sync.{self.base}",
                                                          self.generation.number, steps, c.seed)
        for k, var in c.steps.items():
            if k in self.synced_steps:
                var.assign(self.synced_steps[k])
        self.new_world(number, world())

    # -- a new world ------------------------------------------------------------------------------
    def new_world(self, number: int, now: World) -> None:
        """Forget the old world's decisions; apply the residual rule for ``now``."""
        c = self.c
        self.generation = Generation(number, now)
        c.cid = f"{self.generation.prefix()}{self.base}"
        c._host.slots.clear()
        c.forget_handshakes()
        store = c.memory.store
        assert isinstance(store, SlotStore)
        store.rank = now.rank  # whose residuals this rank reads as its own
        kept, dropped = elastic.carry_over(list(c.residuals), self.made_in, now)
        for k in dropped:
            del c.residuals[k]
            del c.owners[k]
        for k in kept:  # this rank's own error, whatever its new number
            c.owners[k].assign(now.rank)
        elastic.log_carry_over(dropped, kept, self.made_in, now)
        self.made_in = now

    def step_of(self, key: str) -> int | None:
        """Rank 0's step counter for a slot this rank makes after a sync (a rank that joined)."""
        return self.synced_steps.get(key)


def attach(c: Host, base: str) -> Elastic | None:
    """The compressor's elastic side in an elastic job (None elsewhere); wraps Horovod's TF states once."""
    if not elastic.active():
        return None
    e = Elastic(c, base)
    _LIVE.add(e)
    _wrap_states()
    return e


def _wrap_states() -> None:
    from horovod.tensorflow import elastic as hvd_elastic

    for cls in (hvd_elastic.TensorFlowKerasState, hvd_elastic.TensorFlowState):
        if cls in _WRAPPED:
            continue
        _WRAPPED.append(cls)
        for name in _CALLS:
            setattr(cls, name, _also(getattr(cls, name), name))


def _also(original: Any, name: str) -> Any:
    def method(self: Any) -> None:
        original(self)
        for e in list(_LIVE):
            getattr(e, _CALLS[name])()

    method.__name__ = name
    method.__doc__ = f"{original.__doc__ or ''}\n\n(hvd_gradq: also {name}s the TensorFlow compressors' state.)"
    method.__wrapped__ = original  # type: ignore[attr-defined]
    return method

