"""What a tensor carries from ``compress()`` to ``decompress()`` in the PyTorch frontend: the
tensor's facts, the choice it was reduced by and its pattern in flight (:class:`.reduce.Flow`);
or, for a tensor handed to Horovod's own allreduce, what casting it back needs (:class:`Pass`).
TensorFlow's twin is :mod:`hvd_gradq.tensorflow.context`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..plan.decide import Choice
from ..plan.pattern import Pattern
from ..reduce import Group

if TYPE_CHECKING:
    from .reduce import Flow


@dataclass
class Pass:
    """A tensor handed to Horovod's own allreduce, exactly (tiny tensors, one-rank sets, fp16)."""

    name: str
    dtype: torch.dtype
    how: str = "Horovod's own allreduce"  # which, and why: what an error about its sum says


@dataclass
class Ctx:
    """What every compressed tensor carries from ``compress()`` to ``decompress()``."""

    name: str
    step: int
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    group: Group
    choice: Choice
    flow: Flow | None = None  # the pattern in flight (:meth:`.reduce.Reducer.start`)

    @property
    def pattern(self) -> Pattern:
        """The decided pattern."""
        return self.choice.pattern
