"""What every scheme is: the parameters all share, its identity, its wire sections.

:class:`Scheme` is the interface the frontends, the payload and the kernels program against:
``sections`` (exact sizes, so a payload's length is known before it is encoded), ``encode`` /
``decode`` on a :class:`~hvd_gradq.xp.Ops` namespace, and :class:`Combine`, the one fact the
frontends' pattern choice needs from a scheme class. Level schemes (a table of levels a
bucket) build on it in :mod:`.level`; plain, fp16 and Top-K implement it directly.

A scheme holds only what encoding and decoding need. What a frontend does around it (error
feedback, warm-up, non-finite gradients) is a :class:`hvd_gradq.policy.Policy` beside it, and
never reaches a payload header.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from ..errors import SpecError
from ..xp import Array, Ops, Seed
from .options import changed, param, text


class Combine(enum.Enum):
    """How payloads of several workers may be combined."""

    GATHER = "gather"  # every worker's payload is gathered and decoded, then summed
    SUMMABLE = "summable"  # given a shared scale (a max-allreduce of ``shared_stats``), codes add


@dataclass(frozen=True)
class Section:
    """One part of a payload on the wire."""

    name: str
    dtype: str  # numpy dtype name of the wire representation
    count: int  # elements

    @property
    def nbytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize) * self.count


@dataclass(frozen=True, kw_only=True)
class Scheme:
    """Base of all schemes. Parameters common to every scheme live here."""

    name: ClassVar[str] = "?"
    combine: ClassVar[Combine] = Combine.GATHER
    # whether the rounding itself is unbiased (E[Q(x)] = x); :attr:`unbiased` also accounts for
    # parameters that bias the whole scheme (clipping)
    unbiased_rounding: ClassVar[bool] = False
    stochastic: ClassVar[bool] = False
    #: whether a user who says nothing of ``ef`` gets error feedback with this scheme (a policy
    #: default, :mod:`hvd_gradq.policy`; not a parameter of the scheme, never on the wire)
    default_ef: ClassVar[bool] = False
    #: the parameter that changes this scheme's CPU cost (``levels`` for ORQ), declared with
    #: ``@register(..., speed=...)``; None when the name alone decides it (:attr:`speed_key`)
    speed_param: ClassVar[str | None] = None
    bucket: int = param(512, int, "elements per bucket")

    def __post_init__(self) -> None:
        if self.bucket <= 0:
            raise SpecError(f"{self.name}: bucket={self.bucket} must be a positive integer (default 512)")
        if self.bucket > 1 << 24:
            raise SpecError(f"{self.name}: bucket={self.bucket} is too large; valid: 1 .. 2**24")

    @property
    def unbiased(self) -> bool:
        """Whether E[decode(encode(x))] = x for every finite x, with these parameters."""
        return self.unbiased_rounding

    @property
    def limit(self) -> float:
        """Magnitudes the float32 arithmetic of this scheme handles: every |x| < limit. Larger
        finite values would overflow an intermediate (a range, a sum, a square) and decode
        wrong, so they are refused (:func:`hvd_gradq.quantize`) or, inside a framework's graph,
        their bucket decodes as NaN."""
        return math.inf

    def check_parts(self, parts: dict[str, NDArray[Any]], n: int) -> None:
        """Raise PayloadError if wire sections (NumPy, wire dtypes) hold what no encoder writes
        and the decoders cannot decode (an index or a code out of range)."""

    # -- identity -----------------------------------------------------------------------
    @functools.cached_property
    def spec(self) -> str:
        """The canonical spec text: the name, then each parameter that differs from its default,
        in declaration order (``orq``, ``orq:levels=3``, ``qsgd:bucket=256,levels=4``). Computed
        once: it is in every payload header, so it is as short as the parameters allow, and a
        default is part of the payload format (``wire.payload.VERSION``)."""
        items = changed(self)
        return self.name + (":" + ",".join(items) if items else "")

    def __str__(self) -> str:
        return self.spec

    @property
    def speed_key(self) -> str:
        """What the cost model's CPU table keys this scheme by (:mod:`hvd_gradq.plan.cpu_cost`):
        the name, then the value of :attr:`speed_param` as a spec spells it (``orq:5``,
        ``bingrad:pb``, ``topk``). Only that one parameter: the table is measured for a few
        values of it, and the cost model interpolates between numeric ones. A scheme whose cost
        hangs on more than one parameter overrides this."""
        if self.speed_param is None:
            return self.name
        return f"{self.name}:{text(getattr(self, self.speed_param))}"

    def replace(self, **changes: Any) -> Scheme:
        """This scheme with some parameters changed (Python values), validated again."""
        return dataclasses.replace(self, **changes)

    # -- the wire ---------------------------------------------------------------------------
    def sections(self, n: int) -> list[Section]:
        """The payload's sections for a tensor of ``n`` elements, with exact sizes."""
        raise NotImplementedError

    def encode(self, ops: Ops, x: Array, seed: Seed) -> dict[str, Array]:
        """Quantize a flat float32 array into wire sections (arrays of their section dtypes)."""
        raise NotImplementedError

    def decode(self, ops: Ops, parts: dict[str, Array], n: int) -> Array:
        """Sections -> the flat float32 estimate of the input."""
        raise NotImplementedError

    def code_bits(self, n: int) -> float:
        """Theoretical bits on the wire for ``n`` elements (entropy-free: log2 of the alphabet)."""
        raise NotImplementedError

    def nbytes(self, n: int) -> int:
        return _nbytes(self, n)

    def refined(self, factor: float) -> Scheme:
        """This scheme with about ``factor`` times as many quantization intervals (never fewer,
        capped at what it accepts); itself where it has no finer form (two-level and sign
        schemes, Top-K, TernGrad's ternary). Whether it has one decides the scatter pattern's
        second phase (:func:`hvd_gradq.plan.second_phase.reduced_scheme`): a stochastic uniform
        re-quantization of the sum where it does, the scheme itself where it does not."""
        return self


@functools.lru_cache(maxsize=4096)
def _nbytes(scheme: Scheme, n: int) -> int:
    # asked several times a tensor a step by the frontends' cost model: cached (schemes are frozen)
    return sum(s.nbytes for s in scheme.sections(n))
