"""What the PyTorch compressor hands the shared handshake
(:meth:`hvd_gradq.frontend.compressor.CompressorCore.handshake`): the allgather it runs on, once a
process set, before anything depends on the configuration (:func:`gatherer`), and Horovod's fp16
round trip the CPU probe times (:func:`fp16_round_trip`). TensorFlow's twin is
:mod:`hvd_gradq.tensorflow.handshake`.

The allgather runs on the same collectives on every rank, before the first reduction: ranks that
disagree would otherwise hand Horovod tensors of different shapes (one compresses a tensor the
other passes through) and Horovod would shut down before the check could speak. It is started
asynchronously and polled against the core's bound (:func:`hvd_gradq.reduce.handshake.wait`):
Horovod's own wait has no end, and a rank that never joins would leave this one waiting silently.
"""
from __future__ import annotations

from typing import Any

import horovod.torch as hvd
import torch

from ..frontend.compressor import Gather
from ..reduce import Group, handshake, names
from ..reduce.names import Kind


def gatherer(group: Group) -> Gather:
    """The handshake's allgather over the group's process set, its collectives named in its scope,
    waited for at most the seconds the core gives (then :class:`~hvd_gradq.reduce.handshake.Stalled`)."""

    def gather(row: Any, kind: Kind, seconds: float) -> Any:
        name = names.collective(group.key, kind)
        handle = hvd.allgather_async(torch.from_numpy(row), name=name, process_set=group.process_set)
        handshake.wait(lambda: bool(hvd.poll(handle)), name, seconds, timed=kind is Kind.LINK)
        return hvd.synchronize(handle).numpy()

    return gather


def fp16_round_trip(x: Any) -> Any:
    """Horovod's fp16 cast there and back (``hvd.Compression.fp16``), as the probe times it."""
    return torch.from_numpy(x).to(torch.float16).to(torch.float32)
