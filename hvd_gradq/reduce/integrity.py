"""The verdict: what every rank found wrong with the bytes it received, compared, so that
corruption in transit raises on every rank, naming the tensor, the step, the rank that found it
and the rank that sent the bytes.

Every byte hvd_gradq sends carries a check (:mod:`hvd_gradq.wire.integrity`): payloads their
CRC-32 (poisons are payloads), the summable pattern's lanes a checksum linear over their sum and
the digest of the statistics each rank received, the hierarchical pattern's fp32 pieces (and
their stop flags) a CRC-32 each. A corrupted buffer reaches some ranks only (a ring's hop, one
link), so the rank that finds it cannot raise alone: the others would go on, or wait for it in
the next collective. What a rank found is a :func:`finding` (float64, 0.0 for nothing): itself,
what failed, in which phase and from which sender; of several, the lowest finder's is the max.

Two ways to compare findings, as the driver chooses (``Reduction.findings``):

* **a verdict round a tensor** (TensorFlow, the loopback): every pattern ends with one more
  collective, a Max-allreduce of the finding (:func:`round_`); every rank reads the same value
  and raises the same :class:`~hvd_gradq.errors.CorruptionError` (:func:`error_of`), after the
  stop's barrier where it runs eagerly (:func:`judged`), through the graph's check in a graph;
* **one verdict a step** (PyTorch, :mod:`.verdicts`): the pattern hands its finding to the
  driver's record of the step (``Findings.note``) and asks for no collective; a rank that found
  something has zeros in place of what it could not read (:func:`guard`), and the driver
  compares the whole step's findings in one collective.

A finding from an earlier phase travels to the last one inside the rank that made it: that rank
goes on with zeros in place of what it could not read (its later sends are well-formed, and the
verdict names the corruption). The one finding every rank makes alike, statistics whose digests
differ (:data:`Carrier.DIFFER`), stops every rank in the step either way (:func:`everyone`).
"""
from __future__ import annotations

import enum
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import CorruptionError
from ..wire.integrity import first_corrupt
from ..xp import Ops
from .core import Allreduce, Part, Reduction, Request, halt
from .names import Kind, collective


class Carrier(enum.IntEnum):
    """What failed its check."""

    PAYLOAD = 1  #: a payload's header or CRC-32
    LANES = 2  #: the summed lanes' linear checksum
    STATS = 3  #: received statistics below this rank's own (a Max cannot lower a value)
    PIECE = 4  #: an fp32 piece's CRC-32
    DIFFER = 5  #: the statistics' digests differ between ranks (every rank with intact lanes finds it)


class Phase(enum.IntEnum):
    """The collective whose result failed (messages say it in words)."""

    GATHER = 1
    CHUNKS = 2
    REDUCED = 3
    STATS = 4
    LANES = 5
    H1 = 6
    H2 = 7
    H3 = 8
    H4 = 9


_PHASES = {
    Phase.GATHER: "the allgather of payloads",
    Phase.CHUNKS: "the alltoall of chunk payloads (scatter's first phase)",
    Phase.REDUCED: "the allgather of reduced chunks (scatter's second phase)",
    Phase.STATS: "the Max-allreduce of statistics",
    Phase.LANES: "the Sum-allreduce of lanes",
    Phase.H1: "hierarchical phase h1",
    Phase.H2: "hierarchical phase h2",
    Phase.H3: "hierarchical phase h3",
    Phase.H4: "hierarchical phase h4",
}

_RANK_BITS = 20  # the finder: ranks below 2**20
_SENDER_BITS = 21  # the sender + 1; the whole code below 2**49, exact in float64
_TOP = (1 << _RANK_BITS) - 1


def hier_phase(k: int) -> Phase:
    """The :class:`Phase` of the hierarchical pattern's phase ``h<k>``."""
    return Phase(Phase.H1 + k - 1)


def finding(finder: int, carrier: Carrier, phase: Phase, sender: int | None = None) -> float:
    """The verdict element of rank ``finder``'s finding (float64, exact); the lowest finder's is the max."""
    top = _TOP - min(int(finder), _TOP)
    s = 0 if sender is None else min(int(sender) + 1, (1 << _SENDER_BITS) - 1)
    return float((((top << 4 | int(carrier)) << 4 | int(phase)) << _SENDER_BITS) | s)


def rank_order(code: float) -> int:
    """A finding's first bits, below 2**20, higher for a lower finder: what another element must
    start with to be won by the same finder in a Max (:mod:`.verdicts`)."""
    return int(code) >> (8 + _SENDER_BITS)


def _parse(code: float) -> tuple[int, Carrier, Phase, int | None]:
    c = int(code)
    s = c & ((1 << _SENDER_BITS) - 1)
    c >>= _SENDER_BITS
    return _TOP - (c >> 8), Carrier((c >> 4) & 15), Phase(c & 15), (s - 1 if s else None)


def verify_payloads(buf: NDArray[Any], finder: int, phase: Phase,
                    ranks: Sequence[int] | None = None) -> NDArray[np.float64]:
    """float64 (1,): this rank's finding on a received buffer of payloads (payload i from rank
    ``ranks[i]``, by default i), 0.0 if every payload passes its header and CRC-32 checks. A
    host function: both frontends' codecs run it (``Codec.verify``)."""
    bad = first_corrupt(buf)
    if bad is None:
        return np.zeros(1, np.float64)
    i = bad[0]
    sender = ranks[i] if ranks is not None and i < len(ranks) else i
    return np.array([finding(finder, Carrier.PAYLOAD, phase, sender)], np.float64)


def round_(red: Reduction, t: Part, ops: Ops, found: Any) -> Generator[Request, Any, Any]:
    """The verdict of ``t``: every member's ``found`` max-reduced (the last collective of every
    pattern), a generator that returns the reduced finding; or, where the driver keeps one
    verdict a step (``red.findings``), ``found`` noted there and None returned, no collective."""
    if red.findings is not None:
        read = red.read(ops, found)
        assert read is not None, "one verdict a step runs eagerly"
        red.findings.note(t, read[0])
        return None
    got = yield Allreduce(collective(t.group.key, Kind.VERDICT, t.name), found, "max", last=True)
    return got


_TAIL = ("; every rank stops here, since their results would differ from this step on (check the network, "
         "NICs and memory of the ranks named, and resume from a checkpoint)")


def error_of(what: str, reduced: Any, size: int) -> CorruptionError | None:
    """The error every member raises for a reduced finding (``reduced[0]``), or None for 0.0."""
    v = np.asarray(reduced, np.float64).reshape(-1)
    code = float(v[0]) if v.shape[0] else 0.0
    return None if code == 0.0 else corruption(what, code, size)


def corruption(what: str, code: float, size: int, tail: str = _TAIL) -> CorruptionError:
    """The :class:`CorruptionError` of a non-zero finding ``code`` about ``what`` (the tensor and
    its step) in a group of ``size`` ranks."""
    finder, carrier, phase, sender = _parse(code)
    where = _PHASES[phase]
    if carrier is Carrier.DIFFER:  # every rank found it: no finder to name
        error = CorruptionError(f"{what}: data corrupted in transit: the ranks received different statistics from "
                                f"{where} (the digests summed in the lanes differ from each rank's own){tail}")
    else:
        if carrier is Carrier.PAYLOAD:
            text = f"the payload rank {sender} sent in {where} fails its CRC-32 (or header) check"
        elif carrier is Carrier.PIECE:
            text = f"the fp32 piece rank {sender} sent in {where} fails its CRC-32"
        elif carrier is Carrier.LANES:
            text = (f"the summed lanes of {where} fail their checksum: the sum of ranks 0..{size - 1}'s lanes was "
                    f"corrupted on its way to rank {finder}")
        else:
            text = f"the statistics it received from {where} are below its own, which a maximum cannot be"
        error = CorruptionError(f"{what}: data corrupted in transit, found by rank {finder}: {text}{tail}")
    setattr(error, "_gradq_corrupt", (finder, carrier, phase, sender))  # noqa: B010 (read by tests, logs)
    return error


def everyone(code: float) -> bool:
    """Whether finding ``code`` is one every rank of the group makes alike in the same collective
    (statistics whose digests differ), so that every rank can stop on it at once."""
    return code != 0.0 and _parse(code)[1] is Carrier.DIFFER


def raise_if(error: CorruptionError | None) -> None:
    if error is not None:
        raise error


def guard(red: Reduction, found: Any) -> Any:
    """What a decoder checks before decoding (``unless=``): this rank's finding where it runs
    eagerly (with one verdict a step a rank that found corruption decodes zeros in its place; a
    verdict round stops every rank before that), None in a graph (its check stops it first)."""
    return None if red.graph is not None else found


def judged(red: Reduction, t: Part, ops: Any, got: Any, value: Any) -> Generator[Request, Any, Any]:
    """``value`` once the reduced verdict ``got`` says nothing was found; a generator that raises
    the :func:`error_of` on every member otherwise (eagerly after the stop's barrier; in a graph
    the returned value waits for a check that raises). ``got`` None (one verdict a step: the
    driver's): ``value`` as it is."""
    size = t.group.size
    if got is None:
        return value
    if red.graph is not None:
        return red.graph.check(value, lambda v: raise_if(error_of(t.what, v, size)), [got])
    read = red.read(ops, got)
    assert read is not None
    error = error_of(t.what, read[0], size)
    if error is not None:
        yield from halt(t, error)
    return value


def corrupt_of(error: BaseException) -> tuple[int, Carrier, Phase, int | None] | None:
    """(finder, carrier, phase, sender) of an :func:`error_of` error, None for any other."""
    got: tuple[int, Carrier, Phase, int | None] | None = getattr(error, "_gradq_corrupt", None)
    return got

