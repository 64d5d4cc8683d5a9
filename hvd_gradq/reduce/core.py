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
* TensorFlow (:mod:`hvd_gradq.tensorflow.reduce`) runs them while Horovod traces the reduction:
  each request becomes a graph collective, each result the symbolic tensor it returns, and the
  codec's work one host function a phase;
* the quality study's simulator (:mod:`.loopback`) runs N generators in lock step and hands
  each the result an in-process collective would give (so the study runs this code).

Every pattern's last collective is the verdict round (:mod:`.integrity`: what each rank found
wrong with the bytes it received, so that every rank raises on corruption in transit), unless
the driver compares findings once a step instead (:class:`Findings`: PyTorch, :mod:`.verdicts`).
Requests say whether another collective follows (``last``): after the last one a pattern only
decodes, which a driver may put on a worker thread, and before it the driver starts every
pending tensor's next phase before waiting on any (Horovod needs every rank to start the same
collectives; none may block on a phase another tensor's phase would unblock).

Buffers: payload bytes travel as the codec makes them (NumPy ``uint8``; ``tf.uint8`` tensors in
TensorFlow's graph); float tensors (the summable pattern's
statistics and lanes, the hierarchical pattern's fp32 pieces) as the frontend's arrays. A result
comes back in its request's kind.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from ..feedback import Memory
from ..spec import Config, SchemeLike
from ..xp import Array, Ops, Seed
from .names import Kind, collective, words
from .stats import Stats


@dataclass(frozen=True)
class Allgather:
    """Every member's ``buf`` (1-D), concatenated in member order.

    ``fuse``: it may travel with the round's other fusable requests in one collective, as
    :class:`Alltoall`'s may (each member's ``buf`` sent whole to every member): a small tensor's
    payload then costs no collective of its own, whose negotiation and Python cost as much as
    Horovod's whole reduction of it (:attr:`Reduction.fuse_below`)."""

    name: str
    buf: Any
    last: bool = True
    fuse: bool = False


@dataclass(frozen=True)
class Alltoall:
    """``buf`` cut into ``splits`` (one a rank of the process set, zero for ranks outside the
    phase's group); what comes back is every rank's part for this one, in rank order.

    ``fuse``: it may travel in one collective with the other tensors' fusable alltoalls of the
    same round, each found again by its name (PyTorch's driver does so: :mod:`hvd_gradq.torch.reduce`).
    Why: Horovod runs the collectives of a cycle one after the other on one Gloo context, every
    alltoall on one Gloo slot, and goes on with the next after one fails; so when a rank dies
    during a step whose cycle holds several alltoalls, a survivor that failed one early can post
    the next one's receives while a peer still sends it the failed one's parts, and a part larger
    than the buffer it lands in aborts the survivor (SIGABRT in Gloo's device thread: issue 35,
    item 10, reproduced with the hierarchical pattern). One alltoall a round leaves no second one
    for a stray part to land in."""

    name: str
    buf: Any
    splits: tuple[int, ...]
    last: bool = False
    fuse: bool = False


@dataclass(frozen=True)
class Allreduce:
    """The element-wise ``op`` ("sum" or "max") of every member's ``value``."""

    name: str
    value: Any
    op: Literal["sum", "max"]
    last: bool = False


@dataclass(frozen=True)
class Barrier:
    """Every member has reached this point. Only a rank that stops on a gradient asks for it
    (:func:`halt`); a transport passes it even where Horovod has ended (a member that passed it
    first may have exited), so it never replaces the error the rank is about to raise."""

    name: str
    last: bool = False


Request = Allgather | Alltoall | Allreduce | Barrier
#: A pattern: yields requests, is sent their results, returns the group's sum (flat float32).
Phases = Generator[Request, Any, Any]


class Transport(Protocol):
    """Starts a collective and waits for it (a driver's; the patterns only yield requests)."""

    def start(self, request: Request) -> Any: ...

    def wait(self, handle: Any) -> Any: ...


class Codec(Protocol):
    """Payloads of the frontend's arrays: made on the host (the compiled kernels) or on a
    device, as the frontend chooses. ``own`` is this rank's decoded values of what it sent, in
    whatever form the codec keeps them (:meth:`values` turns them into a frontend array).

    Where a pattern needs several payloads at once (the scatter pattern's chunks, the
    reduced chunks it gathers) it asks for them in one call, so that a frontend whose host work
    is one function a phase (TensorFlow's graph) makes them in one."""

    def encode(self, config: SchemeLike, x: Array, seed: Seed, what: str) -> tuple[Any, Any]:
        """The payload bytes of flat float32 ``x`` and its own decoded values; raises a
        GradqError for a gradient it cannot encode (the patterns send the poison then)."""
        ...

    def encode_chunks(self, config: SchemeLike, x: Array, bounds: Sequence[tuple[int, int]], seeds: Sequence[Seed],
                      what: str) -> tuple[Any, tuple[int, ...], list[Any]]:
        """The payloads of the chunks ``x[lo:hi]`` (chunk j drawn with ``seeds[j]``), one after
        the other, their sizes in bytes and their own values; raises as :meth:`encode`."""
        ...

    def encode_fed(self, config: SchemeLike, x: Any, e: Any, scale: float | None, e_out: Any,
                   bounds: Sequence[tuple[int, int]],
                   seeds: Sequence[Seed]) -> tuple[Any, tuple[int, ...], list[Any]] | None:
        """Error feedback's rule and the encode in one pass (:func:`hvd_gradq.kernels.encode_fed`),
        on host arrays (:meth:`hvd_gradq.feedback.Memory.encode_fed` hands them in): the payloads
        of the chunks of ``x + e * scale`` as :meth:`encode_chunks` makes them and their sizes,
        the new residual in ``e_out``; or None (nothing written that counts), where this codec
        has no such pass (a device's, a graph's) or the input check refuses a value, and the
        pattern compensates and encodes as usual."""
        ...

    def verify(self, buf: Any, finder: int, phase: int, ranks: Sequence[int] | None = None,
               whole: bool = True) -> Any:
        """This rank's finding on a received buffer of payloads (member i is rank ``ranks[i]``, by
        default i): float64 (1,), 0.0 where every payload passes its header and CRC-32, else the
        :func:`~hvd_gradq.reduce.integrity.finding` naming ``finder`` (this rank), ``phase`` and
        the sender. Never raises: every rank must reach the verdict. ``whole``: one payload
        a member, all of one size (what :meth:`sum` takes; else :meth:`concat`'s)."""
        ...

    def sum(self, buf: Any, rank: int, own: Any, what: str,
            ranks: Sequence[int] | None = None, unless: Any = None, out: Any = None) -> tuple[Array, int]:
        """The decoded sum, in member order, of a gathered buffer's payloads (``own`` stands for
        member ``rank``'s; None: it is decoded as the others), and their count; a poison raises
        the error naming its ranks. ``unless``: a finding of :meth:`verify`; where it is not 0.0,
        zeros without decoding. ``out``: where to write the sum (:attr:`Part.out`), or None."""
        ...

    def concat(self, buf: Any, rank: int, own: Any, sizes: Sequence[int], what: str,
               ranks: Sequence[int] | None = None, unless: Any = None, out: Any = None) -> Array:
        """A gathered buffer's payloads (of ``sizes`` elements) decoded and concatenated in member
        order, ``own`` standing for member ``rank``'s (None: decoded as the others); with ``ranks``
        (member i is rank ``ranks[i]``), a poison raises the error naming its ranks first.
        ``unless`` and ``out``: as :meth:`sum`'s."""
        ...

    def values(self, own: Any) -> Array:
        """``own`` as a frontend array (for error feedback and concatenation)."""
        ...


def halt(t: Part, error: BaseException) -> Generator[Request, Any, Any]:
    """Raise ``error`` once every member of ``t``'s group has reached the same stop (a poison
    sent, or one received): a rank that raised at once could end Horovod (its exit shuts every
    rank down) before a slower one has read the poison, which would then fail with Horovod's
    shutdown error instead of the one that says what happened."""
    yield Barrier(collective(t.group.key, Kind.STOP, t.name))
    raise error


def join(ops: Ops, parts: Sequence[Any]) -> Any:
    """Buffers one after the other: NumPy's (payload bytes) by NumPy, the frontend's by ``ops``."""
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(list(parts))
    return ops.concat(list(parts), 0)


@dataclass(frozen=True)
class Group:
    """The ranks a tensor is reduced over: this rank's place, their count, the collectives'
    scope (:func:`hvd_gradq.reduce.names.collective`: ranks of two process sets never share a
    name), the ranks a host (the hierarchical pattern and the cost model: :mod:`hvd_gradq.plan.hosts`)
    and the frontend's handle of the process set its collectives run on (None in the loopback)."""

    rank: int
    size: int
    key: str = ""
    local: int = 1
    process_set: Any = None


class Findings(Protocol):
    """Where a pattern's finding goes when its driver compares findings once a step (PyTorch's
    record of a step, :class:`hvd_gradq.reduce.verdicts.StepRecord`) instead of in a verdict
    round a tensor (:func:`hvd_gradq.reduce.integrity.round_`)."""

    def note(self, t: Part, found: np.ndarray[Any, Any]) -> None:
        """``t``'s finding (float64 (1,), host values: 0.0 for nothing) on this rank."""
        ...


class Graph(Protocol):
    """What a driver that runs the patterns while a graph is being built (TensorFlow) does its own
    way; a :class:`Reduction` without one runs eagerly and may read values on the host.

    In a graph no value can be read while the patterns run, so a decision a pattern takes on
    values becomes a check the graph runs (:meth:`check`); every error a graph meets is raised by
    its host functions, on every rank that reads the same values."""

    def keep(self, sent: Array, decoded: Array) -> None:
        """This rank's gradient as sent (``decoded``): its compressor writes the residual itself,
        with the step's keep mask, once the result's finiteness is known."""
        ...

    def encode_fed(self, t: Part, x: Array, bounds: Sequence[tuple[int, int]],
                   seeds: Sequence[Seed]) -> tuple[Any, tuple[int, ...], list[Any]] | None:
        """As :meth:`Reduction.encode_fed`, in the graph: the payloads of the raw gradient with its
        residual added, in one host function that also makes the new residual (the compressor
        writes it with the step's keep mask), or None where the compressor added the residual."""
        ...

    def add_rows(self, buf: Array, rows: int, m: int) -> Array:
        """As :meth:`Reduction.add_rows`, in one function the graph's optimizer cannot reorder."""
        ...

    def pure(self, f: Callable[..., Any], static: tuple[Any, ...]) -> Callable[..., Any]:
        """``f(*static, ops, *arrays)`` as one computation the graph builds once and runs exactly as
        written (:meth:`Reduction.pure`): a callable of the arrays."""
        ...

    def check(self, value: Array, verdict: Callable[..., None], facts: Sequence[Array]) -> Array:
        """``value``, once ``verdict`` has run on the host values of ``facts`` (it raises to stop)."""
        ...


@dataclass
class Reduction:
    """One rank's side of every reduction of a compressor: the scheme and its policy, the base
    seed and this rank's global rank (the seeds' host rule, :mod:`hvd_gradq.reduce.names`),
    error feedback's memory, the byte and time figures, and the Ops of host arrays.

    A driver that compares findings once a step hands in its record of the step (``findings``).
    A driver that runs the patterns while a graph is built (TensorFlow) hands in its
    :class:`Graph`, leaves ``stats`` None (it counts bytes from static sizes and times its host
    functions where they run) and may hand ``memory`` in only before the phase that needs it
    (the owner residuals)."""

    config: Config
    seed: int
    rank: int
    memory: Memory | None
    stats: Stats | None
    ops: Ops
    graph: Graph | None = None
    findings: Findings | None = None  # one verdict a step: the driver's record (eager only)
    #: gathers of at most this many elements are fusable (``Allgather.fuse``); 0: none. Set by
    #: a driver that fuses a round's requests (PyTorch's); the rest run each collective alone.
    fuse_below: int = 0

    @property
    def ef(self) -> bool:
        return self.config.policy.ef

    @property
    def verdict_round(self) -> bool:
        """Whether every pattern ends with its own verdict round (:mod:`.integrity`), so that
        its last data collective is not its last collective (``last=``)."""
        return self.findings is None

    def words(self, t: Part, tag: str = "") -> Seed:
        """The seed of part ``tag`` of ``t`` (``""``, ``"#j"``, ``"#reduce"``, ``"#host"``...):
        the part's own rule, else :func:`~hvd_gradq.reduce.names.words` of ``<name><tag>``."""
        return t.draws(tag) if t.draws is not None else words(self.seed, self.rank, t.name + tag, t.step)

    def sent(self, t: Part, x: Array, decoded: Array) -> None:
        """This rank's gradient ``x`` (its residual already added) went out as ``decoded``."""
        if self.graph is not None:
            self.graph.keep(x, decoded)
        else:
            self._memory().update(t.key, x, decoded)

    def add_rows(self, buf: Array, rows: int, m: int) -> Array:
        """The sum of the ``rows`` rows of ``m`` elements of flat ``buf``, in row order."""
        if self.graph is not None:
            return self.graph.add_rows(buf, rows, m)
        total = buf[:m]
        for i in range(1, rows):
            total = total + buf[i * m:(i + 1) * m]
        return total

    def pure(self, f: Callable[..., Any], *static: Any) -> Callable[..., Any]:
        """``f(*static, ops, *arrays)`` as a callable of ``(ops, *arrays)``: a pure computation
        (no collective, no host read) that a graph builds once per ``static`` and shields from
        float rewrites (:meth:`Graph.pure`); eagerly, the function itself."""
        if self.graph is not None:
            run = self.graph.pure(f, static)
            return lambda ops, *arrays: run(*arrays)
        return lambda ops, *arrays: f(*static, ops, *arrays)

    def read(self, ops: Ops, *arrays: Array) -> list[np.ndarray[Any, Any]] | None:
        """The host values of ``arrays`` (of ``ops``' device), or None where none can be read (a
        graph being built: the decision goes to :meth:`Graph.check` instead)."""
        if self.graph is not None:
            return None
        return [np.asarray(ops.to_numpy(a)) for a in arrays]

    def encode_fed(self, t: Part, x: Array, bounds: Sequence[tuple[int, int]],
                   seeds: Sequence[Seed]) -> tuple[Any, tuple[int, ...], list[Any]] | None:
        """The payloads of this rank's raw gradient ``x`` (chunks ``bounds``, drawn with
        ``seeds``) with its residual added, and the residual kept, in one pass
        (:meth:`hvd_gradq.feedback.Memory.encode_fed` over :meth:`Codec.encode_fed`): the bytes,
        each chunk's size and its own values as :meth:`Codec.sum` takes them; or None, where
        that pass does not apply, and the pattern runs :meth:`compensate`, its encode and
        :meth:`sent`."""
        if self.graph is not None:
            return self.graph.encode_fed(t, x, bounds, seeds)
        codec, config = t.codec, self.config
        return self._memory().encode_fed(t.key, x, lambda xv, ev, s, ov: codec.encode_fed(config, xv, ev, s, ov,
                                                                                          bounds, seeds))

    def compensate(self, key: str, x: Array) -> Array:
        """A residual added to ``x``: an owner's (``#reduce``, ``#host``...), or this rank's own
        where the pattern got the raw gradient and :meth:`encode_fed` did not apply."""
        return self._memory().compensate(key, x)

    def update(self, key: str, sent: Array, decoded: Array) -> None:
        """An owner residual, from what was sent and what the receivers decode."""
        self._memory().update(key, sent, decoded)

    def _memory(self) -> Memory:
        assert self.memory is not None, "error feedback asked of a reduction without a memory"
        return self.memory

    def timed(self, kind: str) -> AbstractContextManager[None]:
        """Time the block as ``kind`` (nothing when the driver times its own work)."""
        return nullcontext() if self.stats is None else self.stats.clock.timed(kind)

    def took(self, kind: str, t0: float) -> None:
        """The time since ``t0`` (``time.perf_counter``) as ``kind``."""
        if self.stats is not None:
            self.stats.clock.add(kind, time.perf_counter() - t0)


@dataclass(frozen=True)
class Part:
    """One tensor's reduction on this rank: its name (collectives; residuals and seeds unless
    given), the step, the group, and the codec that makes its payloads. ``residual``: the key of
    its residuals when not ``name`` (TensorFlow names collectives by the slot and keys residuals
    by the variable); ``draws``: the seed of each part's tag where the driver computes them
    (TensorFlow: in the graph, from a step counter), else :meth:`Reduction.words`'s host rule;
    ``label``: how errors name it, where not by name and step; ``out``: an array of the tensor's
    size the pattern may write its result into (PyTorch: the gradient's own storage, where
    Horovod sets the gradient to the result, so that a huge tensor's sum needs no second copy of
    it: the input is read by then), else None. ``compensated``: whether the gradient arrives
    with this rank's residual added; False (a pattern whose row ``feeds``, with error feedback):
    the pattern adds it, in one pass with its encode where it can (:meth:`Reduction.encode_fed`)."""

    name: str
    step: Any
    group: Group
    codec: Codec
    residual: str = ""
    draws: Callable[[str], Seed] | None = None
    label: str = ""
    out: Any = None
    compensated: bool = True

    @property
    def key(self) -> str:
        """The key of this rank's residual of the tensor (owner residuals add a suffix)."""
        return self.residual or self.name

    @property
    def what(self) -> str:
        """How errors name it: ``label`` where the driver gives one (a graph's step is a tensor)."""
        return self.label or f"{self.name} (step {self.step})"
