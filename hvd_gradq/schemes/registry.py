"""The scheme registry: scheme name -> class, and building a scheme from its parameters.

Schemes register into it (``@register("orq")``) and :mod:`hvd_gradq.spec`, one layer up, reads
it. It depends on nothing but the error types and :mod:`.options` (how a value is parsed); the
scheme classes only under ``TYPE_CHECKING``, so the schemes import it and it imports none of
them back. Loading the ``schemes`` package registers the built-in ones.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import SpecError
from .options import convert

if TYPE_CHECKING:
    from .scheme import Scheme

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


def build(name: str, *, extra: Sequence[str] = (), **params: Any) -> Scheme:
    """Build a scheme from its name and keyword parameters (strings or Python values). ``extra``:
    keys the caller takes itself (the policy's), listed as valid in the unknown-key message."""
    cls = scheme_class(name)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        raise SpecError(
            f"{name}: unknown parameter(s) {', '.join(unknown)}; valid: {', '.join(sorted([*fields, *extra]))}"
        )
    conv = {k: convert(name, fields[k], v) for k, v in params.items()}
    return cls(**conv)
