"""Config strings.

``"orq:levels=5,bucket=512,clip=2.5,ef=true"`` -> a validated, frozen :class:`Config`: the
scheme (what encoding and decoding need: :mod:`hvd_gradq.schemes`) and the policy around it
(error feedback, warm-up, non-finite gradients: :mod:`hvd_gradq.policy`). Users write both in
one string, with the names they type everywhere (code, config strings, CLI flags, docs); the
keys of :data:`hvd_gradq.policy.KEYS` go to the policy, the rest to the scheme. The registry
(name -> class) lives in :mod:`hvd_gradq.schemes.registry`; this module loads the built-in
schemes and re-exports the registry's functions.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from . import feedback
from . import schemes as _schemes  # noqa: F401  (importing it registers the built-in schemes)
from .errors import SpecError
from .policy import KEYS, Policy
from .schemes.options import text
from .schemes.registry import build as build_scheme
from .schemes.registry import names, register, scheme_class
from .schemes.scheme import Scheme

__all__ = ["Config", "SchemeLike", "as_config", "build", "names", "parse", "parse_scheme", "register", "scheme_class"]


@dataclass(frozen=True)
class Config:
    """A scheme and the policy a frontend applies around it: what a spec string means.

    ``spec`` is the one canonical text for users and logs: the scheme's (only parameters that
    differ from a default) and then the policy's keys that differ from the scheme's defaults
    (``orq:levels=3,ef=true``). ``parse(config.spec) == config``."""

    scheme: Scheme
    policy: Policy = field(default_factory=Policy)

    @property
    def name(self) -> str:
        return self.scheme.name

    @functools.cached_property
    def spec(self) -> str:
        items = self.policy.items(self.scheme.default_ef)
        if not items:
            return self.scheme.spec
        return self.scheme.spec + ("," if ":" in self.scheme.spec else ":") + ",".join(items)

    @functools.cached_property
    def full_spec(self) -> str:
        """Every parameter spelled out, defaults included, the policy's after ``bucket``
        (``orq:bucket=512,ef=false,nonfinite=propagate,warmup=0,clip=0.0,scales=fp32,levels=5``):
        what ranks compare before the first step and checkpoints record (the compressors'
        ``config()``), so that two hvd_gradq versions whose defaults differ disagree visibly,
        and a checkpoint written before the policy left the scheme still matches."""
        maths = [f"{f.name}={text(getattr(self.scheme, f.name))}" for f in dataclasses.fields(self.scheme) if f.init]
        p = self.policy
        ef = {feedback.CLASSIC: "true", feedback.NONE: "false"}.get(p.feedback, p.feedback)
        policy = [f"ef={ef}", f"nonfinite={p.nonfinite.value}", f"warmup={p.warmup}"]
        return f"{self.name}:{','.join(maths[:1] + policy + maths[1:])}"

    def __str__(self) -> str:
        return self.spec

    @staticmethod
    def of(scheme: Scheme) -> Config:
        """``scheme`` with the policy its class gives a user who says nothing of one."""
        return Config(scheme, Policy.of(scheme.name, {}, scheme.default_ef))


#: what the compressors and ``quantize`` take: a config, or a scheme (with its class's default policy)
SchemeLike = Config | Scheme


def build(name: str, **params: Any) -> Config:
    """A config from a scheme name and keyword parameters (strings or Python values), the
    policy's keys (``ef``, ``nonfinite``, ``warmup``) among them: what the factories call."""
    policy = {k: v for k, v in params.items() if k in KEYS}
    maths = {k: v for k, v in params.items() if k not in KEYS}
    scheme = build_scheme(name, extra=tuple(KEYS), **maths)
    return Config(scheme, Policy.of(name, policy, scheme.default_ef))


@lru_cache(maxsize=1024)
def parse(spec: str) -> Config:
    """Parse ``"name:key=value,key=value"`` into a validated scheme and policy.

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


def parse_scheme(spec: str) -> Scheme:
    """The scheme of a spec that names no policy (a payload header's text, or maths alone); a
    policy key raises SpecError, since dropping it silently would change what a user asked."""
    config = parse(spec)
    if config.policy != Config.of(config.scheme).policy:
        raise SpecError(f"{spec!r} sets a policy ({', '.join(config.policy.items(config.scheme.default_ef))}); "
                        "parse() returns the scheme with its policy")
    return config.scheme


def as_config(spec: str | Scheme | Config) -> Config:
    """A spec string, a scheme (with its class's default policy) or a config, as a config."""
    if isinstance(spec, Config):
        return spec
    if isinstance(spec, Scheme):
        return Config.of(spec)
    return parse(spec)
