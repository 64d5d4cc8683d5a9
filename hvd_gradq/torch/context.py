"""What a compressed tensor carries from ``compress()`` to ``decompress()`` in the PyTorch
frontend, whatever its pattern (each pattern's context adds its own fields: :mod:`.reduce`,
:mod:`.hier`), and the group of ranks it is reduced over."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Group:
    """The ranks a reduction runs on: Horovod's process set, this rank's place and their count."""

    process_set: Any
    rank: int
    size: int
    key: str  # part of collective names: ranks of two process sets never share a name
    local: int = 1  # ranks a host, for the hierarchical pattern and the cost model (plan/hosts.py)


@dataclass
class Pass:
    """A tensor handed to Horovod's own allreduce, exactly (tiny tensors, one-rank sets)."""

    name: str
    dtype: torch.dtype


@dataclass
class Ctx:
    """What every compressed tensor carries from ``compress()`` to ``decompress()``."""

    name: str
    step: int
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    group: Group
