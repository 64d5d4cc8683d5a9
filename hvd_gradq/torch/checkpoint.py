"""Checkpoints of the PyTorch compressor: its per-tensor step counters and error-feedback residuals.

What a compressor must carry across a restart to resume bit for bit: each tensor's step counter
(the position of its random stream, :mod:`hvd_gradq.reduce.names`) and, with error
feedback, each rank's residuals (:class:`.feedback.TensorStore`). A residual is one rank's own rounding
error, so Horovod's usual recipe (save on rank 0, load on every rank) needs every rank's residuals
in the one file: ``all_ranks=True`` allgathers them. The state is a plain dict of tensors and
ints, so ``torch.save`` takes it next to the model and optimizer.

**A collective called by some ranks only** (``state_dict(all_ranks=True)`` inside
``if hvd.rank() == 0:``) would wait forever: Horovod has no timeout, only a stall warning. The
gather is started asynchronously and polled against a deadline (:data:`STATE_TIMEOUT`), then
refused with an error that says every rank must call it. Horovod cannot withdraw the started
gather, so the message says to end the job; each call's gather has its own name
(``hvd_gradq.state.<k>``), so a stranded one never pairs with a later, correct call.

**A checkpoint of another model.** A residual is kept flat; the state also records the shape of
the gradient it was made for (``shapes``), so that a residual that does not fit names the tensor,
both shapes and what to do: at ``load_state_dict`` when the compressor knows the model
(``named_parameters=``), else at the tensor's first step after the load
(:func:`hvd_gradq.torch.resume.check_fits`), before any arithmetic fails on it.
"""

from __future__ import annotations

import io
import itertools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import horovod.torch as hvd
import torch

from ..errors import GradqError
from ..feedback import parameter_of
from ..wire import blocks
from .store import TensorStore

#: Seconds ``state_dict(all_ranks=True)`` waits for every rank to join before it refuses. Long
#: enough for ranks that reach a checkpoint apart (rank 0 evaluating first), short of "forever".
STATE_TIMEOUT = 120.0
_CALLS = itertools.count()  # this process's all-ranks states so far: the gathers' names


@dataclass
class Loaded:
    """What :func:`load_state_dict` restored besides the residuals it put in the store: the step
    counters, every rank's residuals when the state holds them (``all_ranks=True``, same
    configuration and world size: what :func:`hvd_gradq.torch.resume.broadcast_state` hands out),
    whether this rank's residuals are its own (its own state, or its entry of every rank's), and
    the gradient shapes the residuals were made for (for messages)."""

    steps: dict[str, int]
    ranks: dict[int, dict[str, torch.Tensor]] | None = None
    own: bool = False
    shapes: dict[str, list[int]] = field(default_factory=dict)


def misfit(name: str, made_for: Any, elements: int, shape: Any) -> GradqError:
    """The error of a residual of ``elements`` elements (made for a gradient of shape ``made_for``,
    None if the checkpoint does not say) that does not fit ``name``'s gradient of ``shape`` here."""
    was = f"shape {list(made_for)} ({elements} elements)" if made_for is not None else f"{elements} elements"
    here = f"shape {list(shape)} ({math.prod(shape)} elements)"
    return GradqError(
        f"{name}: the checkpoint's error-feedback residual was made for a gradient of {was}; this model's "
        f"{name} has {here}. The compressor's state belongs to another model: load it into the model it was "
        "saved with, or leave it out (a fresh compressor: step counters and residuals start from zero)")


def state_dict(config: str, steps: Mapping[str, int], store: TensorStore, all_ranks: bool = False,
               timeout: float | None = STATE_TIMEOUT, name: str | None = None,
               shapes: Mapping[str, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """Error-feedback residuals and per-tensor step counters (the random streams' positions).

    With ``all_ranks=True`` (a collective: call it on every rank) the state holds every rank's
    residuals, so the usual Horovod recipe (save on rank 0, load on every rank) resumes exactly;
    a rank left waiting ``timeout`` seconds (None: no limit) for the others raises GradqError.
    Without it, it holds this rank's; a rank that loads another rank's state keeps the step
    counters and starts its residuals from zero (see :func:`load_state_dict`).
    """
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise GradqError(f"timeout={timeout!r} must be a positive number of seconds, or None to wait without limit")
    residuals = {k: v.detach().clone().cpu() for k, v in store.residuals.items()}
    state: dict[str, Any] = {
        "config": config,
        "rank": hvd.rank(),
        "size": hvd.size(),
        "steps": dict(steps),
        "residuals": residuals,
        "shapes": {k: list(v) for k, v in (shapes or {}).items()},
    }
    if all_ranks:
        state["ranks"] = gather(residuals, timeout, name)
    return state


def gather(residuals: dict[str, torch.Tensor], timeout: float | None,
           name: str | None = None) -> dict[int, dict[str, torch.Tensor]]:
    """Every rank's residuals, by rank: one allgather of each rank's serialized dict (its length
    first), waited for at most ``timeout`` seconds."""
    buf = io.BytesIO()
    torch.save(residuals, buf)
    data = buf.getvalue()
    framed = torch.from_numpy(blocks.block(data))
    # ``name``: an elastic job's own count a generation (:mod:`.elastic`): a rank that joined has made fewer
    name = name or f"hvd_gradq.state.{next(_CALLS)}"
    handle = hvd.allgather_async(framed, name=name)
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.001
    while not hvd.poll(handle):
        if deadline is not None and time.monotonic() > deadline:
            raise GradqError(
                f"state_dict(all_ranks=True) is a collective: call it on every rank, not inside `if hvd.rank() == "
                f"0:` (the recipe: state = compression.state_dict(all_ranks=True) on every rank, then save it on "
                f"rank 0). No other rank joined this rank's gather within {timeout:g} s. Horovod cannot withdraw "
                f"the gather started here ({name}): end the job and restart it with the call fixed. If the other "
                "ranks only reach the checkpoint later, pass state_dict(all_ranks=True, timeout=...) a longer wait "
                "(None: no limit)")
        time.sleep(pause)
        pause = min(2 * pause, 0.05)
    raw = memoryview(hvd.synchronize(handle).numpy()).tobytes()
    out: dict[int, dict[str, torch.Tensor]] = {}
    for r, chunk in enumerate(blocks.split_blocks(raw, hvd.size())):
        out[r] = torch.load(io.BytesIO(chunk), weights_only=True)
    return out


def load_state_dict(
    state: dict[str, Any], config: str, params: Mapping[str, torch.nn.Parameter], store: TensorStore,
    strict: bool = True,
) -> Loaded:
    """Check ``state`` against this compressor (``config``, and ``params`` when the compressor
    knows the model), restore ``store``'s residuals and return the step counters (:class:`Loaded`).

    Residuals belong to one rank: they are taken from the state's ``ranks`` entry
    (``all_ranks=True``) or from a state this rank saved; a state saved by another rank restores
    the step counters and zeroes this rank's residuals (a one-step bias, then error feedback
    resumes) rather than adopting another rank's. A state of another configuration (scheme,
    pattern, seed) or world size is refused, unless ``strict=False``: then the step counters are
    restored and the residuals start from zero (a residual is the rounding error of the scheme
    and ranks that made it; it does not carry over). Nothing is changed when the state is refused."""
    if not isinstance(state, dict) or not {"config", "steps", "residuals"} <= set(state):
        raise GradqError("load_state_dict expects a dict from GradqCompressor.state_dict()")
    same = state["config"] == config
    if not same and strict:
        raise GradqError(
            f"the checkpoint was made with {state['config']!r}, this compressor is {config!r}. To resume with "
            "another scheme (or pattern or seed), load it with load_state_dict(state, strict=False): step counters "
            "are kept, error-feedback residuals start from zero (those of another scheme do not carry over)")
    rank, size = hvd.rank(), hvd.size()
    there = state.get("size", size)
    residuals: dict[str, torch.Tensor] = {}
    ranks, own = None, False
    if same and "ranks" in state:  # (strict=False: another configuration's residuals are not used)
        ranks = dict(state["ranks"]) if there == size else None
        residuals, own = (dict(ranks.get(rank, {})), True) if ranks is not None else ({}, False)
    elif same and state.get("rank", rank) == rank:
        residuals, own = dict(state["residuals"]), True
    if there != size and (state["residuals"] or state.get("ranks")):
        if strict:
            raise GradqError(
                f"the checkpoint holds error-feedback residuals of {there} ranks; this job has {size}. "
                "Residuals are per rank: resume on the same number of ranks, or drop them with "
                "load_state_dict(state, strict=False) (a one-step bias, then EF resumes)"
            )
        residuals, own = {}, False
    shapes = dict(state.get("shapes") or {})
    if params:
        _check_model(residuals, params, shapes)
    steps = {str(k): int(v) for k, v in state["steps"].items()}
    store.residuals = {k: v.detach().clone().to(torch.float32) for k, v in residuals.items()}
    return Loaded(steps, ranks, own, shapes)


def _check_model(residuals: Mapping[str, torch.Tensor], params: Mapping[str, torch.nn.Parameter],
                 shapes: Mapping[str, list[int]]) -> None:
    """Refuse residuals that are not the model's: of parameters it does not have, or of another size."""
    unknown = sorted({parameter_of(k) for k in residuals} - set(params))
    if unknown:
        raise GradqError(
            f"the checkpoint has error-feedback residuals of parameters this model does not have: {unknown[:5]} "
            f"(the model's: {sorted(params)[:5]}). The compressor's state belongs to another model: load it "
            "into the model it was saved with, or leave it out (a fresh compressor)")
    for k, v in residuals.items():
        if parameter_of(k) != k:  # a scatter chunk's residual: its size follows the chunking
            continue
        if v.numel() != params[k].numel():
            raise misfit(k, shapes.get(k), v.numel(), tuple(params[k].shape))
