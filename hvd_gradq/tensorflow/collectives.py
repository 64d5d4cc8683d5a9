"""The gather and summable patterns as ``compress()`` starts and ``decompress()`` finishes them
(the scatter pattern's: :mod:`.scatter`; the hierarchical one's: :mod:`.hier`).

Horovod splits a reduction into ``compress()`` (before its allreduce of our ``[1.0]``) and
``decompress()`` (after it), and our own collectives have to be issued in between from the
first call, so each pattern is a start and a finish joined by a :class:`Ctx`, the object
Horovod hands back to ``decompress()``. The patterns themselves are the reduction core's
(:func:`hvd_gradq.reduce.gather`, :func:`hvd_gradq.reduce.summable`, driven by :mod:`.reduce`);
this module hands them the tensor: its name, the group, the codec (:mod:`.transport`: payloads
made on the host by the compiled kernels, static sizes) and the step's seed words. The
compressor keeps what every pattern shares: the call site, the slot, error feedback
(:meth:`GradqCompressor._compensate` and ``_store_residual``, kept together there) and the
final scaling by Horovod's ``[1.0]``.

Both start their collective even when this rank's input is not finite, since a rank that
failed before it would leave the others waiting: under ``nonfinite=raise`` the gather payload is
the poison (:mod:`hvd_gradq.wire.poison`) and the summable statistics are +inf, and every rank
fails after the collective, naming the ranks; under ``propagate`` a summable bucket with
NaN/Inf on some rank sends +inf statistics and decodes as NaN everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import reduce as core
from ..plan.pattern import Pattern
from ..schemes.scheme import Scheme
from . import reduce
from .callsite import set_suffix
from .ops import TF
from .state import Slot
from .transport import GraphCodec


@dataclass
class Ctx:
    """What ``compress()`` hands Horovod for ``decompress()``: the tensor's facts, the pattern's
    collective result, and what error feedback needs after it (``x``, ``residual``)."""

    slot_index: int
    shape: tuple[int, ...]
    dtype: Any
    n: int
    pattern: Pattern | None
    size: int = 1
    rank: int = 0
    result: Any = None  # the first collective's result (gather: the gathered bytes)
    flow: Any = None  # the pattern on the reduction core (:class:`.reduce.Flow`)
    x: Any = None  # the compressed input g + e (gather with ef: the residual is set in decompress)
    slot: Slot | None = None
    finite: Any = None  # nonfinite=raise: whether this rank's x held no NaN/Inf (a bool tensor)
    what: str = ""  # "gradient <key> [shape]" for messages
    warm: Any = None  # warmup > 0: whether this step was a warm-up step (a bool tensor) ...
    total: Any = None  # ... the sum over ranks either way ...
    own: Any = None  # ... and what error feedback subtracts (x itself on warm steps: no change)
    step: Any = None  # the slot's step counter before this step (stats' time: :func:`.host.recording`)


def start(scheme: Scheme, pattern: Pattern, cid: str, x: Any, words: Any, key: str, ctx: Ctx, ps: Any) -> None:
    """The core's gather or summable pattern (:mod:`.reduce`) on ``x`` up to its first collective
    (``words``: this step's seed words); ``x`` holds what the gradient held (the summable pattern
    decides on NaN/Inf itself, the gather pattern's codec sends the poison by ``ctx.finite``)."""
    ef = ctx.slot is not None and ctx.slot.residual is not None
    codec = GraphCodec(ctx.size, ctx.what, ef, ctx.finite, (ctx.shape, ctx.dtype.name))
    part = core.Part(f"{key}{set_suffix(ps)}", ctx.step, core.Group(ctx.rank, ctx.size, f"{cid}."), codec,
                     ctx.slot.key if ctx.slot is not None else "", reduce.fixed(words), ctx.what)
    make: reduce.Make = core.gather if pattern is Pattern.GATHER else lambda r, p, v: core.summable(r, p, v, TF)
    ctx.flow = reduce.begin(make, scheme, ef, x, part, ps)
    ctx.result = ctx.flow.handle  # the first collective's result: a tensor of the graph, as callers may want it


def finish(ctx: Ctx) -> Any:
    """(sum, own): the group's sum (every rank's payload decoded and summed in rank order, the
    same bytes and the same computation on every rank; or the summed lanes decoded), and this
    rank's own decoded payload (error feedback; None without it)."""
    assert isinstance(ctx.flow, reduce.Flow)
    return ctx.flow.finish(), ctx.flow.own
