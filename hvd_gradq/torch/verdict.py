"""PyTorch's one verdict a step (:mod:`hvd_gradq.reduce.verdicts`, where the why and the when are)
over Horovod's asynchronous ops, for one compressor's :class:`~.reduce.Reducer`:

* :meth:`StepVerdicts.record` at each tensor's start: the step's record of its group, which the
  pattern notes its finding in;
* :meth:`StepVerdicts.handed` after each tensor's reduction, as ``decompress()`` returns it:
  where this rank found corruption in it, the step's verdicts start at once and this one is
  waited for, at most the bound, then the error raised (the finder never applies the step);
  after the step's last tensor, the step's verdicts start (one a group), to run during the next
  forward pass;
* :meth:`StepVerdicts.begin_step` at the first ``compress()`` of the next step: any record not
  yet started (a step that ended in an error) starts; :meth:`StepVerdicts.compressed` at every
  ``compress()``: the verdicts that are done are read, and at the call that was the previous
  step's last they are waited for (:meth:`StepVerdicts.read`; also at the first
  ``decompress()``, for a step with fewer calls); a finding raises the CorruptionError on every
  member, after the barrier, out of ``backward()``;
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
from ..reduce.verdicts import StepRecord, Verdicts, left_alone, settle, timeout
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
        self.rounds: list[_Round] = []  # verdicts started, not read
        self.unstarted: list[StepRecord] = []  # verdicts Horovod refused to start (it had ended)
        self.calls = 0  # compress() calls in this step
        self.expect = 0  # ... in the previous step: at this one, the previous step's verdicts are waited for
        self.timeout = timeout()

    def record(self, group: Group, name: str, step: int) -> StepRecord:
        return self.verdicts.record(group, name, step)

    def handed(self, record: StepRecord | None, name: str) -> None:
        """Tensor ``name``'s result is handed to ``decompress()``: raise the step's CorruptionError
        where this rank found corruption in it; start the step's verdicts after its last tensor."""
        if record is None:
            return
        if record.code_of(name) != 0.0:
            self._start(self.verdicts.close())  # every group's: none waits for this rank
            mine = [r for r in self.rounds if r.record is record]
            self.rounds = [r for r in self.rounds if r.record is not record]
            if mine:
                self._settle(mine[0], self.timeout)
            elif record in self.unstarted:
                raise record.alone(None)
            error = record.error(record.vector())  # its verdict was read before (a step that went on after an error)
            assert error is not None
            raise error
        current = self.verdicts.current
        if record.hand() and current.get(record.group.key) is record and all(
                r.handed >= r.started for r in current.values()):
            self._start(self.verdicts.close())

    def begin_step(self) -> None:
        """At the first ``compress()`` of a step: the previous step's verdicts started where the
        step did not end (or where Horovod refused them then: it raises now, if it still does),
        and the count of this step's ``compress()`` calls started anew."""
        unstarted, self.unstarted = self.unstarted + self.verdicts.close(), []
        self.rounds += [self._round(r) for r in unstarted]
        self.expect, self.calls = self.calls, 0

    def compressed(self) -> None:
        """At every ``compress()``: read the previous step's verdicts that are done; at the call
        that was the previous step's last (its count), wait for the others. Horovod waits for its
        own allreduces of the step before any ``decompress()``, which a rank that stopped never
        starts, so this is the last moment to read them; and by then every rank has long ended
        the previous step, so the wait costs nothing (waiting at the first call kept every rank
        idle while the slowest ended its step: a barrier a step)."""
        self.calls += 1
        if not self.rounds:
            return
        if self.calls >= self.expect:
            self.read()
            return
        rounds, self.rounds = self.rounds, []
        for i, r in enumerate(rounds):
            if r.handle[1] is not None and not hvd.poll(r.handle[1]):
                self.rounds.append(r)
                continue
            try:
                self._settle(r, None)
            except BaseException:
                self.rounds += rounds[i + 1:]
                raise

    def read(self) -> None:
        """Wait for the previous step's verdicts and read them: a CorruptionError on every member
        where one names a finding (after the barrier)."""
        rounds, self.rounds = self.rounds, []
        for r in rounds:
            self._settle(r, None)

    def forget(self) -> None:
        self.rounds = []
        self.unstarted = []
        self.verdicts.forget()

    def _start(self, records: list[StepRecord]) -> None:
        """Start ``records``' verdicts; one that Horovod refuses (it has ended: the others' last step
        was over, and they exited) waits in :attr:`unstarted` for the next step, which reads it."""
        for rec in records:
            try:
                self.rounds.append(self._round(rec))
            except RuntimeError:
                self.unstarted.append(rec)

    def _round(self, record: StepRecord) -> _Round:
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
        except (Stalled, RuntimeError) as e:  # members that never come (the last step): say so
            if bound is None:
                raise
            error = r.record.error(got, left_alone("reach their next step", None if isinstance(e, RuntimeError)
                                                   else bound))
            assert error is not None
            raise error from None
        r.gen.send(None)  # raises the error


def _bounded(handle: Any, name: str, deadline: float | None) -> None:
    """Poll the collective of ``handle`` (a transport's) until it is done or ``deadline`` passes."""
    h = handle[1]
    if deadline is None or h is None:
        return
    wait(lambda: bool(hvd.poll(h)), name, max(deadline - time.monotonic(), 0.0))
