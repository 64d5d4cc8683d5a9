"""Which compiled kernel serves which scheme class: a registry the kernel modules fill, as the
schemes register by name (``@register("orq")``).

A kernel module decorates a factory with ``@kernel_for(ORQ)``; the factory turns one scheme
instance into a :class:`Kernel` (its parameters resolved once, cached per scheme), or None
where its parameters have no fast path. Lookup is by the scheme's exact class: a subclass may
encode differently, so it gets the reference until a kernel registers for it. NumPy only: the
numba modules are imported by the kernels when they first run.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, TypeVar

import numpy as np
from numpy.typing import NDArray

from ..errors import GradqError
from ..schemes.level import LevelScheme
from ..schemes.options import Scales
from ..schemes.scheme import Scheme
from ..wire.packing import layout
from ._layout import layout_id

SchemeT = TypeVar("SchemeT", bound=Scheme)
Factory = Callable[[Any], "Kernel | None"]
_FACTORIES: dict[type[Scheme], Factory] = {}


@dataclass(frozen=True)
class Fed:
    """Error feedback inside an encode (:func:`hvd_gradq.kernels.encode_fed`): the residual ``e``
    (read only where ``has_e``: a tensor's first step has none), the array its new residual goes
    to, the loss scale (``scaled``: multiply and divide by it), and the input check's bound;
    ``flush``: subnormals as zeros in the rule's arithmetic, as TensorFlow's kernels compute it."""

    e: NDArray[np.float32]
    out: NDArray[np.float32]
    scale: np.float32
    scaled: bool
    has_e: bool
    limit: np.float32  # :func:`limit32` of the scheme's bound
    flush: bool = False
    on: bool = True


_TINY = np.float32(np.finfo(np.float32).tiny)  # the smallest normal float32


def scale_of(scale: float | None, flush: bool) -> tuple[np.float32, bool]:
    """A loss scale as the error-feedback kernels take it (1 where None; with ``flush`` a
    subnormal one is a zero of its sign, as TensorFlow's kernels read it) and whether there is one."""
    s = np.float32(1.0 if scale is None else scale)
    if flush and abs(s) < _TINY:  # Python's test: a NumPy call on a scalar costs microseconds
        s = np.float32(math.copysign(0.0, float(s)))
    return s, scale is not None


def limit32(limit: float) -> np.float32:
    """The float32 ``L`` for which ``|v| < L`` is ``|v| < limit`` for every float32 ``v``:
    ``limit`` itself where float32 holds it (2**127, inf), else the next float32 above it (a
    comparison in float32 keeps the check's loop in float32 lanes)."""
    l32 = np.float32(limit)
    return np.nextafter(l32, np.float32(np.inf)) if float(l32) < limit else l32


_DUMMY = np.zeros(1, np.float32)
#: what an encode without error feedback hands the kernels (its arrays are never read)
NO_FED = Fed(_DUMMY, _DUMMY, np.float32(1.0), False, False, np.float32(np.inf), on=False)


@dataclass(frozen=True)
class Kernel:
    """A compiled fast path for one level scheme: what every kernel reads of it, and the
    encode / decode entry points its module implements."""

    d: int  # bucket
    s: int  # symbols
    g: int  # symbols a word
    bits: int  # bits a word
    lid: int  # layout id (_layout.layout_id)
    magic: int  # floor(2**32 / s) + 1: word // s == (word * magic) >> 32 for words < 2**16
    mw: int  # meta floats a bucket
    clip: np.float32
    fp16: bool
    stoch: bool
    #: its encoder sorts and searches each bucket (10-100x an even kernel's ns an element), so a
    #: tensor is split from fewer elements (:data:`.parallel.SEARCH_DIVISOR`)
    searches: ClassVar[bool] = False

    def nbuckets(self, n: int) -> int:
        return -(-n // self.d)

    @property
    def unit(self) -> int:
        """Symbols a packing unit holds (8 words of sub-byte words, else one word): a range of
        buckets packs on its own only from an element index that is a multiple of it."""
        return self.g * 8 if self.bits < 8 else self.g

    def byte_at(self, e: int) -> int:
        """Where the packed codes of element ``e`` (a multiple of :attr:`unit`) begin."""
        return e // self.unit * (self.bits if self.bits < 8 else self.bits // 8)

    def encode(self, x: NDArray[Any], n: int, b0: int, b1: int, sa: int, sb: int, meta: NDArray[Any],
               codes: NDArray[Any], fed: Fed = NO_FED) -> bool:
        """Fill the meta rows and the packed codes of buckets b0..b1 of the flat float32 ``x``
        (n > 0 elements; ``b0 * d`` a multiple of :attr:`unit`; the last range pads the codes).
        With ``fed`` (``on``), ``x`` is the raw gradient: each bucket is compensated as it is
        read and its new residual written to ``fed.out``; False at a bucket that fails the input
        check (NaN/Inf, or beyond ``fed.limit``), where the caller takes the unfused path."""
        raise NotImplementedError

    def decode(self, meta: NDArray[Any], codes: NDArray[Any], n: int, b0: int, b1: int, out: NDArray[Any],
               acc: bool) -> None:
        """Decode buckets b0..b1 into ``out`` (added to it when ``acc``)."""
        raise NotImplementedError


def level_fields(scheme: LevelScheme) -> dict[str, Any] | None:
    """The :class:`Kernel` fields of a level scheme, or None (over 256 symbols: codes are kept
    as bytes)."""
    s = scheme.symbols
    if s > 256:
        return None
    lay = layout(s)
    return {
        "d": scheme.bucket, "s": s, "g": lay.group, "bits": lay.bits, "lid": layout_id(s, lay.group, lay.bits),
        "magic": (1 << 32) // s + 1, "mw": scheme.meta_width, "clip": np.float32(scheme.clip),
        "fp16": scheme.scales is Scales.FP16, "stoch": scheme.draws,
    }


def kernel_for(*classes: type[SchemeT]) -> Callable[[Callable[[SchemeT], Kernel | None]],
                                                     Callable[[SchemeT], Kernel | None]]:
    """Register the decorated factory as the kernel of each scheme class given."""

    def deco(factory: Callable[[SchemeT], Kernel | None]) -> Callable[[SchemeT], Kernel | None]:
        for cls in classes:
            if cls in _FACTORIES:
                raise GradqError(f"a kernel is already registered for {cls.__name__}; register one a class")
            _FACTORIES[cls] = factory
        return factory

    return deco


@lru_cache(maxsize=256)
def kernel(scheme: Scheme) -> Kernel | None:
    """The kernel registered for ``type(scheme)``, built for this scheme, or None."""
    factory = _FACTORIES.get(type(scheme))
    return None if factory is None else factory(scheme)


def registered() -> dict[type[Scheme], Factory]:
    """A copy of the registry (scheme class -> kernel factory)."""
    return dict(_FACTORIES)
