"""The scheme registry: scheme name -> class and its declaration, and building a scheme from its
parameters.

**A scheme is declared once, in its own file.** ``@register("orq", export="ORQ", doc=...,
speed="levels", calibrate=...)`` on the class says everything the layers above need to know of
it: the spec name, the factory both frontends export and its doc line
(:func:`hvd_gradq.frontend.factory.install_factories`), the parameter its CPU cost depends on
(:attr:`Scheme.speed_key`, what the cost model's table is keyed by) and the specs the table
holds for it (``python -m hvd_gradq calibrate``, ``bench/scale/calibrate_cpu.py``). Those layers read
:func:`declarations` instead of keeping lists of their own, so a new scheme touches its file,
its kernel if it has one, and the table's data; ``tests/unit/test_new_scheme.py`` holds that.

It depends on nothing but the error types and :mod:`.options` (how a value is parsed); the
scheme classes only under ``TYPE_CHECKING``, so the schemes import it and it imports none of
them back. Loading the ``schemes`` package registers the built-in ones.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import SpecError
from .options import convert

if TYPE_CHECKING:
    from .scheme import Scheme

S = TypeVar("S", bound="type[Scheme]")


@dataclass(frozen=True)
class Declaration:
    """What a scheme declares beside its class (:func:`register`'s arguments).

    ``export``: the name of its factory in both frontends (``hvd_gradq.torch.ORQ``), None for a
    scheme reached through spec strings only; ``doc``: that factory's first docstring line
    (the parameters' lines come from the class); ``calibrate``: the specs the CPU table measures
    for it, one a speed key (:attr:`Scheme.speed_key`)."""

    name: str
    cls: type[Scheme]
    export: str | None = None
    doc: str = ""
    calibrate: tuple[str, ...] = ()


# registration order is kept: the frontends export and calibrate in it
_REGISTRY: dict[str, Declaration] = {}


def register(name: str, *, export: str | None = None, doc: str = "", speed: str | None = None,
             calibrate: Sequence[str] | None = None) -> Callable[[S], S]:
    """Class decorator: declare a scheme under the spec name ``name`` (see :class:`Declaration`);
    ``speed``: the parameter that changes its CPU cost (``levels``: the table's ``orq:5``), none
    when only the name does; ``calibrate`` defaults to the name alone. A duplicate name, or an
    export name another scheme declared, is refused, saying which scheme holds it."""

    if export is not None and not (export.isidentifier() and not export.startswith("_")):
        raise SpecError(f"scheme {name!r}: export={export!r} is not a public Python name")

    def deco(cls: S) -> S:
        if name in _REGISTRY:
            raise SpecError(f"scheme name {name!r} is already registered by {_REGISTRY[name].cls.__name__}")
        holder = next((d for d in _REGISTRY.values() if export is not None and d.export == export), None)
        if holder is not None:
            raise SpecError(f"scheme {name!r}: export name {export!r} is already declared by scheme "
                            f"{holder.name!r} ({holder.cls.__name__})")
        if speed is not None and speed not in {f.name for f in dataclasses.fields(cls) if f.init}:
            raise SpecError(f"scheme {name!r}: speed={speed!r} is not one of its parameters")
        cls.name = name
        if speed is not None:
            cls.speed_param = speed
        _REGISTRY[name] = Declaration(name, cls, export, doc, tuple(calibrate or (name,)))
        return cls

    return deco


def unregister(name: str) -> None:
    """Take scheme ``name`` out of the registry (a test's temporary scheme, a plugin reloaded);
    unknown names raise SpecError. Caches above it (``hvd_gradq.spec.parse``) are the caller's."""
    scheme_class(name)
    del _REGISTRY[name]


def declarations() -> list[Declaration]:
    """Every registered scheme's declaration, in registration order (the built-in ones in the
    order their modules are found: :mod:`hvd_gradq.schemes`)."""
    return list(_REGISTRY.values())


def names() -> list[str]:
    """The registered scheme names, sorted."""
    return sorted(_REGISTRY)


def scheme_class(name: str) -> type[Scheme]:
    """The class registered under ``name``, or a SpecError listing the valid names."""
    try:
        return _REGISTRY[name].cls
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
