"""The TensorFlow compressor's first-step check of the step counters: ranks whose restored state
disagrees stop with hvd_gradq's error, not Horovod's.

Horovod's recipe restores a checkpoint on rank 0 and broadcasts from there; a compressor restored
on rank 0 only leaves the others with fresh step counters unless ``compression.broadcast_state``
follows. With warm-up, rank 0 then takes the compressed branch of a tensor while rank 1 takes the
exact one, and they wait in collectives the other never starts; without, rank 1's random streams
and residuals silently restart. PyTorch compares the ranks' counters in its first ``compress()``
(:mod:`hvd_gradq.torch.resume`); the comparison and its message are shared
(:func:`hvd_gradq.frontend.resume.compare`), and so is when a counter counts: a slot that never
stepped holds 0 here, a tensor never seen holds none in PyTorch, so a 0 counts as none.

**When.** Not while tracing: the slots' counters are variables that a trace creates one tensor
at a time, and a checkpoint restored before the trace fills each as it is created (a restore's
deferred values), or ``broadcast_state`` after the trace. So every op of a ``compress()`` (its
gradient's identity, its counter's increment, Horovod's operand) waits for a :meth:`FirstStep.gate`:
a ``tf.cond`` on a variable that is true until the check has passed, whose true branch is a
``tf.py_function`` that runs the check once for the compressor, eagerly (one small allgather of a
digest of every counter as it stands, which no slot has moved yet), and waits for it in every other
slot. After it, each step reads one boolean a slot. The check runs on every rank that reduces
over the global process set (whatever its ``check_ranks``, as the handshake), once at more than
one rank; not in elastic jobs (Horovod's ``state.sync()`` aligns the counters there) nor for
reductions over other process sets.

**How it fails.** The py_function raises the RankMismatchError on every rank (every rank read the
same rows): TensorFlow reports it as the step's error, with the message, and every later step
raises it again (the variable stays true). Every op of the compressor for that step waited for
the gate, so no collective of it was started on one rank only.
"""
from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..frontend.resume import compare
from ..reduce import names
from ..reduce.names import Kind
from .store import variable

#: How to resume, in TensorFlow's words (PyTorch's: :data:`hvd_gradq.frontend.resume.FIX`).
FIX = ("After restoring a checkpoint on rank 0 only, trace the training step on every rank (e.g. "
       "step.get_concrete_function(x, y): it makes the compressor's variables and restores them) and call "
       "compression.broadcast_state(root_rank=0) on every rank (beside hvd.broadcast_variables); or restore the same "
       "checkpoint on every rank")


class FirstStep:
    """One compressor's first-step check (module docstring). ``armed``: it is still to build;
    ``scope``: the compressor's collective prefix (``<cid>.``); ``warmup``: its policy's, for the
    message."""

    def __init__(self, armed: bool, scope: str, warmup: int) -> None:
        self.armed, self.scope, self.warmup = armed, scope, warmup
        self._lock = threading.Lock()
        self._ran = False
        self._error: BaseException | None = None
        self._pending: Any = None  # tf.Variable(bool): true until the check has passed

    def gate(self, steps: Mapping[str, Any], process_set: Any, size: int) -> list[Any]:
        """The control inputs of every op a ``compress()`` makes while a graph is traced (its
        gradient's identity first: Horovod's own allreduce of a tensor passed through must wait
        too), the check where it runs (see the module docstring), else none; ``steps``: the
        compressor's counters, read when the check runs."""
        if not self.armed or size <= 1 or process_set is not hvd.global_process_set or tf.executing_eagerly():
            return []
        if self._pending is None:
            self._pending = variable(np.bool_(True), "hvd_gradq_resume_pending")

        def check() -> Any:
            self._run(steps)
            return tf.constant(True)

        done = tf.cond(self._pending.read_value(), lambda: tf.py_function(check, [], tf.bool,
                                                                           name="hvd_gradq_resume"),
                       lambda: tf.constant(True))
        return [done]

    def _run(self, steps: Mapping[str, Any]) -> None:
        """The check, once a process whatever the slot that gets here first; its error, raised in
        every slot and every step after it."""
        with self._lock:
            if not self._ran:
                self._ran = True
                try:
                    before = {k: n for k, v in steps.items() if (n := int(v.numpy())) > 0}
                    compare(before, self._allgather, self.warmup, FIX)
                    self._pending.assign(False)
                except BaseException as e:  # raised below, here and in every later call
                    self._error = e
            if self._error is not None:
                raise self._error

    def _allgather(self, obj: Any, phase: int | None) -> Any:
        return hvd.allgather_object(obj, name=names.collective(self.scope, Kind.RESUME, phase=phase))
