"""The PyTorch compressor's steps as telemetry sees them: where one ends, the training thread's
time inside ``compress()`` / ``decompress()``, and the log lines (:mod:`hvd_gradq.log`: the
first step's, one every ``log_every`` steps).

The compressor calls :meth:`Telemetry.compressed` / :meth:`Telemetry.decompressed` as it
returns, rather than being wrapped by a decorator: ``compress()`` reads Horovod's calling frame
a fixed depth up (:mod:`.callsite`), which a wrapper's frame would shift.

A step starts at the first ``compress()`` after a ``decompress()`` (the compressor's own rule)
and ends at the ``decompress()`` that settles the last tensor it compressed: Horovod's
``synchronize()`` compresses every tensor of a step before it waits on any (NOTES section 9),
and hands each one back to ``decompress()`` exactly once, so a count of open tensors reaching
zero is the step's end, with every figure in. A step that stopped on an error is closed at the
next step's start instead.

**What each tensor's reduction adds after backward.** For the same reason, the last
``compress()`` of a step returns as backward ends (or as ``synchronize()`` starts), and the
``decompress()`` calls that follow come one after another as each tensor's reduction is waited
for and finished: the time from the previous one's end (or from backward's) to a tensor's
``decompress()`` end is what that tensor's reduction added to the step beyond what hid behind
backward. Each step's figures go to ``after`` (``auto``'s trial keeps them by plan:
:meth:`hvd_gradq.frontend.measured.Measured.after_backward`)."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import horovod.torch as hvd

from .. import log
from ..reduce.stats import Stats

T = TypeVar("T")


class Telemetry:
    """Step boundaries and log lines for one compressor; ``world`` says what the run is."""

    def __init__(self, stats: Stats, world: Callable[[], dict[str, Any]], every: int = 0,
                 after: Callable[[dict[str, float]], None] | None = None) -> None:
        self.stats = stats
        self.world = world
        self.every = every  # log_every: a line every this many steps (0: the first step's only)
        self.after = after
        self._open = 0  # tensors compressed this step and not yet handed to decompress()
        self._closed = 0  # the last step whose end was seen
        self._backward = 0.0  # when the step's last compress() returned (perf_counter)
        self._done = 0.0  # when its last decompress() so far returned
        self._added: dict[str, float] = {}  # seconds each tensor's reduction added after backward

    def begin_step(self) -> None:
        if self.stats.clock.steps > self._closed:  # it stopped on an error before its last decompress()
            self._close()
        self._open, self._done, self._added = 0, 0.0, {}
        self.stats.begin_step()

    def compressed(self, t0: float, out: T) -> T:
        """``compress()``, started at ``t0`` (``time.perf_counter()``), hands Horovod ``out``."""
        self._backward = time.perf_counter()
        self.stats.clock.add("compressor", self._backward - t0)
        self._open += 1
        return out

    def decompressed(self, t0: float, out: T, name: str) -> T:
        """``decompress()`` of tensor ``name``, started at ``t0``, returns ``out``: the step ends
        with its last tensor."""
        now = time.perf_counter()
        self.stats.clock.add("compressor", now - t0)
        self._added[name] = max(now - max(self._done, self._backward), 0.0)
        self._done = now
        self._open -= 1
        if self._open <= 0:
            if self.after is not None:
                self.after(self._added)
            self._close()
        return out

    def summary(self) -> dict[str, Any]:
        return self.stats.summary(self.world())

    def _close(self) -> None:
        step = self.stats.clock.steps
        if step <= self._closed:
            return
        self._closed = step
        log.step_done(step, hvd.rank(), self.every, self.summary)

