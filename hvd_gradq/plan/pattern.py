"""The communication patterns a tensor can take, by name, and the words a decision gives for one.

* ``gather``: every rank's payload is allgathered; each rank decodes all N payloads in rank
  order and sums them. A rank receives (N-1) payloads. Works for every scheme.
* ``summable``: for schemes whose levels are evenly spaced (``Combine.SUMMABLE``), the ranks
  first agree on a shared scale per bucket (a max-allreduce of a few floats a bucket); then
  integer codes add up exactly. Codes are packed ``fields`` to an int32 lane with enough
  headroom that the sum over N ranks cannot carry into the next field
  (:func:`hvd_gradq.plan.layout.lanes_for`), and summed by an ordinary (ring) allreduce: about
  2(N-1)/N lanes a rank, whatever N.
* ``scatter``: scatter-reduce + allgather. Each rank's tensor is cut into N chunks on bucket
  boundaries (:func:`hvd_gradq.plan.layout.chunk_bounds`), each chunk compressed on its own; an
  alltoall hands rank j every rank's chunk j, rank j decodes and sums them, re-compresses the sum
  (with its own error feedback when ``ef``) and an allgather spreads the N reduced chunks. About
  2(N-1)/N payloads a rank, whatever N, at the price of a second quantization of the sum, a cheap
  unbiased one (:func:`hvd_gradq.plan.second_phase.reduced_scheme`: stochastic rounding on evenly
  spaced levels) fine enough that it adds no more noise than the first.
* ``hierarchical``: with several ranks a host (``local`` > 1, hosts alike), the way Horovod's
  hierarchical allreduce splits the work: the host's ranks first reduce-scatter the fp32 tensor
  among themselves (exact; over loopback or shared memory, never the host's link), each owns
  1/local of the host's sum and reduces it with the ranks that own the same piece on the other
  hosts by ``gather`` or ``scatter`` (the choice's ``cross``), compressed, then hands the result
  to the host's other ranks. Only 1/local of the tensor a rank crosses hosts, and each host's sum
  is quantized once, not each rank's gradient.

Each pattern's phases are written once in :mod:`hvd_gradq.reduce` (its table,
:mod:`hvd_gradq.reduce.table`, maps a pattern to them); which one a tensor takes is
:func:`hvd_gradq.plan.decide.decide`'s.
"""

from __future__ import annotations

import enum

from ..errors import SpecError
from ..policy import Policy


class Pattern(enum.Enum):
    AUTO = "auto"
    GATHER = "gather"
    SUMMABLE = "summable"
    SCATTER = "scatter"
    HIERARCHICAL = "hierarchical"
    FP32 = "fp32"  # a decision, not a request: Horovod's own allreduce of the tensor, exactly
    FP16 = "fp16"  # a decision: Horovod's Compression.fp16 (cast, Horovod's allreduce, cast back)

REQUESTABLE = (Pattern.AUTO, Pattern.GATHER, Pattern.SUMMABLE, Pattern.SCATTER, Pattern.HIERARCHICAL)

EVERY = frozenset({Pattern.GATHER, Pattern.SUMMABLE, Pattern.SCATTER, Pattern.HIERARCHICAL})

CROSS = frozenset({Pattern.GATHER, Pattern.SCATTER})  # how a hierarchical piece crosses hosts

#: Said once when ``pattern=hierarchical`` cannot run as asked.
HIERARCHICAL_ALONE = (
    "pattern=hierarchical needs several hosts with several ranks each (alike, ranks numbered host by host, "
    "Horovod's global process set); this job is not laid out so (one host, one rank a host, unlike hosts or "
    "a process set), so each tensor runs as hierarchical's cross-host part alone: gather or scatter, as "
    "pattern=auto would choose between them. Request gather or scatter to choose yourself")

def parse_pattern(value: str | Pattern) -> Pattern:
    try:
        p = value if isinstance(value, Pattern) else Pattern(str(value).lower())
    except ValueError:
        p = None
    if p not in REQUESTABLE:
        raise SpecError(f"pattern={value!r} is not valid; valid: {', '.join(p.value for p in REQUESTABLE)}")
    assert p is not None
    return p

#: Why a tensor reduced over one rank is not compressed (the PyTorch frontend's pass-through).
ONE_RANK_WHY = "one rank: nothing to exchange, Horovod's allreduce passes it through"

def warmup_why(policy: Policy, step: int, then: Pattern) -> str:
    """Why a tensor's ``step`` (0-based) goes fp32: the warm-up (:func:`in_warmup`), and what follows."""
    return f"warm-up: step {step + 1} of {policy.warmup}, then {then.value}"

def compresses(pattern: Pattern | None) -> bool:
    """Whether a decision sends the tensor through hvd_gradq's own collectives (not Horovod's
    fp32 allreduce, None in TensorFlow's slots, nor its fp16): only those warm up, and only those
    a measured ``mixed`` plan may keep compressed."""
    return pattern not in (None, Pattern.FP32, Pattern.FP16)


def why_tag(why: str) -> str:
    """The tag of a reason of :func:`hvd_gradq.plan.decide.decide`: ``auto``, ``no saving``, ``warm-up``..."""
    return why.split(":", 1)[0]

def in_warmup(policy: Policy, step: int) -> bool:
    """Whether a tensor's ``step`` (0-based, counted per tensor) is still in the policy's
    ``warmup``: sent as Horovod's exact fp32 allreduce, as PowerSGD's ``start_powerSGD_iter``
    does, because the first steps of training (large, fast-changing gradients, momentum and
    Adam statistics still forming) are where quantization noise costs the most accuracy for
    the fewest bytes saved. Error feedback neither reads nor writes residuals during warm-up."""
    return step < policy.warmup

def duration(seconds: float) -> str:
    """A time, short: ``1.8 ms``, ``42 us``, ``21.2 s``."""
    if seconds >= 1.0:
        return f"{seconds:.3g} s"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} us"
