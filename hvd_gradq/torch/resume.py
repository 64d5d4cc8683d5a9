"""Resuming the PyTorch compressor the way Horovod's examples resume: rank 0 loads, then broadcasts.

Horovod's own recipe loads a checkpoint on rank 0 and sends it to the others with
``hvd.broadcast_parameters(model.state_dict(), root_rank=0)`` and
``hvd.broadcast_optimizer_state(opt, root_rank=0)``. Neither reaches the compressor (the latter
broadcasts the wrapped optimizer's ``state_dict()``, and a stateless optimizer not even that), and
Horovod's functions cannot be hooked cleanly, so the compressor has one call of its own beside them:

* :func:`broadcast_state` (``compression.broadcast_state(root_rank=0)``, a collective): every rank
  takes the root's step counters; where the root loaded a ``state_dict(all_ranks=True)`` each rank
  receives **its own** residuals from it (one alltoall, each rank's bytes to that rank only);
  otherwise a rank keeps residuals it loaded itself for the same step counters, and any other
  rank's residuals start from zero (a one-step bias on that rank, then error feedback resumes;
  one warning on that rank says so). The root keeps its own.
* :func:`check_first_step`: a job that forgets the call must not run on with counters that differ
  (with warm-up, Horovod stops on "Mismatched ALLREDUCE tensor shapes"; without, residuals restart
  silently). At a compressor's first reduction over the global process set, the ranks allgather a
  digest of their counters as they stood before the step; where they differ, the counters
  themselves, and every rank raises a RankMismatchError naming the tensors and the fix
  (:mod:`hvd_gradq.frontend.resume`). It runs right after the configuration handshake of that
  set, in the same ``compress()``, so it adds no wait the handshake does not already make. Not
  run: at one rank, with ``check_ranks=False``, in elastic jobs (Horovod's ``state.sync()``
  broadcasts rank 0's counters there: :mod:`.elastic`), and for a compressor that reduces over
  other process sets only.
* :func:`check_fits`: a loaded residual is checked against its gradient at that tensor's first
  step after the load (a model of other shapes, without ``named_parameters=``), with both shapes.
"""
from __future__ import annotations

import io
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch

from ..errors import GradqError
from ..frontend.resume import compare
from ..reduce import Group, names
from ..reduce.names import Kind
from ..wire import blocks
from .checkpoint import Loaded, misfit
from .store import TensorStore

logger = logging.getLogger("hvd_gradq")


@dataclass
class Resume:
    """One compressor's resume bookkeeping.

    ``armed``: the first-step check is still to run; ``before``: the step counters as they stood
    before the first step (taken at its first ``compress()``, whatever process set that reduces
    over); ``ranks``: every rank's residuals from a ``state_dict(all_ranks=True)`` loaded here,
    held until :func:`broadcast_state` hands them out or a step makes them stale; ``own``: this
    rank's residuals are its own, loaded for the counters it holds; ``unchecked``: loaded
    residuals not yet checked against their gradient; ``made_for``: the gradient shapes the
    checkpoint's residuals were made for; ``shapes``: the shapes of the gradients seen here (what
    ``state_dict()`` records)."""

    armed: bool
    before: dict[str, int] | None = None
    ranks: dict[int, dict[str, torch.Tensor]] | None = None
    own: bool = False
    unchecked: set[str] = field(default_factory=set)
    made_for: dict[str, list[int]] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def loaded(self, state: Loaded, residuals: dict[str, torch.Tensor]) -> None:
        """A ``load_state_dict``: remember what :func:`broadcast_state` and :func:`check_fits` need."""
        self.ranks, self.own, self.made_for = state.ranks, state.own, dict(state.shapes)
        self.unchecked = set(residuals)

    def begin_step(self, steps: dict[str, int]) -> None:
        """At every step's first ``compress()``: the counters before the first step, for the check;
        a loaded all-ranks state is stale once a step ran."""
        if self.armed and self.before is None:
            self.before = dict(steps)
        self.ranks, self.own = None, False

    def note(self, name: str, shape: torch.Size) -> None:
        """The gradient shape of ``name`` (once), for ``state_dict()`` to record."""
        if name not in self.shapes:
            self.shapes[name] = tuple(shape)


def check_first_step(r: Resume, group: Group, warmup: int) -> None:
    """At the compressor's first reduction over the global set: every rank's step counters must
    agree (see the module docstring); a RankMismatchError on every rank if they do not."""
    if not r.armed or group.process_set is not hvd.global_process_set:
        return
    r.armed = False
    before, r.before = r.before or {}, None
    if group.size <= 1:
        return
    compare(before, lambda obj, phase: hvd.allgather_object(obj, name=names.collective(group.key, Kind.RESUME,
                                                                                        phase=phase)), warmup)


def check_fits(r: Resume, store: TensorStore, name: str, shape: torch.Size) -> None:
    """At ``name``'s first step after a load: its loaded residual must be as large as its gradient."""
    if name not in r.unchecked:
        return
    r.unchecked.discard(name)
    e = store.residuals.get(name)
    if e is not None and e.numel() != math.prod(shape):
        raise misfit(name, r.made_for.get(name), e.numel(), tuple(shape))


def _root(root_rank: Any) -> int:
    size = hvd.size()
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or not 0 <= root_rank < size:
        raise GradqError(f"root_rank must be a rank of this job (0 to {size - 1}), not {root_rank!r}")
    return root_rank


def _scatter(ranks: dict[int, dict[str, torch.Tensor]] | None, root: int, scope: str) -> dict[str, torch.Tensor]:
    """Each rank's own residuals from the root's ``ranks`` (None on the other ranks): one alltoall
    in which the root sends rank r only rank r's ``torch.save`` bytes (one framed block,
    :mod:`hvd_gradq.wire.blocks`) and the others send nothing."""
    size = hvd.size()
    chunks = [np.zeros(0, np.uint8)] * size
    if ranks is not None:
        for r in range(size):
            if r != root:
                buf = io.BytesIO()
                torch.save(ranks.get(r, {}), buf)
                chunks[r] = blocks.block(buf.getvalue())
    splits = torch.tensor([len(c) for c in chunks], dtype=torch.int32)
    out, _ = hvd.alltoall(torch.from_numpy(np.concatenate(chunks)), splits=splits,
                          name=names.collective(scope, Kind.RESUME, "residuals"))
    raw = memoryview(out.numpy()).tobytes()
    got: dict[str, torch.Tensor] = {}
    if raw:
        got = torch.load(io.BytesIO(blocks.split_blocks(raw, 1)[0]), weights_only=True)
    return got


def broadcast_state(r: Resume, steps: dict[str, int], store: TensorStore, root_rank: Any, scope: str,
                    ef: bool) -> dict[str, int]:
    """The root's step counters for every rank, and residuals as the module docstring says; a
    collective: every rank calls it. Returns the counters this rank takes; ``store`` is updated."""
    root = _root(root_rank)
    me = hvd.rank()
    head = (dict(steps), r.ranks is not None, bool(store.residuals)) if me == root else None
    steps0, split, had = hvd.broadcast_object(head, root, name=names.collective(scope, Kind.RESUME, "head"))
    steps0 = {str(k): int(v) for k, v in steps0.items()}
    mine = _scatter(r.ranks if me == root else None, root, scope) if split else None
    if me != root:
        if mine is not None:
            store.residuals = {k: v.detach().clone().to(torch.float32) for k, v in mine.items()}
            r.unchecked = set(store.residuals)
        elif not (r.own and steps == steps0):
            if ef and had:
                logger.warning(
                    "broadcast_state: rank %d's error-feedback residuals start from zero: rank %d's state holds its "
                    "own residuals only (save state_dict(all_ranks=True) for every rank to resume its own)", me, root)
            store.residuals = {}
            r.unchecked = set()
    r.ranks, r.own = None, True
    return steps0
