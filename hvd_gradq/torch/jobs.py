"""First-phase jobs of the PyTorch patterns: encode a gradient, then start its collective.

A job is a closure over the gradient and its seeds only (no frontend state), so it may run on a worker thread
(:mod:`hvd_gradq.frontend.workers`) while the training thread goes on with backward, or inline;
:class:`hvd_gradq.torch.reduce.Reducer` settles its :class:`Encoded` result on the training
thread (error feedback, byte counts, second phases), in the order the tensors came.
A gradient this rank cannot encode (NaN/Inf under ``nonfinite=raise``, a finite value beyond
the scheme's float32 range: :class:`~hvd_gradq.errors.RangeError`) sends the poison payload
(:func:`hvd_gradq.frontend.codec.poison`, which says why) in its place and hands the error back
instead of raising, so the collective the other ranks wait for is out and they stop too.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch

from ..errors import GradqError, NonFiniteError
from ..frontend import codec
from ..frontend.stats import Clock
from ..frontend.workers import wait
from ..spec import SchemeLike
from ..xp import Seed
from . import device


def sync(handle: Any, clock: Clock | None = None) -> Any:
    """``hvd.synchronize(handle)``, waiting by polls: Horovod's own wait holds the GIL, which
    would stall the worker threads for as long as the network takes. The wait counts as
    ``wait`` on ``clock`` (stats)."""
    t0 = time.perf_counter()
    wait(lambda: bool(hvd.poll(handle)))
    out = hvd.synchronize(handle)
    if clock is not None:
        clock.add("wait", time.perf_counter() - t0)
    return out


@dataclass
class Encoded:
    """What a first-phase job hands back."""

    handle: Any
    own: Any  # this rank's decoded values (NumPy): the gather payload's, or each chunk's in order
    nbytes: int = 0  # the gather payload's bytes
    lens: list[int] = field(default_factory=list)  # scatter: each chunk's payload bytes
    error: GradqError | None = None  # this rank's error: the poison went out instead
    seconds: float = 0.0  # the encoding's wall time (stats' ``encode``)


def gather_job(scheme: SchemeLike, x: torch.Tensor, seed: Seed, what: str, collective: str, process_set: Any,
               on_device: bool) -> Callable[[], Encoded]:
    """Encode flat float32 ``x`` (on its device when ``on_device``: :mod:`.device`; ``own`` is then
    a tensor there) and start the allgather of its payload."""

    def job() -> Encoded:
        t0 = time.perf_counter()
        try:
            buf, own = device.encode_any(scheme, x, seed, what, on_device)
        except GradqError as e:  # tell the other ranks, so that they raise too
            poison = torch.from_numpy(codec.poison(codec.stop_of(e)))
            return Encoded(hvd.allgather_async(poison, name=collective, process_set=process_set), None, error=e)
        handle = hvd.allgather_async(torch.from_numpy(buf), name=collective, process_set=process_set)
        return Encoded(handle, own, int(buf.shape[0]), seconds=time.perf_counter() - t0)

    return job


def scatter_job(scheme: SchemeLike, x: torch.Tensor, bounds: list[tuple[int, int]], seeds: list[Seed], what: str,
                collective: str, process_set: Any, on_device: bool) -> Callable[[], Encoded]:
    """Encode each chunk ``x[lo:hi]`` of ``bounds`` (on its device when ``on_device``) and start
    the alltoall of the payloads. A chunk this rank cannot encode makes *every* chunk a poison:
    each rank owns a chunk and must learn of it in this phase, since the second phase (each
    owner's reduced chunk, allgathered) is then started by nobody."""

    def job() -> Encoded:
        bufs: list[Any] = []
        owns: list[Any] = []
        error: GradqError | None = None
        t0 = time.perf_counter()
        xs = x if on_device else x.cpu()  # one copy to the host, not one a chunk
        for (lo, hi), seed in zip(bounds, seeds):
            try:
                b, own = device.encode_any(scheme, xs[lo:hi], seed, what, on_device)
            except GradqError as e:
                error = e
                break
            bufs.append(b)
            owns.append(own)
        if error is not None:
            why = codec.stop_of(error)
            bufs, owns = [codec.poison(why)] * len(bounds), [None] * len(bounds)
            if why is codec.Stop.NONFINITE:  # the chunk's count of NaN/Inf would mislead: say it plainly
                error = NonFiniteError(
                    f"{what}: this rank had non-finite values (NaN/Inf) in this gradient (nonfinite=raise); "
                    "the default nonfinite=propagate carries them through as Horovod does")
        lens = [int(b.shape[0]) for b in bufs]
        splits = torch.tensor(lens, dtype=torch.int32)
        handle = hvd.alltoall_async(torch.from_numpy(np.concatenate(bufs)), splits=splits, name=collective,
                                    process_set=process_set)
        return Encoded(handle, owns, lens=lens, error=error, seconds=time.perf_counter() - t0)

    return job
