"""The TensorFlow compressor's telemetry: steps, host time, bytes from the slots, the log lines.

``compress()`` and ``decompress()`` run while Horovod traces the reduction, once; what runs each
step is the graph. So the figures a step produces are recorded by the graph itself:

* **Steps**: the first ``compress()`` in each traced function adds one small stateful host
  callback (``hvd_gradq_step``), which TensorFlow runs at every call of the function (eager
  reductions count at the call). Its second run is the first step's end: a ``tf.function`` call
  returns only when all its ops are done.
* **Time**, the same kinds as PyTorch's, as a graph lets them be measured: each host encode/decode
  (:mod:`.host`) adds its wall time to the step its variable's own step counter names
  (:func:`.host.recording`), and to ``compressor`` (``compress()``/``decompress()`` themselves
  run once, while Horovod traces: per step, the compressor's work on the host is those
  functions); ``wait`` is the time from a payload leaving its encoder to the collective's result
  reaching its decoder (:class:`.host.Handoff`). The summable pattern runs in graph ops, not
  timed.
* **Bytes**: each slot's static bytes a step, times its step counter (:class:`.state.Slot`); a
  gradient whose plan changes from step to step (``auto`` measuring: :mod:`.switch`), each
  branch's bytes times the steps it ran.

The first-step line (:func:`hvd_gradq.log.first_step`) is logged once step 1's figures are all
in: when a host call of a later step arrives, or, for a compressor without host work, at the
second step's callback. The log's byte figures count each slot once (a step), so the callback
never reads a variable while the graph runs.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from .. import log
from ..reduce.stats import Stats
from . import host
from .callsite import function_graph
from .slots import Slot

#: (a slot, whether every step counts) -> (pattern, bytes sent, received, steps) a branch it ran, or None
Rows = Callable[[Slot, bool], "list[tuple[str, int, int, int]] | None"]


class Telemetry:
    """One compressor's figures (``stats``, the compressor's: :class:`~hvd_gradq.frontend.compressor.CompressorCore`
    decides what goes in) and its slots; ``world`` says what the run is."""

    def __init__(self, stats: Stats, world: Callable[[], dict[str, Any]], slots: Callable[[], Iterable[Slot]],
                 every: int = 0, rows: Rows | None = None) -> None:
        self.stats = stats
        self.rows = rows  # a switched slot's bytes by branch (.switch.Switch.rows)
        self.world = world
        self.slots = slots
        self.every = every  # log_every: a line every this many steps (0: the first step's only)
        self._graphs: weakref.WeakSet[Any] = weakref.WeakSet()  # traced functions holding a step callback
        self._calls = 0
        self._logged = 0  # the last step logged
        self._lock = threading.Lock()

    # -- in compress(), while tracing -----------------------------------------------------------
    def mark(self) -> None:
        """Count this reduction's steps: a callback in each traced function, or, eagerly, now."""
        if tf.executing_eagerly():
            self._called()
            return
        graph = function_graph()
        if graph in self._graphs:
            return
        self._graphs.add(graph)
        tf.numpy_function(self._called, [], [], stateful=True, name="hvd_gradq_step")

    @contextmanager
    def recording(self, step: Any) -> Iterator[None]:
        """Around a tensor's ``compress()``: count the step (:meth:`mark`) and time its host
        functions into ``step`` (the slot's step counter, a tensor of the graph, or an int)."""
        self.mark()
        with host.recording(self.record, step):
            yield

    def timing(self, step: Any) -> AbstractContextManager[None]:
        """Around a tensor's ``decompress()``: time its host functions into ``step``."""
        return host.recording(self.record, step)

    def record(self, kind: str, seconds: float, step: int) -> None:
        """A host function's time, or a wait (:func:`.host.timed`); ``step`` is its variable's
        step counter before this step (0-based). Encode and decode count as ``compressor`` too."""
        newer = self.stats.clock.add(kind, seconds, step + 1)
        if kind in ("encode", "decode"):
            self.stats.clock.add("compressor", seconds, step + 1)
        if newer and step >= 1:
            self._log(step)  # step + 1 began: step is over on every variable

    # -- each step ---------------------------------------------------------------------------------
    def _called(self) -> None:
        with self._lock:
            self._calls += 1
            calls = self._calls
        if calls >= 2 and self.stats.clock.steps == 0:  # nothing runs on the host: no time to wait for
            self._log(calls - 1)

    def _log(self, step: int) -> None:
        with self._lock:
            if step <= self._logged:
                return
            first = self._logged == 0
            self._logged = step
        log.step_done(step, hvd.rank(), self.every, lambda: self.summary(counted=False, time_of=step), first)

    # -- reading ---------------------------------------------------------------------------------
    def summary(self, counted: bool = True, time_of: int | None = None) -> dict[str, Any]:
        """:meth:`hvd_gradq.reduce.stats.Stats.summary` with the slots' bytes: their step
        counters times their bytes a step (``counted``), or each slot once (a step: what the log
        says, read without touching a variable)."""
        view = self.stats.fresh()
        for s in self.slots():
            rows = self.rows(s, counted) if self.rows is not None else None
            if rows is not None and s.key in view.tensors:
                t = view.tensors[s.key]
                for pattern, sent, received, k in rows:  # the last is the live decision's pattern
                    view.decide(s.key, pattern, t.why, t.elements, t.ranks)
                    view.record(s.key, sent, received, steps=k)
                continue
            k = int(s.step.numpy()) if counted else 1
            if k and s.key in view.tensors:
                view.record(s.key, s.sent, s.received, steps=k)
        return view.summary(self.world(), steps=self._calls, time_of=time_of)
