"""The TensorFlow compressor's residual store: the ``tf.Variable`` s a slot holds (:mod:`.slots`)
and :class:`SlotStore`, error feedback's :class:`hvd_gradq.feedback.Store` over them. PyTorch's
twin is :mod:`hvd_gradq.torch.store`.

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
resumes exactly. Restored on rank 0 only (Horovod's habit), the variables reach the other ranks
through :func:`broadcast_state` (``compression.broadcast_state(root_rank=0)``), or Horovod's
``hvd.broadcast_variables(compression.variables, root_rank=0)`` (the ``tf.Module``'s variables:
the same ones), once a trace has made them: every rank then holds rank 0's step counters and
owners, so rank 0 keeps its residuals and the others start theirs from zero.
"""
from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from ..errors import GradqError


def variable(initial: Any, name: str) -> Any:
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
        masked = self.read_masked(key, like)
        if masked is None:
            return None
        value, mine = masked
        return tf.where(mine, value, tf.zeros_like(like))

    def read_masked(self, key: str, like: Any) -> tuple[Any, Any] | None:
        """(the variable's first ``like``-many elements, whether this rank owns it), or None:
        :meth:`read` without its ``where``, for a host pass that takes the choice in."""
        var = self.residuals.get(key)
        if var is None:
            return None
        mine = tf.equal(self.owners[key].read_value(), self.rank)
        value = var.read_value()
        n = int(like.shape[0])
        if n < int(var.shape[0]):
            value = value[:n]
        return value, mine

    def write(self, key: str, value: Any) -> None:
        var = self.residuals[key]
        pad = int(var.shape[0]) - int(value.shape[0])
        var.assign(tf.pad(value, [[0, pad]]) if pad > 0 else value)
        self.owners[key].assign(tf.constant(self.rank, tf.int64))

    def clear(self, key: str, hold: Any) -> None:
        """Zero ``key``'s residual unless ``hold`` (a scalar bool tensor: a skipped step keeps it)."""
        var = self.residuals.get(key)
        if var is not None:
            var.assign(tf.where(hold, var.read_value(), tf.zeros_like(var)))

    def forget(self, key: str) -> None:
        raise GradqError("a TensorFlow graph cannot undo a residual; Memory(undo=False) never asks")


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in key)


def make_variables(key: str, n: int, ef: bool, rank: int) -> tuple[Any, Any, Any]:
    """(step, residual, owner) for a new slot, created outside any graph being traced."""
    step = variable(np.int64(0), f"hvd_gradq_step_{_safe(key)}")
    if not ef:
        return step, None, None
    return (step, *make_residual(key, n, rank))


def make_residual(key: str, n: int, rank: int) -> tuple[Any, Any]:
    """(residual, owner) of ``n`` elements: a slot's, or the scatter pattern's reduced chunk's
    (key ``<key>#reduce``, :func:`hvd_gradq.feedback.reduced_key`)."""
    residual = variable(np.zeros((n,), np.float32), f"hvd_gradq_residual_{_safe(key)}")
    return residual, variable(np.int64(rank), f"hvd_gradq_owner_{_safe(key)}")


def broadcast_state(steps: dict[str, Any], residuals: dict[str, Any], owners: dict[str, Any], root_rank: Any) -> None:
    """Rank ``root_rank``'s step counters, residuals and owners for every rank (a collective:
    Horovod's ``broadcast_variables``, in the same order on every rank). The variables exist once
    Horovod has traced the reduction: before that there is nothing to send, and a silent no-op
    would leave the ranks' counters apart, so it is refused."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or not 0 <= root_rank < hvd.size():
        raise GradqError(f"root_rank must be a rank of this job (0 to {hvd.size() - 1}), not {root_rank!r}")
    if not steps:
        raise GradqError(
            "the compressor has no state to broadcast yet: its variables are made when Horovod first traces the "
            "reduction. Trace the training step first (step.get_concrete_function(x, y) on every rank, which also "
            "restores a checkpoint's values into them), then call broadcast_state")
    hvd.broadcast_variables([d[k] for d in (steps, residuals, owners) for k in sorted(d)], root_rank=root_rank)
