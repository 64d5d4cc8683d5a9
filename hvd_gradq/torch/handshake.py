"""What the PyTorch compressor hands the shared handshake
(:meth:`hvd_gradq.frontend.compressor.CompressorCore.handshake`): the allgather it runs on, once a
process set, before anything depends on the configuration (:func:`gatherer`), and Horovod's fp16
round trip the CPU probe times (:func:`fp16_round_trip`). TensorFlow's twin is
:mod:`hvd_gradq.tensorflow.handshake`.

The allgather blocks, on the same collectives on every rank: ranks that disagree would otherwise
hand Horovod tensors of different shapes (one compresses a tensor the other passes through) and
Horovod would shut down before the check could speak.
"""
from __future__ import annotations

from typing import Any

import horovod.torch as hvd
import torch

from ..frontend.compressor import Gather
from ..reduce import Group, names
from ..reduce.names import Kind


def gatherer(group: Group) -> Gather:
    """The handshake's allgather over the group's process set, its collectives named in its scope."""

    def gather(row: Any, kind: Kind) -> Any:
        return hvd.allgather(torch.from_numpy(row), name=names.collective(group.key, kind),
                             process_set=group.process_set).numpy()

    return gather


def fp16_round_trip(x: Any) -> Any:
    """Horovod's fp16 cast there and back (``hvd.Compression.fp16``), as the probe times it."""
    return torch.from_numpy(x).to(torch.float16).to(torch.float32)
