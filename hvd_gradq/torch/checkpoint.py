"""Checkpoints of the PyTorch compressor: its per-tensor step counters and error-feedback residuals.

What a compressor must carry across a restart to resume bit for bit: each tensor's step counter
(the position of its random stream, :func:`hvd_gradq.frontend.codec.draw_seed`) and, with error
feedback, each rank's residuals (:class:`.feedback.TensorStore`). A residual is one rank's own rounding
error, so Horovod's usual recipe (save on rank 0, load on every rank) needs every rank's residuals
in the one file: ``all_ranks=True`` allgathers them. The state is a plain dict of tensors and
ints, so ``torch.save`` takes it next to the model and optimizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import horovod.torch as hvd
import torch

from ..errors import GradqError
from ..feedback import parameter_of
from .feedback import TensorStore


def state_dict(config: str, steps: Mapping[str, int], store: TensorStore, all_ranks: bool = False) -> dict[str, Any]:
    """Error-feedback residuals and per-tensor step counters (the random streams' positions).

    With ``all_ranks=True`` (a collective: call it on every rank) the state holds every rank's
    residuals, so the usual Horovod recipe (save on rank 0, load on every rank) resumes exactly.
    Without it, it holds this rank's; a rank that loads another rank's state keeps the step
    counters and starts its residuals from zero (see :func:`load_state_dict`).
    """
    residuals = {k: v.detach().clone().cpu() for k, v in store.residuals.items()}
    state: dict[str, Any] = {
        "config": config,
        "rank": hvd.rank(),
        "size": hvd.size(),
        "steps": dict(steps),
        "residuals": residuals,
    }
    if all_ranks:
        every = hvd.allgather_object(residuals, name="hvd_gradq.state")
        state["ranks"] = dict(enumerate(every))
    return state


def load_state_dict(
    state: dict[str, Any], config: str, params: Mapping[str, torch.nn.Parameter], store: TensorStore
) -> dict[str, int]:
    """Check ``state`` against this compressor (``config``, and ``params`` when the compressor
    knows the model), restore ``store``'s residuals and return the step counters.

    Residuals belong to one rank: they are taken from the state's ``ranks`` entry
    (``all_ranks=True``) or from a state this rank saved; a state saved by another rank restores
    the step counters and zeroes this rank's residuals (a one-step bias, then error feedback
    resumes) rather than adopting another rank's. Nothing is changed when the state is refused."""
    if not isinstance(state, dict) or not {"config", "steps", "residuals"} <= set(state):
        raise GradqError("load_state_dict expects a dict from GradqCompressor.state_dict()")
    if state["config"] != config:
        raise GradqError(f"the checkpoint was made with {state['config']!r}, this compressor is {config!r}")
    rank, size = hvd.rank(), hvd.size()
    there = state.get("size", size)
    residuals: dict[str, torch.Tensor] = {}
    if "ranks" in state:
        residuals = dict(state["ranks"].get(rank, {})) if there == size else {}
    elif state.get("rank", rank) == rank:
        residuals = dict(state["residuals"])
    if there != size and (state["residuals"] or state.get("ranks")):
        raise GradqError(
            f"the checkpoint holds error-feedback residuals of {there} ranks; this job has {size}. "
            "Residuals are per rank: resume on the same number of ranks, or drop them with "
            "state['residuals'] = {} and state.pop('ranks', None) (a one-step bias, then EF resumes)"
        )
    if params:
        unknown = sorted({parameter_of(k) for k in residuals} - set(params))
        if unknown:
            raise GradqError(f"the checkpoint has residuals for unknown parameters: {unknown[:5]}")
        for k, v in residuals.items():
            if parameter_of(k) != k:  # a scatter chunk's residual: its size follows the chunking
                continue
            n = params[k].numel()
            if v.numel() != n:
                raise GradqError(f"residual of {k!r} has {v.numel()} elements; the parameter has {n}")
    steps = {str(k): int(v) for k, v in state["steps"].items()}
    store.residuals = {k: v.detach().clone().to(torch.float32) for k, v in residuals.items()}
    return steps
