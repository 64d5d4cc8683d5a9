"""N ranks in one process: the reduction core's patterns run in lock step, each collective
answered in memory with what Horovod's would return.

The quality study trains hundreds of runs; launching each under ``horovodrun`` would cost more
than the training. :func:`lockstep` runs one pattern generator a simulated rank (built by the
caller with that rank's seed words, residuals and group place) and hands each the result of the
collective they all asked for, so the study runs the library's own patterns, byte for byte:

* allgather: every rank's buffer concatenated in rank order;
* alltoall: rank j gets rank i's j-th split, for every i in rank order;
* allreduce: the element-wise sum or max over ranks (the patterns reduce integers and maxima
  only, both exact in any order, so the result is Horovod's bit for bit).

Every rank must ask for the same collective at the same point (its kind and name), as Horovod
requires; a mismatch, which would hang a real job, raises here.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import GradqError
from ..xp import Ops
from .core import Allgather, Allreduce, Alltoall, Barrier, Phases, Request, join


def _answer(ops: Ops, reqs: list[Request]) -> list[Any]:
    """Each rank's result of the one collective every rank asked for."""
    first = reqs[0]
    for r, q in enumerate(reqs):
        if type(q) is not type(first) or q.name != first.name:
            raise GradqError(f"loopback: rank {r} asked for {type(q).__name__} {q.name!r} where rank 0 asked "
                             f"for {type(first).__name__} {first.name!r}: a real job would hang here")
    n = len(reqs)
    if isinstance(first, Barrier):
        return [None] * n
    if isinstance(first, Allgather):
        out = join(ops, [q.buf for q in reqs])  # type: ignore[union-attr]
        return [out] * n
    if isinstance(first, Allreduce):
        total = reqs[0].value  # type: ignore[union-attr]
        for q in reqs[1:]:
            total = ops.maximum(total, q.value) if first.op == "max" else total + q.value  # type: ignore[union-attr]
        return [total] * n
    assert isinstance(first, Alltoall)
    starts = [np.concatenate([[0], np.cumsum(q.splits)]) for q in reqs]  # type: ignore[union-attr]
    return [join(ops, [q.buf[int(s[j]):int(s[j + 1])] for q, s in zip(reqs, starts)])  # type: ignore[union-attr]
            for j in range(n)]


def lockstep(ops: Ops, gens: list[Phases]) -> list[Any]:
    """Run one pattern generator a rank (rank order) to its end; returns each rank's result."""
    reqs = [next(g) for g in gens]
    while True:
        answers = _answer(ops, reqs)
        done: list[Any] = []
        nxt: list[Request] = []
        for g, a in zip(gens, answers):
            try:
                nxt.append(g.send(a))
            except StopIteration as stop:
                done.append(stop.value)
        if len(done) == len(gens):
            return done
        if done:
            raise GradqError("loopback: some ranks finished a reduction while others asked for another collective")
        reqs = nxt
