"""What every pattern of the reduction core is written against: the collectives it asks for,
the transport that runs them, the codec that makes and reads its payloads, and one rank's
reduction state.

A pattern (:mod:`.gather`, :mod:`.summable`, :mod:`.hier`) is a generator: it computes, then
*yields* a collective request (:class:`Allgather`, :class:`Alltoall`, :class:`Allreduce`),
receives that collective's result, computes on, and finally *returns* this rank's sum over the
group (flat float32). Who runs the collectives is the driver's business:

* PyTorch (:mod:`hvd_gradq.torch.reduce`) starts each request with Horovod's asynchronous ops
  (:class:`Transport`) and resumes the generator when the handle is done: the first segment (the
  encode) on a worker thread inside ``compress()``, the rest from ``decompress()``;
* the quality study's simulator (:mod:`.loopback`) runs N generators in lock step and hands
  each the result an in-process collective would give (so the study runs this code).

Requests say whether another collective follows (``last``): after the last one a pattern only
decodes, which a driver may put on a worker thread, and before it the driver starts every
pending tensor's next phase before waiting on any (Horovod needs every rank to start the same
collectives; none may block on a phase another tensor's phase would unblock).

Buffers: payload bytes travel as NumPy ``uint8``; float tensors (the summable pattern's
statistics and lanes, the hierarchical pattern's fp32 pieces) as the frontend's arrays. A result
comes back in its request's kind.
"""
from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from ..api import Payload
from ..feedback import Memory
from ..frontend.stats import Stats
from ..spec import Config, SchemeLike
from ..xp import Array, Ops, Seed


@dataclass(frozen=True)
class Allgather:
    """Every member's ``buf`` (1-D), concatenated in member order."""

    name: str
    buf: Any
    last: bool = True


@dataclass(frozen=True)
class Alltoall:
    """``buf`` cut into ``splits`` (one a rank of the process set, zero for ranks outside the
    phase's group); what comes back is every rank's part for this one, in rank order."""

    name: str
    buf: Any
    splits: tuple[int, ...]
    last: bool = False


@dataclass(frozen=True)
class Allreduce:
    """The element-wise ``op`` ("sum" or "max") of every member's ``value``."""

    name: str
    value: Any
    op: Literal["sum", "max"]
    last: bool = False


Request = Allgather | Alltoall | Allreduce
#: A pattern: yields requests, is sent their results, returns the group's sum (flat float32).
Phases = Generator[Request, Any, Any]


class Transport(Protocol):
    """Starts a collective and waits for it (a driver's; the patterns only yield requests)."""

    def start(self, request: Request) -> Any: ...

    def wait(self, handle: Any) -> Any: ...


class Codec(Protocol):
    """Payloads of the frontend's arrays: made on the host (the compiled kernels) or on a
    device, as the frontend chooses. ``own`` is this rank's decoded values of what it sent, in
    whatever form the codec keeps them (:meth:`values` turns them into a frontend array)."""

    def encode(self, config: SchemeLike, x: Array, seed: Seed, what: str) -> tuple[NDArray[np.uint8], Any]:
        """The payload bytes of flat float32 ``x`` and its own decoded values; raises a
        GradqError for a gradient it cannot encode (the patterns send the poison then)."""
        ...

    def sum(self, buf: NDArray[np.uint8], rank: int, own: Any, what: str,
            ranks: Sequence[int] | None = None) -> tuple[Array, int]:
        """The decoded sum, in member order, of a gathered buffer's payloads (``own`` stands for
        member ``rank``'s), and their count; a poison raises the error naming its ranks."""
        ...

    def decode(self, payload: Payload, like: Any) -> Array:
        """One payload decoded, where ``like`` (an ``own``) lives."""
        ...

    def values(self, own: Any) -> Array:
        """``own`` as a frontend array (for error feedback and concatenation)."""
        ...


@dataclass(frozen=True)
class Group:
    """The ranks a tensor is reduced over: this rank's place, their count, the collectives'
    scope (:func:`hvd_gradq.frontend.names.collective`) and the ranks a host."""

    rank: int
    size: int
    key: str = ""
    local: int = 1


@dataclass
class Reduction:
    """One rank's side of every reduction of a compressor: the scheme and its policy, the base
    seed and this rank's global rank (the seeds' rule, :mod:`hvd_gradq.frontend.names`), error
    feedback's memory, the byte and time figures, and the Ops of host arrays."""

    config: Config
    seed: int
    rank: int
    memory: Memory
    stats: Stats
    ops: Ops

    @property
    def ef(self) -> bool:
        return self.config.policy.ef


@dataclass(frozen=True)
class Part:
    """One tensor's reduction on this rank: its name (collectives, residuals, seeds), the step,
    the group, and the codec that makes its payloads."""

    name: str
    step: int
    group: Group
    codec: Codec

    @property
    def what(self) -> str:
        """How errors name it."""
        return f"{self.name} (step {self.step})"
