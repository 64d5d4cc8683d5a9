"""PyTorch's one verdict a step (:mod:`hvd_gradq.reduce.verdicts`, where the why and the when are)
over Horovod's asynchronous ops, for one compressor's :class:`~.reduce.Reducer`:

* :meth:`StepVerdicts.record` at each tensor's start: the step's record of its group, which the
  pattern notes its finding in;
* :meth:`StepVerdicts.begin_step` at the first ``compress()`` of a step: the previous step's
  verdicts started, one a group (they overlap backward);
* :meth:`StepVerdicts.check` at the first ``decompress()``: those verdicts read; a finding
  raises the CorruptionError on every member, after the barrier;
* :meth:`StepVerdicts.finder` after each tensor's reduction: where this rank found corruption in
  it, the step's verdicts started at once and this one waited for, at most the bound, then the
  error raised (the finder never applies the step);
* :meth:`StepVerdicts.forget` on an elastic reset: nothing of the old world is waited for.
"""
from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import horovod.torch as hvd

from ..reduce.core import Group, Request
from ..reduce.handshake import Stalled, wait
from ..reduce.stats import Clock
from ..reduce.verdicts import StepRecord, Verdicts, settle, timeout
from .transport import HorovodTransport


@dataclass
class _Round:
    """A record's verdict in flight: its generator, transport and the handle of its collective."""

    record: StepRecord
    gen: Generator[Request, Any, None]
    transport: HorovodTransport
    handle: Any


class StepVerdicts:
    """One compressor's records, and the verdicts of the previous step in flight."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock
        self.verdicts = Verdicts()
        self.rounds: list[_Round] = []
        self.timeout = timeout()

    def record(self, group: Group, name: str, step: int) -> StepRecord:
        return self.verdicts.record(group, name, step)

    def begin_step(self) -> None:
        self.rounds += [self._start(r) for r in self.verdicts.close()]

    def check(self) -> None:
        rounds, self.rounds = self.rounds, []
        for r in rounds:
            self._settle(r, None)

    def finder(self, record: StepRecord | None, name: str) -> None:
        """Raise the step's CorruptionError where this rank found corruption in tensor ``name``."""
        if record is None or record.code_of(name) == 0.0:
            return
        started = [self._start(r) for r in self.verdicts.close()]  # every group's: none waits for this rank
        mine = [r for r in started if r.record is record]
        if not mine:  # its verdict started before (a step that went on after an error)
            raise record.alone(0.0)
        self._settle(mine[0], self.timeout)

    def forget(self) -> None:
        self.rounds = []
        self.verdicts.forget()

    def _start(self, record: StepRecord) -> _Round:
        gen = settle(record)
        transport = HorovodTransport(record.group.process_set, self.clock)
        return _Round(record, gen, transport, transport.start(next(gen)))

    def _settle(self, r: _Round, bound: float | None) -> None:
        """Read ``r``'s verdict (waiting at most ``bound`` s; None: as any collective) and raise
        what it names, after the barrier. Past the bound, or where Horovod ended under it, the
        rank raises its own finding (:meth:`StepRecord.alone`)."""
        deadline = None if bound is None else time.monotonic() + bound
        try:
            _bounded(r.handle, r.record.name, deadline)
            got = r.transport.wait(r.handle)
        except (Stalled, RuntimeError):
            if bound is None:
                raise
            raise r.record.alone(bound) from None
        try:
            barrier = r.gen.send(got)
        except StopIteration:
            return  # nothing found
        handle = r.transport.start(barrier)
        try:
            _bounded(handle, r.record.name, deadline)
            r.transport.wait(handle)
        except Stalled:  # a member that never reads it: raise all the same
            pass
        r.gen.send(None)  # raises the error


def _bounded(handle: Any, name: str, deadline: float | None) -> None:
    """Poll the collective of ``handle`` (a transport's) until it is done or ``deadline`` passes."""
    h = handle[1]
    if deadline is None or h is None:
        return
    wait(lambda: bool(hvd.poll(h)), name, max(deadline - time.monotonic(), 0.0))
