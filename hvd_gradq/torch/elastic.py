"""Elastic Horovod for the PyTorch compressor: its state inside ``hvd.elastic.TorchState``.

**What the user does.** Nothing beyond Horovod's recipe: the optimizer is in the state, as in
every elastic script (``hvd.elastic.TorchState(model, optimizer, ...)``), and the compressor inside
that ``DistributedOptimizer`` follows it. Importing :mod:`hvd_gradq.torch` adds two handlers to
the front of Horovod's public handler registry (``horovod.torch.elastic.state``): one for any
optimizer (Horovod's own :class:`OptimizerStateHandler`, plus the hvd_gradq compressor it holds,
if any) and one for a compressor passed to the state by itself
(``TorchState(model, optimizer, compression=compression)``). A compressor in an elastic job that
no state holds refuses its first step: nothing would roll its residuals back after a failed step,
and a rank that joins would not learn the step counters.

**What the handlers do** (the rules are :mod:`hvd_gradq.frontend.elastic`'s):

* ``save()`` (``state.commit()``): copies the residuals, step counters and seed;
* ``restore()`` (after a failed step, before the reset): puts them back, so a step that failed on
  one rank leaves no residual half-updated on any, and forgets the failed step's collectives;
* ``sync()`` (after each reset, unless Horovod skips it when hosts were only removed): rank 0's
  generation + 1, step counters and seed for everyone, then :meth:`Elastic.new_world`.

At the first ``compress()`` of every step :meth:`Elastic.begin_step` compares Horovod's world with
the one the compressor last agreed on; a change that no ``sync()`` announced (Horovod skips it when
hosts were only removed, and every survivor sees the same change) counts as a reset too.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import horovod.torch as hvd
import torch
from horovod.torch.elastic import state as hvd_state

from ..errors import GradqError
from ..feedback import Memory
from ..frontend import elastic
from ..frontend.elastic import Generation, World
from .reduce import Reducer
from .store import TensorStore


class Host(Protocol):
    """What the elastic side reads and resets of its compressor (:class:`.compressor.GradqCompressor`
    is one; this module names no compressor class, so the two modules do not import each other:
    the compressor class registers itself, :func:`register`)."""

    seed: int
    memory: Memory
    _store: TensorStore
    _steps: dict[str, int]
    _reducer: Reducer
    _decompressing: bool
    _local: int | None
    _elastic: Elastic

    def forget_handshakes(self) -> None: ...

logger = logging.getLogger("hvd_gradq")


def world() -> World:
    """Horovod's world as this rank sees it now."""
    return elastic.world_of(hvd)


@dataclass
class Saved:
    """What ``commit()`` keeps: residuals (copies), step counters, seed, and the world the
    residuals were made in."""

    residuals: dict[str, torch.Tensor]
    steps: dict[str, int]
    seed: int
    made_in: World | None


@dataclass
class Elastic:
    """One compressor's elastic side: its generation, the world its residuals were made in, the
    last commit, and the handler of the state that holds it."""

    c: Host
    generation: Generation = field(default_factory=Generation)
    made_in: World | None = None  # the world the residuals were made in (None: no residuals yet)
    saved: Saved | None = None
    handler: Any = None  # the state handler that owns this compressor (the last one made)
    state_calls: int = 0  # all-ranks state_dict() calls in this generation

    def prefix(self) -> str:
        """What this generation adds to every collective name (empty outside elastic jobs)."""
        return self.generation.prefix()

    def state_name(self) -> str | None:
        """The name of ``state_dict(all_ranks=True)``'s gather in an elastic job: counted within the
        generation, so a rank that joined (and has gathered fewer states) names it as the others do;
        None outside elastic jobs (the process-wide count)."""
        if not self.generation.number:
            return None
        self.state_calls += 1
        return f"hvd_gradq.state.{self.prefix()}{self.state_calls}"

    # -- at each step -----------------------------------------------------------------------------
    def begin_step(self) -> None:
        """At the first ``compress()`` of a step: refuse a compressor no state holds; take a
        world change that no ``sync()`` announced as a reset."""
        if not elastic.active():
            return
        if self.handler is None:
            raise GradqError(
                "in an elastic Horovod job (hvd.elastic.run) the compressor's state must be part of the elastic "
                "state: put the DistributedOptimizer that holds it (or the compressor itself) in the state, e.g. "
                "hvd.elastic.TorchState(model, optimizer, ...), after building the optimizer; its residuals and "
                "step counters are then committed, restored and synced with the model")
        now = world()
        if self.generation.world is not None and self.generation.world != now:
            self.new_world(self.generation.number + 1, now)
        elif self.generation.world is None:
            self.generation.world = now

    # -- the state handler's three calls ----------------------------------------------------------
    def commit(self) -> None:
        c = self.c
        self.saved = Saved({k: v.detach().clone() for k, v in c._store.residuals.items()}, dict(c._steps),
                           c.seed, self.made_in)

    def restore(self) -> None:
        c = self.c
        self.forget_step()
        if self.saved is None:
            return
        s = self.saved
        c._store.residuals = {k: v.detach().clone() for k, v in s.residuals.items()}
        c._steps = dict(s.steps)
        self._set_seed(s.seed)
        self.made_in = s.made_in

    def sync(self) -> None:
        """Rank 0's generation + 1, step counters and seed for every rank, then the new world."""
        c = self.c
        number, c._steps, seed = elastic.agree(hvd, "hvd_gradq.elastic.sync", self.generation.number,
                                               dict(c._steps), c.seed)
        if seed != c.seed:
            self._set_seed(seed)
        self.new_world(number, world())

    # -- a new world ------------------------------------------------------------------------------
    def new_world(self, number: int, now: World) -> None:
        """Forget every decision and in-flight collective of the old world and apply the residual
        rule (:func:`hvd_gradq.frontend.elastic.carry_over`) for ``now``."""
        c = self.c
        self.forget_step()
        self.generation = Generation(number, now)
        self.state_calls = 0
        c.forget_handshakes()
        c._local = None
        store = c._store
        kept, dropped = elastic.carry_over(list(store.residuals), self.made_in, now)
        for k in dropped:
            store.forget(k)
        elastic.log_carry_over(dropped, kept, self.made_in, now)
        self.made_in = now

    def forget_step(self) -> None:
        """Drop the contexts of a step that will not finish (its collectives died with the world):
        wait for jobs already on a worker thread, whatever their outcome, so none starts a
        collective later, and start the next step afresh."""
        c = self.c
        c._reducer.forget()
        c.memory.begin_step(None)
        c._decompressing = True

    def _set_seed(self, seed: int) -> None:
        c = self.c
        c.seed = c._reducer.seed = seed


def of(c: Host) -> Elastic:
    """The compressor's elastic side."""
    e: Elastic = c._elastic
    return e


class CompressorStateHandler(hvd_state.StateHandler):  # type: ignore[misc]
    """Horovod's state handler for an hvd_gradq compressor (:class:`Elastic` does the work). The
    last handler made for a compressor owns it; earlier ones (the same compressor passed to the
    state directly and inside its optimizer) do nothing, so a reset counts once."""

    def __init__(self, compressor: Host) -> None:
        super().__init__(compressor)
        of(compressor).handler = self
        self.save()

    def _mine(self) -> Elastic | None:
        e = of(self.value)
        return e if e.handler is self else None

    def save(self) -> None:
        if (e := self._mine()) is not None:
            e.commit()

    def restore(self) -> None:
        if (e := self._mine()) is not None:
            e.restore()

    def sync(self) -> None:
        if (e := self._mine()) is not None:
            e.sync()


class OptimizerStateHandler(hvd_state.OptimizerStateHandler):  # type: ignore[misc]
    """Horovod's own optimizer handler, plus the hvd_gradq compressor of a ``DistributedOptimizer``."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        super().__init__(optimizer)
        comp = getattr(optimizer, "_compression", None)
        # the compressor class registered itself (register()): no import back up to .compressor
        ours = _COMPRESSOR_TYPES and isinstance(comp, _COMPRESSOR_TYPES)
        self._compressor = CompressorStateHandler(comp) if ours and comp is not None else None

    def save(self) -> None:
        super().save()
        if self._compressor is not None:
            self._compressor.save()

    def restore(self) -> None:
        super().restore()
        if self._compressor is not None:
            self._compressor.restore()

    def sync(self) -> None:
        super().sync()
        if self._compressor is not None:
            self._compressor.sync()


_COMPRESSOR_TYPES: tuple[type, ...] = ()


def register(compressor_type: type) -> None:
    """Put the two handlers at the front of Horovod's registry (once)."""
    global _COMPRESSOR_TYPES
    if compressor_type not in _COMPRESSOR_TYPES:
        _COMPRESSOR_TYPES += (compressor_type,)
    registry = list(hvd_state.get_handler_registry())
    if any(cls is CompressorStateHandler for _, cls in registry):
        return
    ours = [(compressor_type, CompressorStateHandler), (torch.optim.Optimizer, OptimizerStateHandler)]
    hvd_state.set_handler_registry(ours + registry)
