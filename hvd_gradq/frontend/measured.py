"""``auto``'s measured choice as a compressor runs it: :class:`Measured`, for both frontends'
core (:class:`~.compressor.CompressorCore`), around the framework-free trial
(:class:`hvd_gradq.plan.trial.Trial`).

It owns what the trial needs from a running job and nothing else: the clock at each step's
start, the exchange of step times (the frontend's allgather, the maximum over ranks, bounded as
the handshake is), the process set those times are compared on (the first step's; a step that
starts on another stops the trial for good, since times of two sets are not one step's), the
tensors seen while the job warms up (what ``mixed`` picks from, and what the cost model's
prediction of each plan sums over), the plan's choice for each tensor, and the report, with what
each tensor's reduction added after backward under each plan where the frontend can say
(PyTorch: :class:`hvd_gradq.torch.telemetry.Telemetry`; this rank's figures, reported only)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .. import log
from ..plan.decide import Choice
from ..plan.pattern import Pattern, compresses
from ..plan.trial import COMPRESSED, PLANS, Phase, Trial, plan_choice
from ..reduce import handshake
from ..reduce.names import Kind
from . import prefetch

#: A frontend's bounded allgather (:data:`hvd_gradq.frontend.compressor.Gather`).
Gather = Callable[[NDArray[Any], Kind, float], NDArray[Any]]
#: The cost model's choice for a tensor of (n, ndim, size, local).
Model = Callable[[int, int, int, int], Choice]
#: The cost model's seconds for a tensor of (n, ndim, size, local) under a pattern.
Price = Callable[[int, int, int, int, Pattern], float]
#: Tensors the report names under each plan: those whose reductions added the most after backward.
SLOWEST = 3


class Measured:
    """The trial of one compressor (None: ``auto`` does not measure; ``off`` says why)."""

    def __init__(self, trial: Trial | None, off: str = "") -> None:
        self.trial = trial
        self.off = off
        self.key: Hashable = None  # the process set whose steps are timed
        self.seen: dict[str, tuple[int, int, int, int]] = {}  # name: n, ndim, size, local (while warming)
        self.after: dict[str, dict[str, list[float]]] = {}  # plan: tensor: seconds after backward, this trial
        self._after_of = 0  # the trial they belong to

    def step(self, key: Hashable, size: int, gather: Gather | None, timeout: float, frontend: str,
             report: Callable[[], dict[str, Any]]) -> None:
        """At a step's first reduction (over process set ``key`` of ``size`` ranks, after its
        handshake): the trial's step start, and where it asks, the exchange of step times through
        ``gather`` (the maximum over ranks), before any tensor of the step is decided. The line
        of a trial that ends is logged (:func:`hvd_gradq.log.trial_done`, ``report()``: what
        ``stats()['auto']`` says)."""
        t = self.trial
        if t is None or size <= 1 or gather is None:
            return
        if self.key is None:
            self.key = key
        elif key != self.key:
            self.trial = None
            self.off = (f"not measured: steps start on more than one process set ({self.key!r}, {key!r}); every "
                        "tensor as the cost model decides")
            return
        if t.phase is Phase.WARMING and t.step + 1 >= t.start:
            prefetch.settle()  # kernels still loading beside the trial would time their loading
        row = t.begin(time.perf_counter())
        if row is None:
            return
        before = t.phase
        try:
            rows = gather(row, Kind.TRIAL, timeout)
        except handshake.Stalled as e:
            raise handshake.stalled(e, frontend, "the trial's step times", size) from None
        t.agreed(np.asarray(rows, np.float64).reshape(-1, row.size).max(axis=0))
        if before is Phase.TRIAL and t.phase is Phase.CHOSEN:
            log.trial_done(report())

    def after_backward(self, seconds: dict[str, float]) -> None:
        """A step's seconds each tensor's reduction added after backward ended (this rank's),
        kept under its plan where the trial timed the step."""
        t = self.trial
        plan = None if t is None else t.timing()
        if t is None or plan is None:
            return
        if self._after_of != t.trials:
            self.after, self._after_of = {}, t.trials
        kept = self.after.setdefault(plan, {})
        for name, s in seconds.items():
            kept.setdefault(name, []).append(s)

    def choose(self, name: str | None, n: int, ndim: int, size: int, local: int, model: Choice) -> Choice:
        """Tensor ``name``'s choice under the step's plan, ``model`` being the cost model's."""
        t = self.trial
        if t is None or size <= 1 or name is None:
            return model
        if t.phase is Phase.WARMING:
            t.saw(name, n, compresses(model.pattern))
            self.seen[name] = (n, ndim, size, local)
        if t.plan == COMPRESSED:
            return model
        return plan_choice(t.plan, name, model, t.large, self._why)

    def _why(self, plan: str) -> str:
        t = self.trial
        assert t is not None
        if t.phase is Phase.TRIAL:
            return f"trial: timing plan {plan} (trial {t.trials})"
        return f"measured: {t.why}"

    def report(self, model: Model, price: Price) -> dict[str, Any]:
        """``stats()['auto']``: the trial's report (:meth:`hvd_gradq.plan.trial.Trial.report`) with
        the cost model's seconds for each plan's reductions of the tensors seen (``price`` of
        each tensor under the plan's choice) beside the measured steps."""
        t = self.trial
        if t is None:
            return {"plan": None, "why": self.off}
        predicted = {}
        for plan in PLANS:
            predicted[plan] = sum(price(*shape, plan_choice(plan, name, model(*shape), t.large, str).pattern)
                                  for name, shape in self.seen.items())
        out = t.report(predicted)
        for plan, c in out["candidates"].items():
            medians = {k: statistics.median(v) for k, v in self.after.get(plan, {}).items()}
            c["after_backward_s"] = sum(medians.values()) if medians else None
            c["slowest"] = sorted(medians.items(), key=lambda kv: -kv[1])[:SLOWEST]
        return out
