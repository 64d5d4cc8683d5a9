"""How a scheme declares a parameter, and the enum kinds its parameters take.

Kept apart from the scheme classes so that code which only names a policy (``api.py`` reading
``nonfinite``) or a wire precision (the kernel registry matching ``scales``) does not have to
reach for the class hierarchy. :func:`param` records ``kind`` and ``doc`` in the dataclass
field's metadata; :mod:`hvd_gradq.registry` reads them to parse and print spec strings, so an
enum's ``value`` here is exactly its spelling in a spec.
"""

from __future__ import annotations

import enum
from dataclasses import field
from typing import Any


class NonFinite(enum.Enum):
    """What a gradient holding NaN/Inf becomes. ``propagate`` (default, as Horovod itself carries
    non-finite values through, and torch's GradScaler relies on seeing them): a bucketed scheme
    decodes every bucket that held one as NaN, on every rank, and leaves the other buckets alone;
    ``none``/``fp16`` carry the values through; ``topk`` keeps them first. ``raise``: an error
    naming the tensor. ``skip``: the tensor is sent uncompressed (``none``) with a warning."""

    RAISE = "raise"
    SKIP = "skip"
    PROPAGATE = "propagate"


class Scales(enum.Enum):
    FP32 = "fp32"
    FP16 = "fp16"


class Rounding(enum.Enum):
    """How an element between two levels picks one: the nearest (biased, error at most half a
    step), or stochastically, up with probability the fraction of the step it has climbed
    (unbiased: E[Q(x)] = x inside the levels' range; variance at most step^2/4)."""

    NEAREST = "nearest"
    STOCHASTIC = "stochastic"


def param(default: Any, kind: Any, doc: str = "") -> Any:
    """A scheme parameter: its default, its kind (int, float, bool or an Enum) and a doc line."""
    return field(default=default, metadata={"kind": kind, "doc": doc})
