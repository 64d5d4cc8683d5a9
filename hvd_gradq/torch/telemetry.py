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
next step's start instead."""
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

    def __init__(self, stats: Stats, world: Callable[[], dict[str, Any]], every: int = 0) -> None:
        self.stats = stats
        self.world = world
        self.every = every  # log_every: a line every this many steps (0: the first step's only)
        self._open = 0  # tensors compressed this step and not yet handed to decompress()
        self._closed = 0  # the last step whose end was seen

    def begin_step(self) -> None:
        if self.stats.clock.steps > self._closed:  # it stopped on an error before its last decompress()
            self._close()
        self._open = 0
        self.stats.begin_step()

    def compressed(self, t0: float, out: T) -> T:
        """``compress()``, started at ``t0`` (``time.perf_counter()``), hands Horovod ``out``."""
        self.stats.clock.add("compressor", time.perf_counter() - t0)
        self._open += 1
        return out

    def decompressed(self, t0: float, out: T) -> T:
        """``decompress()``, started at ``t0``, returns ``out``: the step ends with its last tensor."""
        self.stats.clock.add("compressor", time.perf_counter() - t0)
        self._open -= 1
        if self._open <= 0:
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

