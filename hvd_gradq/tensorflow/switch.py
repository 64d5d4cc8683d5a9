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
* :data:`FP32`: Horovod's allreduce (Sum) of the tensor;
* :data:`PLAIN16`, :data:`PLAIN32`: the same, where a gradient with error feedback holds no
  residual to deliver (below): nothing but Horovod's allreduce.

Horovod's own allreduce still reduces the compressor's ``[1.0]`` whichever branch ran (its
operand is fixed when traced), which scales the sum as Horovod's call asks
(:func:`hvd_gradq.frontend.compressor.final_scale`): for 2 ranks the FP16/FP32 results are stock
Horovod's bits; beyond, the average is taken in float32 after the sum, where Horovod scales
inside its op. Tensors the cost model leaves to Horovod's fp32 (too small to gain, no static
shape) keep that operand under every plan: it is fixed when traced.

**The index** comes from one small host callback a traced function (:meth:`Switch.index`, in
the function graph around Horovod's ``tf.cond`` s: :func:`.callsite.function_graph`; each
gradient's branch captures its output), which TensorFlow runs once at every call of the
function: that is the step's start. It hands the trial the clock and, where the trial asks,
exchanges the step times (:meth:`hvd_gradq.frontend.compressor.CompressorCore.trial_step`: an
eager allgather, bounded as the handshake is), and returns every switched gradient's branch for
the step (the plan's choice for it, :func:`hvd_gradq.plan.trial.plan_choice`); a gradient takes
:data:`WARM` instead while its own step counter is in the warm-up. Every collective of a
gradient's branches waits for the callback, so none starts before the exchange, and every rank
takes the same branches (the plan follows agreed numbers only). One callback a step, not one a
gradient: a callback between a gradient and its collective is a scheduling point of TensorFlow's
executor on the step's critical path (measured: ~0.2 ms a gradient on MobileNetV2-like).

**Horovod's operand** is the compressor's ``[1.0]`` read from its variable, whichever branch
runs, so that Horovod reduces every gradient's ``[1.0]`` as soon as the step starts (fused in one
allreduce) instead of after each branch; only where ``[1.0]`` carries a gradient's NaN to every
rank (:func:`operand_carries_nan`) is it the branch's.

**Error feedback across a switch** is PyTorch's rule (:meth:`hvd_gradq.feedback.Memory.flush`):
the FP16 and FP32 branches send the gradient plus every residual it holds (its own, and the owner
residuals of its pattern, each on its slice), which then hold zero (:meth:`.store.SlotStore.clear`
in the branch; where the sum is not finite, a skipped step, all are kept). That is a step's
worth of small operations a gradient (read, add, check, select, write: each a parallel region of
TensorFlow's pool), so only the first step of an fp16/fp32 run pays it: the next ones take the
PLAIN branches, which touch no residual, and are stock Horovod's allreduce and nothing else
(:meth:`Switch._pick`: a gradient whose previous step was fp16/fp32 delivered what it held then).
A residual that is still there (that step's sum was not finite, or a checkpoint restored one)
is held, never dropped, until the gradient compresses again. For that, a gradient keeps its
residual in its branches (:func:`plain_branches`), the COMPRESSED branch included (its update
reads the branch's own sum), not in ``decompress()``, whose update would run under every plan.
Where Horovod's ``[1.0]`` carries another rank's NaN (:func:`operand_carries_nan`) only
``decompress()`` knows whether the step's result is finite: there the residual is kept there,
and an fp16/fp32 step always flushes.

**Bytes**: the callback counts each gradient's steps by branch, and the telemetry prices each
branch's steps with that branch's bytes (:meth:`Switch.rows`); a warm-up step counts as the
compressed branch, as in a gradient that is not switched (its static bytes times its steps).
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..feedback import Memory
from ..frontend.compressor import CompressorCore, Gather
from ..plan.decide import Choice, fp16_cost, fp32_cost
from ..plan.pattern import Pattern
from ..policy import Policy
from ..reduce.stats import Stats
from ..schemes.level import LevelScheme
from ..schemes.options import NonFinite
from ..schemes.plain import FP16Scheme, NoneScheme
from ..schemes.scheme import Scheme
from .callsite import function_graph
from .slots import Slot
from .store import SlotStore

#: The branches of a switched gradient, in ``tf.switch_case``'s order (:data:`PLAIN16` and
#: :data:`PLAIN32` only where it keeps its residual in its branches: :func:`plain_branches`).
WARM, COMPRESSED, FP16, FP32, PLAIN16, PLAIN32 = 0, 1, 2, 3, 4, 5
_OF = {Pattern.FP16: FP16, Pattern.FP32: FP32}
_PLAIN = {FP16: PLAIN16, FP32: PLAIN32}
#: What each branch's bytes are priced as (a plain step sends what its flushing twin sends).
_PRICED = {WARM: COMPRESSED, COMPRESSED: COMPRESSED, FP16: FP16, FP32: FP32, PLAIN16: FP16, PLAIN32: FP32}


def operand_carries_nan(scheme: Scheme, policy: Policy) -> bool:
    """Whether Horovod's ``[1.0]`` carries a gradient's NaN/Inf to every rank: a scheme without
    per-bucket scales to carry it (``nonfinite=propagate``), where the whole tensor goes NaN."""
    return policy.nonfinite is not NonFinite.RAISE and not isinstance(scheme, (LevelScheme, NoneScheme, FP16Scheme))


def plain_branches(scheme: Scheme, policy: Policy, slot: Slot | None) -> bool:
    """Whether a branched gradient keeps its residual in its branches and has the PLAIN ones: it
    has error feedback, and its branch's own sum says whether the step's result is finite
    (Horovod's ``[1.0]`` carries no other rank's NaN: :func:`operand_carries_nan`)."""
    return slot is not None and slot.residual is not None and not operand_carries_nan(scheme, policy)


@dataclass
class _Function:
    """One traced function's switched gradients and the process set they are reduced over."""

    key: Any
    size: int
    local: int
    gather: Gather | None
    slots: list[Slot] = field(default_factory=list)
    plans: Any = None  # the callback's output: the branch of each slot (by index) this step


class Switch:
    """The branch of each switched gradient at each step (module docstring), for one compressor
    (``core``: its trial, plan and warm-up; ``stats``: the decisions ``stats()`` shows)."""

    def __init__(self, core: CompressorCore, stats: Stats) -> None:
        self.core, self.stats = core, stats
        self._lock = threading.Lock()
        self._functions: weakref.WeakKeyDictionary[Any, _Function] = weakref.WeakKeyDictionary()
        self._counts: dict[str, list[int]] = {}  # steps a priced branch (_PRICED), per gradient
        self._last: dict[str, int] = {}  # each gradient's branch at its last step
        self._plain: set[str] = set()  # the gradients with PLAIN branches (plain_branches)

    def applies(self, slot: Slot | None, variable: Any) -> bool:
        """Whether a gradient is switched: ``auto`` measures, Horovod's gradient reduction handed
        it over (``variable`` known) and the cost model compresses it (``slot.choice``)."""
        return (self.core.trial is not None and slot is not None and variable is not None and slot.n > 0
                and slot.choice is not None and slot.choice.pattern not in (Pattern.FP16, Pattern.FP32))

    def index(self, slot: Slot, process_set: Any, size: int, local: int, gather: Gather | None, step: Any,
              plain: bool) -> Any:
        """The branch (a scalar int32 tensor) of ``slot``'s gradient this step, ``step`` being its
        counter before this step; ``gather``: the exchange's allgather over ``process_set``
        (:func:`.handshake.gatherer`, made eagerly); ``plain``: it has PLAIN branches. Made while
        the gradient's branch is traced."""
        if plain:
            self._plain.add(slot.key)
        g = function_graph()
        fn = self._functions.get(g)
        if fn is None:
            fn = self._functions[g] = _Function(process_set.process_set_id, size, local, gather)
            with g.as_default(), tf.control_dependencies(None):  # the function's own op, no branch's
                fn.plans = tf.numpy_function(lambda: self._start(fn), [], tf.int32, stateful=True,
                                             name="hvd_gradq_plans")
        fn.slots.append(slot)
        warm = step < self.core.policy.warmup
        plan = tf.reshape(tf.gather(fn.plans, slot.index), ())  # fn.plans: captured into the branch
        return tf.where(warm, WARM, plan)

    def _start(self, fn: _Function) -> np.ndarray[Any, Any]:
        """A step of ``fn`` starts: the trial's step, then each of its gradients' branch."""
        with self._lock:
            self.core.trial_step(fn.key, fn.size, fn.gather)
            out = np.full(max(s.index for s in fn.slots) + 1, COMPRESSED, np.int32)
            for slot in fn.slots:
                out[slot.index] = self._pick(slot, fn)
        return out

    def _pick(self, slot: Slot, fn: _Function) -> int:
        assert slot.choice is not None
        size = fn.size
        choice = self.core.planned(slot.key, slot.n, len(slot.shape), size, fn.local, slot.choice)
        branch = _OF.get(choice.pattern, COMPRESSED)
        shown = choice if branch != COMPRESSED else Choice(slot.choice.pattern, self.core.warm_note(slot.choice))
        self.stats.decide(slot.key, shown.pattern.value, shown.why, slot.n, size)
        self._counts.setdefault(slot.key, [0, 0, 0, 0])[branch] += 1
        if branch in _PLAIN and slot.key in self._plain and _PRICED.get(self._last.get(slot.key, WARM)) in _PLAIN:
            branch = _PLAIN[branch]  # its previous step, fp16 or fp32, delivered what it held
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
            COMPRESSED: lambda: (slot.choice.pattern.value if slot.choice else "", slot.sent, slot.received),
            FP16: lambda: ("fp16", *_sizes(fp16_cost(slot.n, slot.size))),
            FP32: lambda: ("fp32", *_sizes(fp32_cost(slot.n, slot.size))),
        }
        last = _PRICED[last]
        order = [b for b in (COMPRESSED, FP16, FP32) if b != last] + [last]
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
                 scale: Callable[[], Any], dtype: Any, name: str, process_set: Any, own_here: bool) -> Branch:
    """:data:`FP16` (``dtype`` float16) or :data:`FP32`: the gradient plus every residual it
    holds (``owned``: the owner residuals of its compressed pattern, each on its slice:
    :func:`hvd_gradq.reduce.table.owned`) summed by Horovod, then those residuals zero unless the
    sum is not finite; the own one here too where ``own_here`` (:func:`plain_branches`), else by
    ``decompress``'s update (``own == x``)."""
    def branch() -> tuple[Any, ...]:
        x = flat
        if slot.residual is not None:
            memory.begin_step(scale())
            x = memory.flush(slot.key, flat, owned, forget=False)
        total = _sum(x, dtype, name, process_set)
        kept = tf.logical_not(tf.reduce_all(tf.math.is_finite(total)))
        cleared = [key for key, _, _ in owned] if slot.residual is not None else []
        for key in [slot.key] + cleared if own_here else cleared:
            store.clear(key, kept)
        return total, tf.ones((1,), tf.float32), x, x
    return branch


def measured(memory: Memory, store: SlotStore, slot: Slot, flat: Any, owned: Sequence[tuple[str, int, int]],
             scale: Callable[[], Any], name: Callable[[int], str], process_set: Any, kept: bool) -> list[Branch]:
    """The branches after :data:`COMPRESSED`: :data:`FP16` and :data:`FP32` (:func:`uncompressed`),
    and where the gradient keeps its residual in its branches (``kept``: :func:`plain_branches`)
    :data:`PLAIN16` and :data:`PLAIN32` (:func:`plain`), on the same collectives, ``name(bits)``
    (a branch not taken runs none)."""
    sums = ((tf.float16, name(16)), (tf.float32, name(32)))
    out = [uncompressed(memory, store, slot, flat, owned, scale, dtype, n, process_set, kept) for dtype, n in sums]
    return out + [plain(flat, dtype, n, process_set) for dtype, n in sums] if kept else out


def plain(flat: Any, dtype: Any, name: str, process_set: Any) -> Branch:
    """:data:`PLAIN16` (``dtype`` float16) or :data:`PLAIN32`: Horovod's allreduce of the
    gradient alone; every residual stays as it is (the gradient keeps them in its branches)."""
    return lambda: (_sum(flat, dtype, name, process_set), tf.ones((1,), tf.float32), flat, flat)
