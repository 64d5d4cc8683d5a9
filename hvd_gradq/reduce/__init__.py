"""The reduction core: each pattern's phases written once, for every driver.

:mod:`.core` says what a pattern is written against (collective requests, a transport, a codec,
one rank's state); :mod:`.gather` holds the gather and scatter patterns, :mod:`.summable` the
shared-scale integer pattern, :mod:`.hier` the hierarchical one; :mod:`.table` maps a decided
pattern to its phases, the one place any driver looks it up; :mod:`.loopback` runs N ranks in
one process. What the patterns stand on: :mod:`.codec` (the host codec), :mod:`.stop` (how a
rank that stops tells the others), :mod:`.names` (collective names and the seeds' rule),
:mod:`.stats` (bytes and time), :mod:`.handshake` (what ranks compare first), :mod:`.integrity`
(corruption in transit raised on every rank: a verdict round a tensor) and :mod:`.verdicts` (one
verdict a step instead, where the driver keeps a record of the step: PyTorch).

Three drivers run the patterns: PyTorch with Horovod's asynchronous collectives
(:mod:`hvd_gradq.torch.reduce`), TensorFlow while Horovod traces the reduction
(:mod:`hvd_gradq.tensorflow.reduce`), and the quality study with the loopback.
"""
from .core import Allgather, Allreduce, Alltoall, Codec, Group, Part, Phases, Reduction, Request, Transport
from .loopback import lockstep
from .table import PATTERNS, owner_residuals, phases

__all__ = ["PATTERNS", "Allgather", "Allreduce", "Alltoall", "Codec", "Group", "Part", "Phases", "Reduction",
           "Request", "Transport", "lockstep", "owner_residuals", "phases"]
