"""What a tensor carries from ``compress()`` to ``decompress()`` in the TensorFlow frontend: the
tensor's facts, the choice it is reduced by, its pattern in flight (:class:`.reduce.Flow`) and
what error feedback needs after it. Horovod splits a reduction into ``compress()`` (before its
allreduce of our ``[1.0]``) and ``decompress()`` (after it), and hands this object back to the
second. PyTorch's twin is :mod:`hvd_gradq.torch.context`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..plan.decide import Choice
from ..plan.pattern import Pattern
from .slots import Slot

if TYPE_CHECKING:
    from .reduce import Flow


@dataclass
class Ctx:
    """What ``compress()`` hands Horovod for ``decompress()``: the tensor's facts, the pattern's
    collective result, and what error feedback needs after it (``x``, ``residual``)."""

    slot_index: int
    shape: tuple[int, ...]
    dtype: Any
    n: int
    choice: Choice | None  # None: Horovod's own fp32 allreduce (a tiny tensor, no static size)
    size: int = 1
    rank: int = 0
    local: int = 1  # ranks a host (the hierarchical pattern)
    result: Any = None  # the first collective's result (gather: the gathered bytes)
    flow: Flow | None = None  # the pattern in flight on the reduction core
    x: Any = None  # the compressed input g + e (gather with ef: the residual is set in decompress)
    slot: Slot | None = None
    finite: Any = None  # nonfinite=raise: whether this rank's x held no NaN/Inf (a bool tensor)
    what: str = ""  # "gradient <key> [shape]" for messages
    warm: Any = None  # warmup > 0: whether this step was a warm-up step (a bool tensor) ...
    total: Any = None  # ... the sum over ranks either way ...
    own: Any = None  # ... and what error feedback subtracts (x itself on warm steps: no change)
    step: Any = None  # the slot's step counter before this step (stats' time: :func:`.host.recording`)
    branched: bool = False  # started inside a branch (warm-up, a measured plan): error feedback around the pattern
    kept: bool = False  # its branches keep its residual (switch.plain_branches): decompress() does not

    @property
    def pattern(self) -> Pattern | None:
        """The decided pattern (None: Horovod's own fp32 allreduce)."""
        return None if self.choice is None else self.choice.pattern
