"""Resuming a job: what the ranks' compressors must agree on before their first step, framework-free.

A compressor's **step counters** (one per tensor) decide its warm-up (the first ``warmup`` steps of a
tensor go as Horovod's exact fp32 allreduce) and the position of its random streams; its
**residuals** are each rank's own rounding error. Horovod's habit is to load a checkpoint on rank 0
and broadcast the model and optimizer from there (``hvd.broadcast_parameters``,
``hvd.broadcast_optimizer_state``); a compressor loaded that way on rank 0 only leaves the other
ranks with fresh counters. With warm-up, rank 0 then hands Horovod a compressed tensor's ``[1.0]``
while rank 1 hands it the whole gradient, and Horovod stops on "Mismatched ALLREDUCE tensor
shapes"; without it rank 1's residuals silently restart.

So at a compressor's first step the ranks compare a :func:`digest` of their counters as they stood
before it (one small allgather, :func:`compare`, through the frontend's own), and only where the
digests differ gather the counters themselves, for :func:`disagreement` to say which tensors
differ and how to resume (``fix``: each frontend's recipe; PyTorch's is :data:`FIX`). PyTorch runs
it in the first ``compress()`` (:mod:`hvd_gradq.torch.resume`), TensorFlow in the first run of the
traced step, before any counter moves (:mod:`hvd_gradq.tensorflow.resume`).
A counter present on some ranks only is not a disagreement (a tensor reduced over a process set
that leaves some ranks out counts only there), unless a rank holds no counter at all while others
do: a fresh compressor beside a resumed one, the rank-0-only load above.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import RankMismatchError

#: How many tensors an error names before it says how many more there are.
SHOWN = 3

#: What to do, in every PyTorch message about counters that differ.
FIX = ("After loading a checkpoint on rank 0 only, call compression.broadcast_state(root_rank=0) on every "
       "rank (beside hvd.broadcast_parameters and hvd.broadcast_optimizer_state): every rank then takes rank "
       "0's step counters, and its own residuals where rank 0 loaded a state_dict(all_ranks=True). Or load "
       "that state_dict(all_ranks=True) on every rank")


def digest(steps: Mapping[str, int]) -> tuple[int, str]:
    """(how many counters, a hash of every name and value): equal on ranks whose counters agree."""
    text = "\n".join(f"{k}={int(v)}" for k, v in sorted(steps.items()))
    return len(steps), hashlib.sha256(text.encode()).hexdigest()[:16]


def _where(step: int, warmup: int) -> str:
    """A counter as a message says it: the step, and the warm-up's part in it."""
    if warmup <= 0:
        return f"step {step}"
    return f"step {step} ({'in' if step < warmup else 'past'} the warm-up of {warmup})"


def differing(every: Sequence[Mapping[str, int]]) -> dict[str, dict[int, int]]:
    """Tensor -> {rank: counter} for each tensor whose counters differ among the ranks that hold
    it; a rank with no counters at all counts as 0 for every tensor (a fresh compressor)."""
    names = sorted({k for steps in every for k in steps})
    out: dict[str, dict[int, int]] = {}
    for name in names:
        held = {r: int(steps.get(name, 0)) for r, steps in enumerate(every) if name in steps or not steps}
        if len(set(held.values())) > 1:
            out[name] = held
    return out


def disagreement(every: Sequence[Mapping[str, int]], warmup: int, fix: str = FIX) -> str | None:
    """The error message when the ranks' counters (``every[r]``: rank r's) disagree, else None;
    ``fix``: how to resume, in the frontend's words."""
    diff = differing(every)
    if not diff:
        return None
    fresh = [r for r, steps in enumerate(every) if not steps]
    parts = []
    if fresh:
        parts.append(f"rank(s) {fresh} hold no step counter (a fresh compressor: nothing was loaded there), "
                     f"the others up to {max(len(s) for s in every)}")
    for name in list(diff)[:SHOWN]:
        parts.append(f"{name}: " + ", ".join(f"rank {r} at {_where(s, warmup)}" for r, s in diff[name].items()))
    if len(diff) > SHOWN:
        parts.append(f"and {len(diff) - SHOWN} more tensor(s)")
    return ("ranks disagree on the compressor's step counters at its first step (they decide the warm-up and the "
            "random streams, and go with each rank's error-feedback residuals; ranks that go on would hand Horovod "
            "tensors of different shapes or silently restart residuals): " + "; ".join(parts) + ". " + fix)


#: A frontend's allgather of one picklable object over the ranks: (object, phase) -> every rank's,
#: in rank order; phase None, then 2, name its two collectives apart.
Allgather = Callable[[Any, int | None], Sequence[Any]]


def compare(before: Mapping[str, int], allgather: Allgather, warmup: int, fix: str = FIX) -> None:
    """Every rank's counters as they stood before the first step (``before``) against the
    others': a :func:`digest` each through ``allgather``, and only where they differ the counters
    themselves; a RankMismatchError with :func:`disagreement`'s message on every rank where they
    disagree (every rank reads the same rows, so every rank decides alike). A collective: every
    rank calls it."""
    rows = allgather(digest(before), None)
    if len({tuple(r) for r in rows}) == 1:
        return
    every = allgather(dict(before), 2)
    msg = disagreement(every, warmup, fix)
    if msg is not None:
        raise RankMismatchError(msg)
