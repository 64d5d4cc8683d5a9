"""How a scheme declares a parameter, and the enum kinds its parameters take.

Kept apart from the scheme classes so that code which only names a policy (``api.py`` reading
``nonfinite``) or a wire precision (the kernel registry matching ``scales``) does not have to
reach for the class hierarchy. :func:`param` records ``kind`` and ``doc`` in the dataclass
field's metadata; :func:`convert` reads them to parse a spec's values and :func:`text` prints
them back (so an enum's ``value`` here is exactly its spelling in a spec). Both the schemes'
canonical text (:attr:`hvd_gradq.schemes.scheme.Scheme.spec`) and the policy's
(:mod:`hvd_gradq.policy`) are written with them, so this leaf module is the one place a value's
spelling is decided.
"""

from __future__ import annotations

import enum
from dataclasses import Field, field, fields
from typing import Any

from ..errors import SpecError


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


def param(default: Any, kind: Any, doc: str = "", key: str | None = None) -> Any:
    """A scheme or policy parameter: its default, its kind (int, float, bool or an Enum), a doc
    line, and the key a spec names it by where that is not the field's name (``ef``)."""
    meta = {"kind": kind, "doc": doc} | ({"key": key} if key else {})
    return field(default=default, metadata=meta)


def convert(who: str, field: Field[Any], raw: Any) -> Any:
    """A spec value (string or Python value) as the parameter's kind, or a SpecError saying why
    not (``who`` starts the message: the scheme's name)."""
    kind = field.metadata.get("kind", field.type)
    key = field.metadata.get("key", field.name)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        valid = [m.value for m in kind]
        val = raw.value if isinstance(raw, enum.Enum) else raw
        if val not in valid:
            raise SpecError(f"{who}: {key}={raw!r} is not valid; valid: {', '.join(map(str, valid))}")
        return kind(val)
    if kind in ("bool", bool):
        flag = as_bool(raw)
        if flag is None:
            raise SpecError(f"{who}: {key}={raw!r} is not a boolean; valid: true or false")
        return flag
    if kind in ("int", int):
        if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
            raise SpecError(f"{who}: {key}={raw!r} is not an integer")
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise SpecError(f"{who}: {key}={raw!r} is not an integer") from None
    if kind in ("float", float):
        if isinstance(raw, bool):
            raise SpecError(f"{who}: {key}={raw!r} is not a number")
        try:
            v = float(raw)
        except (TypeError, ValueError):
            raise SpecError(f"{who}: {key}={raw!r} is not a number") from None
        if v != v or v in (float("inf"), float("-inf")):
            raise SpecError(f"{who}: {key}={raw!r} must be a finite number")
        return v
    return raw


def as_bool(raw: Any) -> bool | None:
    """``raw`` as a boolean (a bool, or one of the words a spec may spell one with), else None."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(raw, str) and raw.lower() in ("0", "false", "no", "off"):
        return False
    return None


def text(value: Any) -> str:
    """A parameter value as a spec spells it (the inverse of :func:`convert`)."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def changed(obj: Any) -> list[str]:
    """``key=value`` of each init field of the dataclass ``obj`` whose value is not its default,
    in declaration order: the canonical spelling keeps only what differs from a default."""
    return [f"{f.name}={text(getattr(obj, f.name))}" for f in fields(obj)
            if f.init and getattr(obj, f.name) != f.default]
