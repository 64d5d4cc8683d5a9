"""Config strings and the scheme registry.

``"orq:levels=5,bucket=512,clip=2.5,ef=true"`` -> a validated, frozen scheme object. The names
are the ones users type everywhere: in code, config strings, CLI flags and docs. The registry
maps a name to its class and refuses a second class under the same name.
"""
from __future__ import annotations

import dataclasses
import enum
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from .errors import SpecError

if TYPE_CHECKING:
    from .schemes.base import Scheme

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
    _load()
    return sorted(_REGISTRY)


def scheme_class(name: str) -> type[Scheme]:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise SpecError(f"unknown scheme {name!r}; valid schemes: {', '.join(sorted(_REGISTRY))}") from None


def _load() -> None:
    from . import schemes  # noqa: F401  (registers the built-in schemes)


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


@lru_cache(maxsize=1024)
def parse(spec: str) -> Scheme:
    """Parse ``"name:key=value,key=value"`` into a validated scheme object.

    Example: ``parse("orq:levels=5,ef=true")``. Raises :class:`SpecError` (a ``ValueError``)
    naming what was wrong and what is valid.
    """
    if not isinstance(spec, str):
        raise SpecError(f"a scheme spec must be a string such as 'orq:levels=5', not {type(spec).__name__}")
    text = spec.strip()
    if not text:
        raise SpecError(f"empty scheme spec; valid schemes: {', '.join(names())}")
    name, _, rest = text.partition(":")
    name = name.strip().lower()
    params: dict[str, str] = {}
    if rest.strip():
        for item in rest.split(","):
            key, eq, val = item.partition("=")
            key = key.strip().lower()
            if not eq or not key or not val.strip():
                raise SpecError(f"{spec!r}: {item!r} is not of the form key=value")
            if key in params:
                raise SpecError(f"{spec!r}: parameter {key!r} given twice")
            params[key] = val.strip()
    return build(name, **params)


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
