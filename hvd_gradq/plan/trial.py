"""The measured choice: ``auto`` times its candidate plans in the job and keeps the fastest.

The cost model (:mod:`.decide`) ranks patterns by bytes at an assumed link rate plus CPU
figures. It cannot know what decides a real step: the step's compute, how much of the
reduction hides behind backward, the CPU left over for encoding while backward runs, the
network as it is, Horovod's own fusion. So after the job's first steps, ``auto`` runs a short
**trial** on real training steps: each *candidate plan* runs for a few steps and is timed by
whole-step time (first ``compress()`` of one step to the first of the next: forward, backward,
reduction and the optimizer), and the job then runs the fastest.

**Candidates** (:data:`PLANS`, tried in this order):

* ``compressed``: every tensor as the cost model decides (the scheme's pattern; tiny tensors
  Horovod's fp32), what ``auto`` did before it measured;
* ``fp16``: every tensor handed to Horovod as ``hvd.Compression.fp16`` would hand it (cast,
  Horovod's own allreduce and fusion buffer, cast back);
* ``mixed``: the scheme for the largest tensors, which hold :data:`LARGE_SHARE` of the elements,
  Horovod's fp16 for the rest: most of the bytes saved for a fraction of the per-tensor cost
  (tried only where it leaves out at least a quarter of the compressed tensors);
* ``fp32``: every tensor as Horovod's own allreduce, exactly (where the wire is nearly free,
  fp16's two casts cost more than the bytes they save: on loopback it beat fp16 by 1.2-1.6x).

A candidate whose first timed step takes :data:`EARLY` x the best median so far is ruled out
there (the wire at 100 Mbit/s makes fp32's step several times the best: one step says so).

**Agreement.** Every rank times its own steps; after each trial step the ranks exchange the
step's duration and take the maximum (one small allgather at the next step's start, as the
handshake runs), so every rank sees the same figures and takes the same decisions, step for
step: a plan is never half-switched. A rank that is slower is the one all others wait for, so
its time is the step's time.

**A race, in rounds.** Step times on a busy host move by tens of percent from one step to the
next, and with the load, so candidates are not timed one after another (a change of load would
decide) but in interleaved rounds: in each round every candidate still in the race runs a block
of :data:`SETTLE` untimed steps (a switch negotiates new collectives with Horovod) and
:data:`TIMED` timed ones, the incumbent first. After each round a candidate is ruled out where
its median step is above the best median by more than :data:`Z` standard errors of the
difference (the steps' spread about their medians, pooled), or :data:`ABORT` x it; the race ends
when one is left or after :data:`ROUNDS` rounds. What a trial costs is each of its steps' time
beyond the best plan's, so a clearly slower candidate is ruled out early, and one close to the
best may be timed longer because each of its steps costs little. The incumbent (the plan in
force, ``compressed`` at the start) is kept unless another's median is :data:`MARGIN` faster: a
hysteresis against switching on noise.

**Checking.** After a trial the ranks compare the median step of every :data:`CHECK_EVERY`
steps (the same exchange); where it drifts by :data:`DRIFT` from the first such median after
the trial, or :data:`EVERY` steps have passed (doubling whenever a trial keeps the plan), the
trial runs again, first the incumbent. A trial runs only while what the trials cost so far plus
what the last one cost stays under :data:`BUDGET` of the job's time: a trial's cost is each of
its steps' time beyond the best plan's.

This module is the state machine on agreed numbers only (no clock, no collective): the
frontends' core (:class:`hvd_gradq.frontend.compressor.CompressorCore`) feeds it the step
starts and the exchanges. Which pattern a tensor takes under a plan is :func:`plan_choice`.
"""
from __future__ import annotations

import enum
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .decide import Choice
from .pattern import Pattern, duration

#: The plans a trial may time, in the order it times them.
COMPRESSED, FP16, MIXED, FP32 = "compressed", "fp16", "mixed", "fp32"
PLANS = (COMPRESSED, FP16, MIXED, FP32)
#: Steps a job runs before its first trial (beyond the policy's warm-up): the first step loads
#: kernels and shakes hands, the second settles Horovod's response cache.
START = 2
#: Untimed steps after a switch (a plan's first step negotiates new collectives with Horovod).
SETTLE = 1
#: Timed steps in each block of a candidate's steps.
TIMED = 2
#: Rounds at most: every live candidate runs a block in each, in turn.
ROUNDS = 4
#: A candidate is ruled out when its median is this many standard errors above the best's...
Z = 2.0
#: ... or this many times it.
ABORT = 1.5
#: Another plan replaces the incumbent only when this much faster.
MARGIN = 0.03
#: A candidate whose first timed step takes this many times the best median so far is out at once.
EARLY = 2.0
#: ``mixed`` compresses the largest tensors that hold this share of the elements.
LARGE_SHARE = 0.90
#: Steps between two comparisons of the median step after a trial.
CHECK_EVERY = 20
#: A median step this far from the reference (either way) runs the trial again.
DRIFT = 0.20
#: Steps after a trial when it runs again anyway (doubled each time the plan stays).
EVERY = 1000
#: The share of the job's time all trials may cost.
BUDGET = 0.02


#: The tags (:func:`hvd_gradq.plan.pattern.why_tag`) of a choice a plan made, not the cost model.
MEASURED = frozenset({"trial", "measured"})


class Phase(enum.Enum):
    WARMING = "warming"  # the job's first steps: the compressed plan, untimed
    TRIAL = "trial"
    CHOSEN = "chosen"


@dataclass
class Candidate:
    """One plan's figures in the current trial (agreed: the maximum over ranks of each step)."""

    times: list[float] = field(default_factory=list)
    skipped: str = ""  # why it was not timed in this trial

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None


def pooled_spread(samples: list[list[float]]) -> float:
    """A standard deviation of one step about its candidate's median, pooled over candidates
    (1.25 x the mean absolute deviation, which is the standard deviation for normal noise and
    is not thrown by one preempted step as a sum of squares is)."""
    dev = [abs(x - statistics.median(xs)) for xs in samples if len(xs) > 1 for x in xs]
    return 1.25 * sum(dev) / len(dev) if dev else 0.0


def large_set(sizes: dict[str, int], share: float = LARGE_SHARE) -> frozenset[str]:
    """The largest tensors (by elements; ties by name, so every rank gets the same set) that
    together hold at least ``share`` of all elements."""
    total = sum(sizes.values())
    out: list[str] = []
    held = 0
    for name, n in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        if total and held >= share * total:
            break
        out.append(name)
        held += n
    return frozenset(out)


class Trial:
    """The measured choice's state, the same on every rank (it reads agreed numbers only).

    At every step start the frontend calls :meth:`begin` with its clock; where that returns a
    row, the frontend allgathers it, takes the maximum over ranks, and hands it to :meth:`agreed`
    before deciding any tensor of the step. :attr:`plan` is the step's plan."""

    def __init__(self, start: int = START, *, settle: int = SETTLE, timed: int = TIMED, rounds: int = ROUNDS,
                 margin: float = MARGIN, drift: float = DRIFT, budget: float = BUDGET, check_every: int = CHECK_EVERY,
                 every: int = EVERY) -> None:
        self.start, self.settle, self.timed, self.rounds = start, settle, timed, rounds
        self.margin, self.drift, self.budget = margin, drift, budget
        self.check_every, self.every = check_every, every
        self.phase = Phase.WARMING
        self.plan = COMPRESSED
        self.step = -1  # the step now running (0-based)
        self.sizes: dict[str, int] = {}  # tensors the compressed plan compresses, seen while warming
        self.large: frozenset[str] = frozenset()
        self.candidates: dict[str, Candidate] = {}
        self.trials = 0
        self.cost = 0.0  # what every trial so far cost beyond its best plan (seconds, agreed)
        self.last_cost = 0.0
        self.elapsed = 0.0  # the job's time since its first step (agreed: the maximum)
        self.reference: float | None = None  # the first median step after a trial
        self.why = "warming up: the first steps run the compressed plan, then a trial times the candidates"
        self.history: list[str] = []  # one line per trial: what it measured and took
        self._t0: float | None = None
        self._last: float | None = None
        self._live: list[str] = []  # candidates still in the race, the incumbent first
        self._round = self._turn = 0
        self._in_plan = 0  # steps of the current block run so far, this one included
        self.best = 0.0  # the last trial's best median step
        self._trial_times: list[float] = []  # every trial step's agreed time (its cost)
        self._window: list[float] = []  # this rank's step times since the last comparison
        self._since = 0  # steps since the last trial ended
        self._every = every
        self._incumbent = COMPRESSED
        self._reason = "the job's first steps are done"  # why the next trial runs

    # -- what the frontend feeds ----------------------------------------------------------------
    def saw(self, name: str, n: int, compressed: bool) -> None:
        """A tensor of the step (while warming): ``compressed`` under the compressed plan."""
        if self.phase is Phase.WARMING and compressed:
            self.sizes[name] = n

    def begin(self, now: float) -> NDArray[np.float64] | None:
        """A step starts at ``now`` (seconds). Returns the row to exchange (allgather, maximum,
        :meth:`agreed`) before the step decides anything, or None when there is nothing to
        exchange; :attr:`plan` is then the step's plan."""
        self.step += 1
        took = None if self._last is None else now - self._last
        self._last = now
        if self._t0 is None:
            self._t0 = now
        if took is not None:
            self._window.append(took)
        if self.phase is Phase.WARMING:
            if self.step < self.start:
                return None
            return self._row(0.0)  # the trial's first step: agree on the time so far
        if self.phase is Phase.TRIAL:
            return self._row(took or 0.0)
        self._since += 1
        if self._since % self.check_every == 0 and self._window:
            return self._row(statistics.median(self._window))
        return None

    def timing(self) -> str | None:
        """The plan whose timed step is running now (None: not a timed step of a trial)."""
        return self.plan if self.phase is Phase.TRIAL and self._in_plan > self.settle else None

    def _row(self, value: float) -> NDArray[np.float64]:
        assert self._t0 is not None and self._last is not None
        return np.array([value, self._last - self._t0, float(self.step)], np.float64)

    def agreed(self, top: NDArray[Any]) -> None:
        """The maximum over ranks of every rank's :meth:`begin` row for this step."""
        value, self.elapsed = float(top[0]), float(top[1])
        if self.phase is Phase.WARMING:
            self._open_trial(first=True)
            return
        if self.phase is Phase.TRIAL:
            self._trial_step(value)
            return
        self._window.clear()
        if self.reference is None:
            self.reference = value
            return
        drifted = abs(value / self.reference - 1.0) > self.drift
        due = self._since >= self._every
        if (drifted or due) and self.cost + self.last_cost <= self.budget * self.elapsed:
            self._reason = (f"a median step of {duration(value)} against {duration(self.reference)} after the last "
                            "trial" if drifted else f"{self._since} steps since the last trial")
            self._open_trial(first=False)

    # -- the trial ------------------------------------------------------------------------------
    def _open_trial(self, first: bool) -> None:
        self.phase = Phase.TRIAL
        self.trials += 1
        if first:
            self.large = large_set(self.sizes)
            self._incumbent = COMPRESSED
        else:
            self._incumbent = self.plan
        self.candidates = {p: Candidate() for p in PLANS}
        if not self.sizes:
            self.candidates[COMPRESSED].skipped = self.candidates[MIXED].skipped = "nothing to compress"
        elif len(self.large) > 0.75 * len(self.sizes):
            self.candidates[MIXED].skipped = (f"the largest tensors holding {LARGE_SHARE:.0%} of the elements are "
                                              f"{len(self.large)} of {len(self.sizes)}: too close to compressed")
        order = [self._incumbent] + [p for p in PLANS if p != self._incumbent]
        self._live = [p for p in order if not self.candidates[p].skipped]
        self._trial_times = []
        self._round, self._turn = 1, -1
        self._next_turn()

    def _next_turn(self) -> None:
        """The next live candidate's block of steps in this round; a new round after the last
        (eliminating what the figures so far rule out); the choice when one is left or the rounds
        are done."""
        self._turn += 1
        if self._turn >= len(self._live):
            self._eliminate()
            if len(self._live) <= 1 or self._round >= self.rounds:
                self._close_trial()
                return
            self._round, self._turn = self._round + 1, 0
        self.plan, self._in_plan = self._live[self._turn], 1  # this step is the block's first

    def _best(self) -> tuple[str, float] | None:
        """The live candidate with the lowest median step so far, and that median."""
        timed = [(p, m) for p in self._live if (m := self.candidates[p].median) is not None]
        return min(timed, key=lambda pm: pm[1]) if timed else None

    def _eliminate(self) -> None:
        """End of a round: drop each candidate whose median is above the best's by more than
        :data:`Z` standard errors of the difference (the spread of every candidate's steps about
        its own median, pooled: the machine's noise is common to them) and by more than the
        margin (one within it may still be kept as the incumbent), or by :data:`ABORT` x."""
        best = self._best()
        if best is None:
            return
        spread = pooled_spread([self.candidates[p].times for p in self._live])
        b = self.candidates[best[0]]
        for p in list(self._live):
            c = self.candidates[p]
            if p == best[0] or c.median is None:
                continue
            se = spread * (1.0 / len(c.times) + 1.0 / len(b.times)) ** 0.5
            gap = c.median - best[1]
            if c.median >= ABORT * best[1] or gap > max(Z * se, self.margin * best[1]):
                c.skipped = (f"ruled out after {len(c.times)} timed steps: a median of {duration(c.median)} against "
                             f"{best[0]}'s {duration(best[1])}")
                self._live.remove(p)

    def _trial_step(self, took: float) -> None:
        """The previous step, step :attr:`_in_plan` of :attr:`plan`'s block, took ``took``
        (agreed); what runs now."""
        self._trial_times.append(took)
        early = False
        if self._in_plan > self.settle:  # the previous step was a timed one
            c = self.candidates[self.plan]
            best = self._best()
            c.times.append(took)
            if len(c.times) == 1 and best is not None and best[0] != self.plan and took >= EARLY * best[1]:
                c.skipped = f"ruled out at its first timed step: {duration(took)}, over {EARLY:g}x {best[0]}'s median"
                self._live.remove(self.plan)
                self._turn -= 1  # the next candidate takes this one's place in the round
                early = True
        if early or self._in_plan >= self.settle + self.timed:
            self._next_turn()
            return
        self._in_plan += 1

    def _close_trial(self) -> None:
        best = self._best()
        inc = self.candidates[self._incumbent].median if self._incumbent in self._live else None
        figures = ", ".join(f"{p} {duration(c.median)}" if c.median is not None else f"{p} -"
                            for p, c in self.candidates.items())
        if best is None:
            take, why = self._incumbent, "no plan could be timed"
        elif inc is None or best[1] < (1.0 - self.margin) * inc:
            take, why = best[0], f"{best[0]} measured fastest (median steps: {figures})"
        else:
            take = self._incumbent
            why = (f"{take} kept: no plan {self.margin:.0%} faster (median steps: {figures})" if best[0] != take
                   else f"{take} measured fastest (median steps: {figures})")
        floor = best[1] if best is not None else 0.0
        self.last_cost = sum(max(t - floor, 0.0) for t in self._trial_times)
        self.cost += self.last_cost
        self.best = floor
        if take == self._incumbent and self.trials > 1:
            self._every *= 2  # a plan that holds is checked less often
        self.plan, self.phase, self.why = take, Phase.CHOSEN, why
        self.history.append(f"trial {self.trials} at step {self.step} ({self._reason}): {why}; "
                            f"cost {duration(self.last_cost)}")
        self.reference = None
        self._since = 0
        self._window.clear()

    # -- what stats() says ----------------------------------------------------------------------
    def report(self, predicted: dict[str, float] | None = None) -> dict[str, Any]:
        """The trial for ``stats()``: the plan in force and why, each candidate's measured step
        (and the cost model's seconds for its reductions, ``predicted``), what trials cost."""
        pred = predicted or {}
        return {
            "plan": self.plan, "phase": self.phase.value, "why": self.why, "trials": self.trials,
            "candidates": {p: {"measured_s": c.median, "timed_steps": len(c.times), "skipped": c.skipped or None,
                               "model_s": pred.get(p)} for p, c in self.candidates.items()},
            "cost_s": self.cost, "elapsed_s": self.elapsed,
            "cost_share": self.cost / self.elapsed if self.elapsed > 0 else 0.0,
            # what the trials cost against 1,000 steps of the plan taken (issue: <= 2%)
            "cost_per_1000_steps": self.cost / (1000 * self.best) if self.best > 0 else 0.0,
            "history": list(self.history),
        }


def plan_choice(plan: str, name: str, model: Choice, large: Iterable[str], why: Callable[[str], str]) -> Choice:
    """A tensor's choice under ``plan``: ``model`` (the cost model's :class:`~.decide.Choice`) for
    ``compressed``, and for ``mixed`` where ``name`` is among the ``large`` tensors; Horovod's fp16
    (``fp16``, ``mixed`` otherwise) or fp32 (``fp32``) for the rest, with ``why(plan)`` as the reason."""
    if plan == COMPRESSED or (plan == MIXED and name in large):
        return model
    return Choice(Pattern.FP32 if plan == FP32 else Pattern.FP16, why(plan))
