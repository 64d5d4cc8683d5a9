"""Error feedback in a TensorFlow graph (:class:`hvd_gradq.feedback.Memory` over the slots'
variables): where a gradient's residual is added, and how the new one is kept once the step's
result is known.

Two ways, chosen per tensor when its graph is traced:

* **in the pattern's encode** (:func:`fed`): the gather and scatter patterns take the raw
  gradient and the residual, and one host function compensates, encodes and makes the new
  residual (:func:`hvd_gradq.tensorflow.host.fed_encoder`, the compiled one-pass rule with
  TensorFlow's subnormals as zeros); :func:`keep` then applies the step's masks to it
  (:meth:`Memory.settle`): one select, where the rule was a compensate op, this rank's own
  decode and a residual op of six to eight TensorFlow operations (each a parallel region of
  TensorFlow's pool) or a host op;
* **around it** (:func:`compensate`, then :meth:`Memory.update` in :func:`keep`), where the one
  pass does not apply: the summable and hierarchical patterns, a pattern started in a branch
  (warm-up, ``auto``'s measured plans: a ``tf.switch_case``), ``nonfinite=raise`` (its check
  reads the compensated tensor), schemes without buckets, tensors that are not float32 on the CPU.

A graph has no step boundary: every call hands :meth:`Memory.begin_step` the step's loss scale.
"""
from __future__ import annotations

from typing import Any

from ..feedback import Memory
from ..policy import Policy
from ..reduce.table import Entry
from ..schemes.level import LevelScheme
from ..schemes.options import NonFinite
from ..schemes.scheme import Scheme
from .context import Ctx
from .slots import Slot
from .transport import Fed


def compensate(memory: Memory, slot: Slot | None, x: Any, scale: Any) -> Any:
    """x + the slot's residual in the loss scale's units (zero where another rank owns it)."""
    if slot is None or slot.residual is None:
        return x
    memory.begin_step(scale)
    return memory.compensate(slot.key, x)


def fed(memory: Memory, policy: Policy, scheme: Scheme, slot: Slot | None, row: Entry, x: Any,
        scale: Any, branched: bool) -> Fed | None:
    """What the pattern's encode takes to add the slot's residual itself, or None where
    :func:`compensate` adds it (see the module's docstring for which; ``branched``: the pattern
    starts inside a branch, whose outputs are what :func:`keep` reads)."""
    if (slot is None or slot.residual is None or not row.feeds or branched
            or policy.nonfinite is NonFinite.RAISE or not isinstance(scheme, LevelScheme)):
        return None
    memory.begin_step(scale)
    got = memory.fed_inputs(slot.key, x)
    return None if got is None else Fed(*got)


def keep(memory: Memory, ctx: Ctx, own: Any, out: Any, scale: Any) -> None:
    """The slot's new residual, once the result ``out`` is known: the one the pattern's encode
    made, or ``(x - own) / scale``; either way the old one where the new one or ``out`` is not
    finite (a skipped step must not poison error feedback) and all of it in a warm-up step. This
    rank owns it from now on."""
    slot = ctx.slot
    if slot is None or slot.residual is None:
        return
    new = ctx.flow.residual if ctx.flow is not None else None
    if new is None and own is None:
        return
    memory.begin_step(scale)
    if new is not None:
        memory.settle(slot.key, new, result=out, hold=ctx.warm)
    else:
        memory.update(slot.key, ctx.x, own, result=out, hold=ctx.warm)
