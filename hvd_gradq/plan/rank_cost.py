"""What one rank sends and receives a step for one tensor, by the pattern it takes: the one cost
function of the model (:func:`~.decide.cost` prices a host's link for ``decide``; this prices a
rank, for ``stats()``). TensorFlow's ``stats()`` reads it, since its graph fixes every size when it
is traced; PyTorch counts the payloads it sends as it goes. Gather, summable and scatter are
:func:`~.decide.cost` (one rank a host); hierarchical is exact per rank, from the payload sizes
of the piece this rank owns.
"""
from __future__ import annotations

from ..schemes.scheme import Scheme
from ..wire.payload import header_size
from .decide import Choice, Cost, cost, fp16_cost, fp32_cost
from .hosts import Hosts
from .layout import chunk_bounds
from .pattern import Pattern
from .second_phase import reduced_scheme


def rank_cost(scheme: Scheme, n: int, ndim: int, size: int, local: int, rank: int, choice: Choice | None) -> Cost:
    """What this rank sends and receives per step under ``choice`` (None: Horovod's fp32), for
    ``stats()``: hierarchical, the payloads of its own piece that cross hosts as the choice's
    cross part sends them (exact, from the payload sizes, as PyTorch counts them); the other
    patterns, :func:`~hvd_gradq.plan.decide.cost`."""
    pattern = None if choice is None else choice.pattern
    if size <= 1 or choice is None or pattern is Pattern.FP32:
        return fp32_cost(n, size)
    if pattern is Pattern.FP16:  # the cost model's fallback: Horovod's fp16 ring
        return fp16_cost(n, size)
    if pattern is not Pattern.HIERARCHICAL:
        return cost(scheme, n, ndim, size, pattern)
    h = Hosts(size, local, rank)
    lo, hi = chunk_bounds(n, scheme.bucket, local)[h.local_rank]
    others = h.count - 1
    if choice.cross is Pattern.GATHER:
        c = header_size(scheme.spec, 1) + scheme.nbytes(hi - lo)
        return Cost(others * c, others * c)
    fine = reduced_scheme(scheme, h.count)
    subs = [b - a for a, b in chunk_bounds(hi - lo, scheme.bucket, h.count)]
    first = [header_size(scheme.spec, 1) + scheme.nbytes(k) for k in subs]
    second = [header_size(fine.spec, 1) + fine.nbytes(k) for k in subs]
    me = h.host
    return Cost(sum(first) - first[me] + others * second[me], others * first[me] + sum(second) - second[me])
