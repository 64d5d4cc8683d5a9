"""Config strings.

``"orq:levels=5,bucket=512,clip=2.5,ef=true"`` -> a validated, frozen scheme object. The names
are the ones users type everywhere: in code, config strings, CLI flags and docs. The registry
(name -> class, one class a name) lives in :mod:`hvd_gradq.registry`, which the schemes
register into; this module loads the built-in schemes and re-exports the registry's functions.
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from . import schemes as _schemes  # noqa: F401  (importing it registers the built-in schemes)
from .errors import SpecError
from .registry import build, names, register, scheme_class, to_spec

if TYPE_CHECKING:
    from .schemes.scheme import Scheme

__all__ = ["build", "names", "parse", "register", "scheme_class", "to_spec"]


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
