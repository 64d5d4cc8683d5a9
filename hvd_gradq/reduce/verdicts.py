"""One verdict a step: what each rank found wrong with the bytes it received during a whole step,
compared in one collective a step and process set instead of one a tensor (PyTorch's driver:
:mod:`hvd_gradq.torch.verdict`).

**Why.** A verdict round a tensor (:func:`hvd_gradq.reduce.integrity.round_`) is one more
Horovod collective a tensor and step: for a model of hundreds of tensors, hundreds of tiny
collectives, each with its negotiation, on every step, to report a corruption that almost never
happens. Here each rank keeps a record of the step (:class:`StepRecord`, the patterns' ``Findings``:
the tensors it started, the first finding) and the ranks compare the records once.

**When.** Nothing is found on almost every step, so no rank should wait for the comparison: a
rank starts step s's verdict (:func:`settle`: a Max-allreduce of three float64s) once it has
handed on the result of every tensor it started in step s (PyTorch: its last ``decompress()``
of the step), so that it runs during the next forward pass, and reads it at the first
``compress()`` of step s + 1, before it starts anything of that step. (Not later: Horovod waits
for its own allreduce of a tensor before it calls ``decompress()``, and a rank that stopped at
step s never starts that.) A rank that found corruption in step s must not apply step s: it
takes part in every collective of step s (zeros in place of what it could not read), then, at
that tensor's ``decompress()``, starts step s's verdicts itself, waits for them at most
:func:`timeout` seconds (``HVD_GRADQ_VERDICT_TIMEOUT``) and raises. So every rank raises the
same :class:`~hvd_gradq.errors.CorruptionError` naming the tensor, its step, the finder and the
sender: the finder before applying step s, the others at step s + 1's first ``compress()``
(in PyTorch, out of ``backward()``), having applied step s (with zeros in what the finder
forwarded: a scatter owner's chunk, a hierarchical owner's piece; what they received directly
is exact). All pass a barrier first, as a stop does (:func:`hvd_gradq.reduce.core.halt`), so
that no rank's exit ends Horovod under another.

**The last step.** Nobody takes a step s + 1 after the last step: the finder still reads the
verdict (the others start it as their last step ends) and raises, once its bound has passed at
the barrier nobody else reaches (or sooner, where the others' exit ends Horovod under it); if
the verdict itself does not come, it raises its own finding, saying that the others did not
join. The others end normally with step s applied, unless they read the verdict themselves
(PyTorch: ``check_last_step()``). A checkpoint written between step s and the next step's first
``compress()`` holds step s, confirmed only there.

**The record's vector.** A Max-allreduce reduces elements separately, so every element a rank
sends starts with the same bits for the same finder (:func:`~hvd_gradq.reduce.integrity.rank_order`,
higher for a lower rank): [the finding, order << 32 | the tensor's key, order << 32 | its step],
all below 2**53 (exact in float64). The lowest finder's three elements win together; each rank
turns the tensor's key back into its name from its own record (every member reduced the same
tensors in the step). Statistics that differ between ranks need no verdict: every rank learns it
in the lanes (:mod:`hvd_gradq.wire.integrity`) and stops in the step.

**Names.** ``hvd_gradq.<scope>cs<k>.<first tensor>``: the process set's scope (its generation's
prefix in elastic jobs, so that no verdict straddles a reset), ``k`` the parity of the group's
count of verdicts in this generation (the same on every member: each runs one for every step in
which the group reduced a tensor) and the first of the step's tensor names (two compressors on
one process set never share a name). Two consecutive steps' verdicts never share a name, so a
rank a step off would wait instead of comparing another step; at most those two can be in
flight at once (a rank reads step s's before any rank can finish step s + 1). Beyond that the
names repeat, so that Horovod's response cache serves them as it serves the tensors': a new name
every step missed it every step and, after a few hundred steps of a 300-tensor model, filled it
(Horovod then warns of evictions and "reduced performance").
"""
from __future__ import annotations

import threading
from collections.abc import Generator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import CorruptionError
from ..xp import MASK32
from .core import Allreduce, Barrier, Group, Part, Request
from .handshake import seconds
from .integrity import corruption, rank_order
from .names import Kind, collective, tensor_key

TIMEOUT_ENV = "HVD_GRADQ_VERDICT_TIMEOUT"
#: Seconds a rank that found corruption waits for the others, in the step's verdict and at the
#: barrier after it: they reach the barrier at their next step's first ``compress()``, so the
#: bound must cover the rest of a step, the next batch and its forward pass.
DEFAULT_TIMEOUT = 60.0

_TAIL = ("; every rank stops (the rank that found it before applying this step, the others at their next step, "
         "having applied it), since their results would differ from here on (check the network, NICs and memory "
         "of the ranks named, and resume from a checkpoint written before this step)")


def left_alone(what: str, waited: float | None) -> str:
    """The end of a finder's error where the others did not ``what`` within ``waited`` s (None:
    they had ended Horovod)."""
    why = "had ended Horovod" if waited is None else f"did not {what} within {waited:g} s ({TIMEOUT_ENV})"
    return (f"; the other ranks {why}: this was their last step (they ended normally, with it applied), or they "
            "stopped. Check the network, NICs and memory of the ranks named, and resume from a checkpoint written "
            "before this step")


def timeout() -> float:
    """:data:`TIMEOUT_ENV`, else :data:`DEFAULT_TIMEOUT` (a GradqError for anything but a positive number)."""
    return seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT, "the seconds a rank that found corrupted data waits for the others "
                                                 "to join the step's verdict")


class StepRecord:
    """One rank's record of one step over one group: every tensor it started (name and step) and
    what the patterns found (``note``, possibly on a worker thread). Sealed with its name's number when
    its verdict starts (what it sends is what was noted by then)."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self.steps: dict[str, int] = {}  # every tensor started in the step: its step
        self.found: dict[str, float] = {}  # the tensors whose pattern ended: their finding
        self.first: str | None = None  # the first tensor with a finding
        self.number: int | None = None  # the parity of the group's count of verdicts, once sealed
        self.started = 0  # tensors started in the step
        self.handed = 0  # tensors whose result the driver handed on (PyTorch: to decompress())
        self._lock = threading.Lock()

    def start(self, name: str, step: int) -> None:
        self.steps[name] = step
        self.started += 1

    def hand(self) -> bool:
        """One more tensor's result handed on; whether every tensor started in the step has been."""
        self.handed += 1
        return self.handed >= self.started

    def note(self, t: Part, found: NDArray[Any]) -> None:
        code = float(np.asarray(found, np.float64).reshape(-1)[0])
        with self._lock:  # noted after the verdict started, it still stops this rank (:meth:`code_of`)
            self.found[t.name] = code
            if code != 0.0 and self.first is None:
                self.first = t.name

    def code_of(self, name: str) -> float:
        """This rank's finding on tensor ``name`` (0.0: none, or its pattern did not end)."""
        with self._lock:
            return self.found.get(name, 0.0)

    def seal(self, number: int) -> None:
        with self._lock:
            self.number = number

    def _name(self, kind: Kind) -> str:
        assert self.number is not None, "a record's verdict is named once it is sealed"
        return collective(self.group.key, kind, min(self.steps), self.number)

    @property
    def name(self) -> str:
        """The verdict's collective name (see the module docstring)."""
        return self._name(Kind.STEP_VERDICT)

    def vector(self) -> NDArray[np.float64]:
        """What this rank sends: [finding, order << 32 | tensor key, order << 32 | its step], zeros if none."""
        with self._lock:
            first = self.first
            code = self.found[first] if first is not None else 0.0
        if first is None:
            return np.zeros(3, np.float64)
        top = rank_order(code) << 32
        return np.array([code, top | tensor_key(first), top | min(self.steps[first], MASK32)], np.float64)

    def error(self, reduced: Any, tail: str = _TAIL) -> CorruptionError | None:
        """The error every member raises for the reduced vector, None where nothing was found
        (``tail``: a finder's :func:`left_alone` at a barrier the others did not reach)."""
        v = np.asarray(reduced, np.float64).reshape(-1)
        if v[0] == 0.0:
            return None
        return corruption(self._what(int(v[1]) & MASK32, int(v[2]) & MASK32), float(v[0]), self.group.size, tail)

    def alone(self, waited: float | None) -> CorruptionError:
        """The error of a rank whose own finding the others did not come to compare within ``waited``
        s (None: Horovod had ended when the verdict was to start)."""
        first = self.first
        assert first is not None, "alone() is the error of a rank that found something"
        return corruption(self._what(tensor_key(first), self.steps[first]), self.code_of(first), self.group.size,
                          left_alone("join this step's verdict", waited))

    def _what(self, key: int, step: int) -> str:
        names = [n for n in self.steps if tensor_key(n) == key]
        return f"{names[0]} (step {step})" if names else f"a tensor of key {key:#010x} (step {step})"


def settle(record: StepRecord) -> Generator[Request, Any, None]:
    """``record``'s verdict: a Max-allreduce of every member's vector; where it names a finding,
    every member passes a barrier and raises the same error."""
    got = yield Allreduce(record.name, record.vector(), "max", last=True)
    error = record.error(got)
    if error is not None:
        yield Barrier(record._name(Kind.STEP_STOP))
        raise error


class Verdicts:
    """A compressor's records of the step in flight (one a group) and each group's count of
    verdicts in this generation."""

    def __init__(self) -> None:
        self.current: dict[str, StepRecord] = {}
        self.counts: dict[str, int] = {}

    def record(self, group: Group, name: str, step: int) -> StepRecord:
        """The current step's record of ``group``, with tensor ``name`` (at ``step``) started in it."""
        rec = self.current.get(group.key)
        if rec is None:
            rec = self.current[group.key] = StepRecord(group)
        rec.start(name, step)
        return rec

    def close(self) -> list[StepRecord]:
        """The current step's records, sealed and numbered; the next tensor starts a new step."""
        out = list(self.current.values())
        self.current = {}
        for rec in out:
            key = rec.group.key
            rec.seal(self.counts.get(key, 0) % 2)
            self.counts[key] = self.counts.get(key, 0) + 1
        return out

    def forget(self) -> None:
        """A new world (elastic reset): no record or count carries over."""
        self.current = {}
        self.counts = {}
