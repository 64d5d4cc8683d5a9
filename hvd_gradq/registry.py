"""The scheme registry: scheme name -> class, and building a scheme from its parameters.

Schemes register into it (``@register("orq")``) and :mod:`hvd_gradq.spec` reads it, so neither
imports the other: this module depends on nothing but the error types. It does not load the
built-in schemes itself (that would import them back); importing :mod:`hvd_gradq` does, through
:mod:`hvd_gradq.spec`, and importing any scheme module loads the whole ``schemes`` package.
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import SpecError

if TYPE_CHECKING:
    from .schemes.scheme import Scheme

_REGISTRY: dict[str, type[Scheme]] = {}
S = TypeVar("S", bound="type[Scheme]")


def register(name: str) -> Callable[[S], S]:
    """Class decorator: make a scheme available under ``name``; a duplicate name is refused."""

    def deco(cls: S) -> S:
        if name in _REGISTRY:
            raise SpecError(f"scheme name {name!r} is already registered by {_REGISTRY[name].__name__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def names() -> list[str]:
    """The registered scheme names, sorted."""
    return sorted(_REGISTRY)


def scheme_class(name: str) -> type[Scheme]:
    """The class registered under ``name``, or a SpecError listing the valid names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise SpecError(f"unknown scheme {name!r}; valid schemes: {', '.join(sorted(_REGISTRY))}") from None


def _convert(cls_name: str, field: dataclasses.Field[Any], raw: Any) -> Any:
    """Turn a spec value (string or Python value) into the field's type, or say why not."""
    typ = field.type if not isinstance(field.type, str) else field.metadata.get("type", field.type)
    kind = field.metadata.get("kind", typ)
    key = field.name
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        valid = [m.value for m in kind]
        val = raw.value if isinstance(raw, enum.Enum) else raw
        if val not in valid:
            raise SpecError(f"{cls_name}: {key}={raw!r} is not valid; valid: {', '.join(map(str, valid))}")
        return kind(val)
    if kind in ("bool", bool):
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(raw, str) and raw.lower() in ("0", "false", "no", "off"):
            return False
        raise SpecError(f"{cls_name}: {key}={raw!r} is not a boolean; valid: true or false")
    if kind in ("int", int):
        if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
            raise SpecError(f"{cls_name}: {key}={raw!r} is not an integer")
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise SpecError(f"{cls_name}: {key}={raw!r} is not an integer") from None
    if kind in ("float", float):
        if isinstance(raw, bool):
            raise SpecError(f"{cls_name}: {key}={raw!r} is not a number")
        try:
            v = float(raw)
        except (TypeError, ValueError):
            raise SpecError(f"{cls_name}: {key}={raw!r} is not a number") from None
        if v != v or v in (float("inf"), float("-inf")):
            raise SpecError(f"{cls_name}: {key}={raw!r} must be a finite number")
        return v
    return raw


def build(name: str, **params: Any) -> Scheme:
    """Build a scheme from its name and keyword parameters (strings or Python values)."""
    cls = scheme_class(name)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        raise SpecError(
            f"{name}: unknown parameter(s) {', '.join(unknown)}; valid: {', '.join(sorted(fields))}"
        )
    conv = {k: _convert(name, fields[k], v) for k, v in params.items()}
    return cls(**conv)


def to_spec(scheme: Scheme) -> str:
    """The canonical spec string: every parameter, in declaration order."""
    parts = []
    for f in dataclasses.fields(scheme):
        if not f.init:
            continue
        v = getattr(scheme, f.name)
        if isinstance(v, enum.Enum):
            v = v.value
        elif isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, float):
            v = repr(v)
        parts.append(f"{f.name}={v}")
    return f"{scheme.name}:{','.join(parts)}"
