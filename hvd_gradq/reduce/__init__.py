"""The reduction core: each pattern's phases written once, for every driver.

:mod:`.core` says what a pattern is written against (collective requests, a transport, a codec,
one rank's state); :mod:`.gather` holds the gather and scatter patterns, :mod:`.summable` the
shared-scale integer pattern, :mod:`.hier` the hierarchical one; :mod:`.loopback` runs N ranks
in one process. The PyTorch frontend drives the patterns with Horovod's asynchronous
collectives (:mod:`hvd_gradq.torch.reduce`), the quality study with the loopback.
"""
from .core import Allgather, Allreduce, Alltoall, Codec, Group, Part, Phases, Reduction, Request, Transport
from .gather import gather, scatter
from .hier import hierarchical
from .loopback import lockstep
from .summable import summable

__all__ = ["Allgather", "Allreduce", "Alltoall", "Codec", "Group", "Part", "Phases", "Reduction", "Request",
           "Transport", "gather", "hierarchical", "lockstep", "scatter", "summable"]
