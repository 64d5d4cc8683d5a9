"""Per-gradient bookkeeping of the TensorFlow compressor: which slot a gradient belongs to, what
each slot holds (its facts, its choice, its variables) and the compressor's Python-side state.
The variables themselves, and the residual store over them, are :mod:`.store`.

**Keys.** A slot is keyed by the *variable* the gradient belongs to (its ``name``, e.g.
``dense/kernel:0``, read from Horovod's ``allreduce_grads`` by :mod:`.callsite`): freezing or
unfreezing layers, recompiling, or a new training function cannot hand one variable's residual
and random stream to another. Variables that share a name (unnamed ``tf.Variable`` s are all
``Variable:0``, as in Horovod's own tests) are told apart by identity and numbered in the order
the compressor first meets them (``Variable:0``, ``Variable:0#1``...), the same on every rank;
checkpoints of such models restore by that order. Where no variable is known (``compress()`` called by hand
inside a ``tf.function``), the key is the gradient's position among the calls made while
tracing one function graph (``#0``, ``#1``...), as before.
"""
from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from ..errors import GradqError
from ..plan.cpu_cost import Figures
from ..plan.decide import Choice
from ..plan.pattern import Pattern
from .callsite import function_graph
from .store import variable


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
    choice: Choice | None  # None: a tiny tensor passed to Horovod's own allreduce as it is
    step: Any  # tf.Variable int64 scalar
    residual: Any  # tf.Variable float32 (n,) or None
    owner: Any  # tf.Variable int64 scalar (ef) or None
    sent: int  # bytes a rank sends per reduction (model: gather is exact, ring is 2(N-1)/N)
    received: int
    fp32: int

    @property
    def pattern(self) -> Pattern | None:
        """The decided pattern (None: Horovod's own fp32 allreduce)."""
        return None if self.choice is None else self.choice.pattern


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

    def position_key(self) -> str:
        """The key of a gradient without a known variable: its position in this trace."""
        g = function_graph()
        i = self.positions.get(g, 0)
        self.positions[g] = i + 1
        return f"#{i}"

    def scale(self) -> Any:
        """The loss scale now (float32 scalar tensor), or None without ``loss_scale``."""
        ls = self.loss_scale
        if ls is None:
            return None
        return tf.cast(ls() if callable(ls) and not isinstance(ls, tf.Variable) else ls, tf.float32)

    def one(self) -> Any:
        """Horovod's operand ``[1.0]``, read from a variable. A constant there would be folded by
        Grappler, which runs Horovod's allreduce of it while optimizing the graph and bakes the
        result in: a rank that retraces alone (a ragged last batch, a new input shape) then runs
        that collective alone while the others do not, and the job hangs (seen at 2 ranks)."""
        if self._one is None:
            self._one = variable(np.ones((1,), np.float32), "hvd_gradq_one")
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
