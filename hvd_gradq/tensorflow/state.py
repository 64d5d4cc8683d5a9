"""Per-gradient state of the TensorFlow compressor: which slot a gradient belongs to, and the
``tf.Variable`` s each slot holds.

**Keys.** A slot is keyed by the *variable* the gradient belongs to (its ``name``, e.g.
``dense/kernel:0``, read from Horovod's ``allreduce_grads`` by :mod:`.callsite`): freezing or
unfreezing layers, recompiling, or a new training function cannot hand one variable's residual
and random stream to another. Variables that share a name (unnamed ``tf.Variable`` s are all
``Variable:0``, as in Horovod's own tests) are told apart by identity and numbered in the order
the compressor first meets them (``Variable:0``, ``Variable:0#1``...), the same on every rank;
checkpoints of such models restore by that order. Where no variable is known (``compress()`` called by hand
inside a ``tf.function``), the key is the gradient's position among the calls made while
tracing one function graph (``#0``, ``#1``...), as before.

**Variables.** Per slot, created once under ``tf.init_scope`` (so a slot first reached in a
later trace, a new training function after ``compile()``, still works): ``steps[key]`` (int64,
the random stream's position), and with ``ef`` ``residuals[key]`` (float32, in *unscaled* units
when the compressor has a ``loss_scale``) and ``owners[key]`` (int64, the rank whose residual it
is), under the scatter pattern also those two for its reduced chunk (``<key>#reduce``). They
live in dicts tracked by the ``tf.Module``, so ``tf.train.Checkpoint`` saves them under the
variable's name and restores them when the slot is created (restore before the first trace) or
at once (restore later).

**Checkpoints and ranks.** Horovod's recipe saves on rank 0 and restores on every rank. A
residual is one rank's own rounding error: a rank that restores another rank's residual (its
``owners`` entry differs from its rank) uses zero in its place at the next step (a one-step
bias, as a fresh start has) and keeps its step counter; a rank that restores its own file
resumes exactly.
"""
from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from ..errors import GradqError
from ..plan.cpu_cost import Figures
from ..plan.pattern import Pattern


@dataclass
class Slot:
    """What one gradient holds: static facts and its variables."""

    index: int  # creation order: the number in collective names, the seed's stream
    key: str  # the variable's name, or "#<position>"
    ident: Any  # the variable's identity (None for position keys)
    shape: tuple[int, ...]
    dtype: str
    n: int
    size: int  # the process set's size it was made for
    pattern: Pattern | None  # None: a tiny tensor passed to Horovod's own allreduce as it is
    step: Any  # tf.Variable int64 scalar
    residual: Any  # tf.Variable float32 (n,) or None
    owner: Any  # tf.Variable int64 scalar (ef) or None
    sent: int  # bytes a rank sends per reduction (model: gather is exact, ring is 2(N-1)/N)
    received: int
    fp32: int


class Bookkeeping:
    """A compressor's Python-side state, kept out of TF's object tracking (the compressor, a
    ``tf.Module``, tracks only its checkpointed variables): the slots by key, the keys by
    variable identity (:func:`variable_key`), position keys per function graph being traced,
    the eager call count, the CPU figures of the process set being reduced, and the
    constructor's ``loss_scale``."""

    def __init__(self, loss_scale: Any) -> None:
        self.slots: dict[str, Slot] = {}
        self.keys: dict[Any, str] = {}  # variable identity -> its key (see variable_key)
        # compress() calls without a known variable so far in each function graph being traced
        self.positions: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.eager_calls = 0
        self.agreed: Figures | None = None  # the CPU figures of the process set being reduced now
        self.loss_scale = loss_scale
        self._one: Any = None

    def one(self) -> Any:
        """Horovod's operand ``[1.0]``, read from a variable. A constant there would be folded by
        Grappler, which runs Horovod's allreduce of it while optimizing the graph and bakes the
        result in: a rank that retraces alone (a ragged last batch, a new input shape) then runs
        that collective alone while the others do not, and the job hangs (seen at 2 ranks)."""
        if self._one is None:
            self._one = _variable(np.ones((1,), np.float32), "hvd_gradq_one")
        return self._one.read_value()


def variable_key(variable: Any, known: dict[Any, str]) -> tuple[str, Any]:
    """(key, identity) of a variable: its name; a second variable of a name already taken
    (unnamed ``tf.Variable`` s are all ``Variable:0``) gets ``<name>#<k>``, numbered in the
    order the compressor first meets them (the same on every rank). ``known`` maps identities
    to keys and is updated."""
    ident = getattr(variable, "_unique_id", None)
    ident = ident if ident is not None else id(variable)
    key = known.get(ident)
    if key is None:
        name = str(getattr(variable, "name", "") or "") or "unnamed"
        taken = set(known.values())
        key, k = name, 0
        while key in taken:
            k += 1
            key = f"{name}#{k}"
        known[ident] = key
    return key, ident


def _variable(initial: Any, name: str) -> Any:
    """A variable created eagerly from a NumPy value (a tensor made in the trace cannot be lifted),
    once per slot, even while a later trace of a ``tf.function`` runs: Horovod caches its
    reduction function on the compressor, so a compressor reused for a new model (or new
    trainable variables) meets them in a retrace, where ``tf.Variable(...)``
    refuses ("only supports singleton tf.Variables created on the first call"). The guard is a
    variable-creator scope that only ``tf.Variable`` itself consults; a ``ResourceVariable`` built
    directly under ``init_scope`` is the same kind of variable, made once and captured by reference."""
    with tf.init_scope():
        return resource_variable_ops.ResourceVariable(initial, trainable=False, name=name)


class SlotStore:
    """Residuals in the slots' ``tf.Variable`` s: a :class:`hvd_gradq.feedback.Store` for graphs.

    ``read`` gives zero where another rank owns the variable (it was restored from that rank's
    checkpoint, see the module docstring); ``write`` makes this rank its owner. There is no
    ``forget``: a graph cannot undo a step (:class:`~hvd_gradq.feedback.Memory` ``undo=False``).

    An owner residual's variable is as wide as the widest chunk or piece on any rank
    (:func:`make_residual`): ``read`` gives its first elements, as many as ``like`` has, and
    ``write`` zero-pads this rank's to the variable's width."""

    def __init__(self, residuals: dict[str, Any], owners: dict[str, Any], rank: int) -> None:
        self.residuals, self.owners, self.rank = residuals, owners, rank

    def read(self, key: str, like: Any) -> Any:
        var = self.residuals.get(key)
        if var is None:
            return None
        mine = tf.equal(self.owners[key].read_value(), self.rank)
        value = var.read_value()
        n = int(like.shape[0])
        if n < int(var.shape[0]):
            value = value[:n]
        return tf.where(mine, value, tf.zeros_like(like))

    def write(self, key: str, value: Any) -> None:
        var = self.residuals[key]
        pad = int(var.shape[0]) - int(value.shape[0])
        var.assign(tf.pad(value, [[0, pad]]) if pad > 0 else value)
        self.owners[key].assign(tf.constant(self.rank, tf.int64))

    def forget(self, key: str) -> None:
        raise GradqError("a TensorFlow graph cannot undo a residual; Memory(undo=False) never asks")


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in key)


def make_variables(key: str, n: int, ef: bool, rank: int) -> tuple[Any, Any, Any]:
    """(step, residual, owner) for a new slot, created outside any graph being traced."""
    step = _variable(np.int64(0), f"hvd_gradq_step_{_safe(key)}")
    if not ef:
        return step, None, None
    return (step, *make_residual(key, n, rank))


def make_residual(key: str, n: int, rank: int) -> tuple[Any, Any]:
    """(residual, owner) of ``n`` elements: a slot's, or the scatter pattern's reduced chunk's
    (key ``<key>#reduce``, :func:`hvd_gradq.feedback.reduced_key`)."""
    residual = _variable(np.zeros((n,), np.float32), f"hvd_gradq_residual_{_safe(key)}")
    return residual, _variable(np.int64(rank), f"hvd_gradq_owner_{_safe(key)}")


def check_slot(slot: Slot, key: str, shape: tuple[int, ...], dtype: str, size: int) -> None:
    """Raise if a gradient does not fit the slot found for it."""
    if slot.shape != shape or slot.dtype != dtype:
        raise GradqError(
            f"gradient {key} has shape {list(shape)} ({dtype}); the compressor's slot was made for "
            f"{list(slot.shape)} ({slot.dtype}). Use one compressor per model / gradient list")
    if slot.size != size:
        raise GradqError(
            f"gradient {key} is reduced over {size} ranks; its slot was made for {slot.size}: use one "
            "compressor per process set")


def describe(slots: Iterable[Slot]) -> list[dict[str, Any]]:
    """One entry per slot: key, shape, dtype, pattern, steps so far, bytes per step."""
    return [{"index": s.index, "key": s.key, "shape": list(s.shape), "dtype": s.dtype,
             "pattern": s.pattern.value if s.pattern else "fp32",
             "steps": int(s.step.numpy()), "sent": s.sent, "received": s.received, "fp32": s.fp32}
            for s in slots]
