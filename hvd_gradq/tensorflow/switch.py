"""``auto``'s measured plans in a TensorFlow graph (:mod:`hvd_gradq.plan.trial`): which branch
each gradient takes, step by step.

Horovod traces the reduction once, so a plan that changes from one step to the next is chosen
inside the graph. Each gradient that Horovod's gradient reduction hands over (its variable is
known: a direct ``hvd.allreduce`` keeps the cost model's pattern, as in PyTorch) and that the
cost model compresses is reduced by a ``tf.switch_case`` of these branches, one of which runs at
each step (the compressor builds them: ``GradqCompressor._branched``):

* :data:`WARM`: the policy's warm-up, Horovod's exact fp32 sum, residuals held;
* :data:`COMPRESSED`: the pattern the cost model chose, started and finished in its branch;
* :data:`FP16`: Horovod's allreduce (Sum) of the float16 cast, cast back: ``hvd.Compression.fp16``'s
  bytes through Horovod's own op and fusion buffer;
* :data:`FP32`: Horovod's allreduce (Sum) of the tensor.

Horovod's own allreduce still reduces the compressor's ``[1.0]`` whichever branch ran (its
operand is fixed when traced), which scales the sum as Horovod's call asks
(:func:`hvd_gradq.frontend.compressor.final_scale`): for 2 ranks the FP16/FP32 results are stock
Horovod's bits; beyond, the average is taken in float32 after the sum, where Horovod scales
inside its op. Tensors the cost model leaves to Horovod's fp32 (too small to gain, no static
shape) keep that operand under every plan: it is fixed when traced.

**The index** comes from one small host callback a gradient (:meth:`Switch.index`), run once the
gradient exists (PyTorch reads the plan at the gradient's ``compress()``). Under a lock, the first
callback of a step (the first after one of the same gradient: the previous step is over) is the
step's start: it hands the trial the clock and, where the trial asks, exchanges the step times
(:meth:`hvd_gradq.frontend.compressor.CompressorCore.trial_step`: an eager allgather, bounded as
the handshake is); the others wait for it and read the plan it set. Every collective of a
gradient's branches waits for its callback, so none starts before the exchange, and every rank
takes the same branches (the plan follows agreed numbers only). The branch is the plan's choice
for the gradient (:func:`hvd_gradq.plan.trial.plan_choice`), or :data:`WARM` at a warm-up step.

**Error feedback across a switch** is PyTorch's rule (:meth:`hvd_gradq.feedback.Memory.flush`):
the FP16 and FP32 branches send the gradient plus every residual it holds (its own, and the owner
residuals of its pattern, each on its slice), which then hold zero: the own one through
``decompress()``'s update (as after a warm-up step), the owner residuals in the branch
(:meth:`.store.SlotStore.clear`); where the sum is not finite (a skipped step) all are kept.

**Bytes**: the callback counts each gradient's steps by branch, and the telemetry prices each
branch's steps with that branch's bytes (:meth:`Switch.rows`).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..feedback import Memory
from ..frontend.compressor import CompressorCore, Gather
from ..plan.decide import Choice, fp16_cost, fp32_cost
from ..plan.pattern import Pattern, in_warmup, warmup_why
from ..reduce.stats import Stats
from .slots import Slot
from .store import SlotStore

#: The branches of a switched gradient, in ``tf.switch_case``'s order.
WARM, COMPRESSED, FP16, FP32 = 0, 1, 2, 3
_OF = {Pattern.FP16: FP16, Pattern.FP32: FP32}


class Switch:
    """The branch of each switched gradient at each step (module docstring), for one compressor
    (``core``: its trial, plan and warm-up; ``stats``: the decisions ``stats()`` shows)."""

    def __init__(self, core: CompressorCore, stats: Stats) -> None:
        self.core, self.stats = core, stats
        self._lock = threading.Lock()
        self._seen: set[str] = set()  # gradients whose callback ran in this step
        self._counts: dict[str, list[int]] = {}  # steps a branch, per gradient
        self._last: dict[str, int] = {}  # each gradient's branch at its last step

    def applies(self, slot: Slot | None, variable: Any) -> bool:
        """Whether a gradient is switched: ``auto`` measures, Horovod's gradient reduction handed
        it over (``variable`` known) and the cost model compresses it (``slot.choice``)."""
        return (self.core.trial is not None and slot is not None and variable is not None and slot.n > 0
                and slot.choice is not None and slot.choice.pattern not in (Pattern.FP16, Pattern.FP32))

    def index(self, slot: Slot, process_set: Any, size: int, local: int, gather: Gather | None, step: Any,
              gradient: Any) -> Any:
        """The branch (a scalar int32 tensor) of ``slot``'s gradient at ``step`` (its counter
        before this step), read once ``gradient`` exists; ``gather``: the exchange's allgather
        over ``process_set`` (:func:`.handshake.gatherer`, made eagerly)."""
        def pick(s: np.ndarray[Any, Any]) -> np.int32:
            return np.int32(self._pick(slot, process_set.process_set_id, size, local, gather, int(s)))

        with tf.control_dependencies([gradient]):
            branch = tf.numpy_function(pick, [step], tf.int32, stateful=True, name="hvd_gradq_plan")
        return tf.reshape(branch, ())

    def _pick(self, slot: Slot, key: Any, size: int, local: int, gather: Gather | None, step: int) -> int:
        assert slot.choice is not None
        with self._lock:  # one step start, whichever gradient's callback runs first
            if not self._seen or slot.key in self._seen:
                self._seen.clear()
                self.core.trial_step(key, size, gather)
            self._seen.add(slot.key)
            choice = self.core.planned(slot.key, slot.n, len(slot.shape), size, local, slot.choice)
            model = slot.choice.pattern
            if in_warmup(self.core.policy, step):
                branch, shown = WARM, Choice(Pattern.FP32, warmup_why(self.core.policy, step, model))
            else:
                branch = _OF.get(choice.pattern, COMPRESSED)
                shown = choice if branch != COMPRESSED else Choice(model, self.core.warm_note(slot.choice))
            self.stats.decide(slot.key, shown.pattern.value, shown.why, slot.n, size)
            self._counts.setdefault(slot.key, [0, 0, 0, 0])[branch] += 1
            self._last[slot.key] = branch
        return branch

    def rows(self, slot: Slot, counted: bool) -> list[tuple[str, int, int, int]] | None:
        """(pattern, bytes sent, received, steps) of each branch ``slot``'s gradient ran, the
        last one's last (None: not switched, or not yet run). ``counted``: every step so far;
        else the last step's branch once (what the log's one step says)."""
        with self._lock:
            counts, last = list(self._counts.get(slot.key, ())), self._last.get(slot.key)
        if last is None:
            return None
        assert slot.choice is not None
        priced: dict[int, Callable[[], tuple[str, int, int]]] = {
            WARM: lambda: ("fp32", *_sizes(fp32_cost(slot.n, slot.size))),
            COMPRESSED: lambda: (slot.choice.pattern.value if slot.choice else "", slot.sent, slot.received),
            FP16: lambda: ("fp16", *_sizes(fp16_cost(slot.n, slot.size))),
            FP32: lambda: ("fp32", *_sizes(fp32_cost(slot.n, slot.size))),
        }
        order = [b for b in (WARM, COMPRESSED, FP16, FP32) if b != last] + [last]
        return [(*priced[b](), counts[b] if counted else 1) for b in order if (counts[b] if counted else b == last)]


def _sizes(cost: Any) -> tuple[int, int]:
    return int(cost.sent), int(cost.received)


Branch = Callable[[], tuple[Any, ...]]


def _sum(x: Any, dtype: Any, name: str, process_set: Any) -> Any:
    """Horovod's own allreduce (Sum) of ``x`` as ``dtype``, named (a collective's name never
    depends on a branch taken), back in float32."""
    total = hvd.allreduce(tf.cast(x, dtype), op=hvd.Sum, name=name, ignore_name_scope=True, process_set=process_set)
    return tf.cast(total, tf.float32)


def exact(flat: Any, name: str, process_set: Any) -> tuple[Any, ...]:
    """:data:`WARM`'s outputs (sum, Horovod's operand, x, own): the exact fp32 sum, every
    residual held (``decompress`` keeps them: ``x == own`` and the step is a warm one)."""
    return _sum(flat, tf.float32, name, process_set), tf.ones((1,), tf.float32), flat, flat


def uncompressed(memory: Memory, store: SlotStore, slot: Slot, flat: Any, owned: Sequence[tuple[str, int, int]],
                 scale: Callable[[], Any], dtype: Any, name: str, process_set: Any) -> Branch:
    """:data:`FP16` (``dtype`` float16) or :data:`FP32`: the gradient plus every residual it
    holds (``owned``: the owner residuals of its compressed pattern, each on its slice:
    :func:`hvd_gradq.reduce.table.owned`) summed by Horovod, then those residuals zero unless the
    sum is not finite (the own one by ``decompress``'s update: ``own == x``)."""
    def branch() -> tuple[Any, ...]:
        x = flat
        if slot.residual is not None:
            memory.begin_step(scale())
            x = memory.flush(slot.key, flat, owned, forget=False)
        total = _sum(x, dtype, name, process_set)
        kept = tf.logical_not(tf.reduce_all(tf.math.is_finite(total)))
        for key, _, _ in owned if slot.residual is not None else ():
            store.clear(key, kept)
        return total, tf.ones((1,), tf.float32), x, x
    return branch
