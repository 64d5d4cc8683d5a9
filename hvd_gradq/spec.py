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
import difflib
import functools
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from . import feedback
from . import schemes as _schemes  # noqa: F401  (importing it registers the built-in schemes)
from .errors import SpecError
from .policy import KEYS, Policy
from .schemes.options import text
from .schemes.registry import build as build_scheme
from .schemes.registry import declarations, names, register, scheme_class
from .schemes.scheme import Scheme

__all__ = ["COMPRESSOR_OPTIONS", "Config", "SchemeLike", "as_config", "build", "label_spec", "names", "parse",
           "parse_scheme", "register", "scheme_class", "split_options"]

#: The compressors' own keywords (both frontends' ``GradqCompressor``), which no scheme spec
#: carries: :func:`parse` refuses them saying where they go, and :func:`split_options` takes
#: them out of the text that ``from_spec()`` and ``HVD_GRADQ`` accept (the scheme's parameters,
#: then the compressor's options: ``orq:levels=3,pattern=scatter,link_gbps=1``). Listed here,
#: below the frontends, so that the parser can name them; tests/unit/test_slips.py checks the
#: list against both constructors.
COMPRESSOR_OPTIONS: tuple[str, ...] = (
    "seed", "pattern", "link_gbps", "fallback", "check_ranks", "threads", "codec", "name", "log_every",
    "process_set", "loss_scale", "named_parameters",
)


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


def items(spec: str) -> tuple[str, dict[str, str]]:
    """``"name:key=value,..."`` -> (name, {key: value}), names and keys lower-cased, values as
    written; a SpecError for an item that is not ``key=value`` or a key given twice."""
    if not isinstance(spec, str):
        raise SpecError(f"a scheme spec must be a string such as 'orq:levels=5', not {type(spec).__name__}")
    text = spec.strip()
    if not text:
        raise SpecError(f"empty scheme spec; valid schemes: {', '.join(names())}")
    name, _, rest = text.partition(":")
    if "," in name or "=" in name:  # 'orq,levels=3': the colon forgotten
        head, _, tail = name.partition(",")
        fixed = f"{head}:{tail}" if tail else text
        raise SpecError(f"{spec!r}: a spec is the scheme's name, a colon, then key=value pairs, e.g. {fixed!r}")
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
    return name.strip().lower(), params


def split_options(spec: str) -> tuple[str, dict[str, str]]:
    """A spec followed by compressor options (``orq:levels=3,pattern=scatter``) -> (the spec
    alone, ``{option: text}``): what ``from_spec()`` and ``HVD_GRADQ`` take, so that one line
    can say everything a compressor is built with. Options are those of :data:`COMPRESSOR_OPTIONS`;
    their values are the frontends' to convert and check."""
    name, params = items(spec)
    options = {k: v for k, v in params.items() if k in COMPRESSOR_OPTIONS}
    rest = ",".join(f"{k}={v}" for k, v in params.items() if k not in COMPRESSOR_OPTIONS)
    return f"{name}:{rest}" if rest else name, options


@lru_cache(maxsize=1024)
def parse(spec: str) -> Config:
    """Parse ``"name:key=value,key=value"`` into a validated scheme and policy.

    Example: ``parse("orq:levels=5,ef=true")``. Raises :class:`SpecError` (a ``ValueError``)
    naming what was wrong and what is valid: a compressor option (``pattern=``) says where it
    goes, a label as the README prints it (``ORQ-5``) the spec it stands for.
    """
    name, params = items(spec)
    check_name(name, spec)
    options = [k for k in params if k in COMPRESSOR_OPTIONS]
    if options:
        raise SpecError(_misplaced(spec, name, options[0], params[options[0]]))
    return build(name, **params)


def check_name(name: str, spec: str) -> None:
    """A SpecError for a scheme name nobody registered, with what ``spec`` may have meant: the
    spec behind a label (``ORQ-5``: :func:`label_spec`), or the closest scheme name."""
    if name in names():
        return
    hint = label_spec(spec)
    close = difflib.get_close_matches(name, names(), n=1)
    if hint is not None:
        what = f" (did you mean {hint}? {spec.strip()!r} is how the README and `advise` label it)"
    else:
        what = f" (did you mean {close[0]}?)" if close else ""
    raise SpecError(f"unknown scheme {name!r}{what}; valid schemes: {', '.join(names())}")


def _misplaced(spec: str, name: str, key: str, value: str) -> str:
    export = next((d.export for d in declarations() if d.name == name and d.export), "ORQ")
    return (f"{spec!r}: {key}= is an option of the compressor, not of the scheme (parse() gives the scheme and "
            f"its policy). Pass it to the compressor (gq.{export}(..., {key}=...), gq.from_spec(spec, {key}=...)), "
            f"or keep it in the text of gq.from_spec() or HVD_GRADQ (read by gq.from_env()), which take the "
            f"compressor's options after the scheme's parameters: '{name}:...,{key}={value}'")


#: ``Top-K 1%``: Top-K at a ratio given in percent, as the study and ``advise`` name it.
_TOPK = re.compile(r"top-?k\s*(\d+(?:\.\d+)?)\s*%", re.IGNORECASE)
#: ``ORQ-5``, ``QSGD-4``, ``uniform-4``, ``BinGrad-pb``: a scheme and the value of its speed parameter.
_DASHED = re.compile(r"([a-z][a-z0-9_]*)-([a-z0-9.]+)", re.IGNORECASE)


def label_spec(label: str) -> str | None:
    """The spec behind a label, as the README, the quality study and ``advise`` name schemes:
    ``ORQ-5`` -> ``orq:levels=5`` (a scheme and the value of the parameter its speed depends on,
    :attr:`Scheme.speed_param`), ``BinGrad+EF`` -> ``bingrad:ef=true``, ``Top-K 1%+EF`` ->
    ``topk:ratio=0.01,ef=true``, ``TernGrad`` -> ``terngrad``; None for text that is no label
    (or names a spec that does not parse). ``parse`` suggests it; ``check`` takes it."""
    t = label.strip() if isinstance(label, str) else ""
    extra: list[str] = []
    if t.lower().endswith("+ef"):
        t, extra = t[:-3].strip(), ["ef=true"]
    topk, dashed = _TOPK.fullmatch(t), _DASHED.fullmatch(t)
    if topk is not None:
        name, own = "topk", [f"ratio={float(topk.group(1)) / 100:g}"]
    elif dashed is not None and dashed.group(1).lower() in names():
        name = dashed.group(1).lower()
        speed = scheme_class(name).speed_param
        if speed is None:
            return None
        own = [f"{speed}={dashed.group(2).lower()}"]
    elif t.lower() in names():
        name, own = t.lower(), []
    else:
        return None
    spec = name + (":" + ",".join(own + extra) if own + extra else "")
    try:
        parse(spec)
    except SpecError:
        return None
    return spec


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
