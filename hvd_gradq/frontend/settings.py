"""A compressor's settings as one line of text: what ``from_spec()`` and ``HVD_GRADQ`` take.

**One documented way.** The line is the scheme's spec, then any of the compressor's options
that text can say, in the same ``key=value`` form: ``HVD_GRADQ="orq:levels=3,pattern=scatter,link_gbps=1"``
builds what ``gq.ORQ(levels=3, pattern="scatter", link_gbps=1)`` builds, so a launch script can
set everything without touching the training code. The options are those of the frontend's
compressor constructor (its signature: :func:`~.factory.compressor_parameters`), converted from
text by their annotations (``bool``, ``int``, ``float``, ``str``); those text cannot say
(``named_parameters``, ``process_set``, ``loss_scale``) are refused with the keyword to pass in
code. :func:`hvd_gradq.parse` takes the spec alone, and names where an option belongs.

**Given twice.** An option the line sets and the call passes too (``from_env(pattern="gather")``
under ``HVD_GRADQ=...,pattern=scatter``) must agree, else a SpecError names both: one of them
would be silently ignored. The options that read a variable of their own when not given
(:data:`OPTION_VARIABLES`, e.g. ``HVD_GRADQ_LINK_GBPS``) still do; a value in the line is a
given value and wins over it, as a keyword does.
"""
from __future__ import annotations

import difflib
import inspect
import os
import typing
import warnings
from collections.abc import Callable
from typing import Any

from .. import log
from ..errors import GradqError, SpecError
from ..kernels.parallel import ENV as THREADS_ENV
from ..plan.hosts import LINK_ENV
from ..spec import COMPRESSOR_OPTIONS, Config, check_name, items, parse, split_options
from .factory import ENV, check_keywords, compressor_parameters, parameter_fields
from .probe import FALLBACK_ENV

#: Compressor options that read a variable of their own when not given (each compressor's
#: docstring says so); listed in an unknown key's error. ``HVD_GRADQ_CODEC`` is PyTorch's
#: (``hvd_gradq.torch.device.ENV``, which this framework-free module cannot import).
OPTION_VARIABLES: dict[str, str] = {
    "link_gbps": LINK_ENV, "threads": THREADS_ENV, "fallback": FALLBACK_ENV, "codec": "HVD_GRADQ_CODEC",
    "log_every": log.EVERY_ENV,
}
#: How text says a bool (as ``HVD_GRADQ_FALLBACK`` does).
_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
#: The annotations text can be converted to, by name (``Pattern``: its value, a string).
_KINDS: dict[str, type] = {"bool": bool, "float": float, "int": int, "str": str, "Pattern": str}


def text_kind(param: inspect.Parameter) -> type | None:
    """What a compressor option takes from text (``bool``, ``float``, ``int`` or ``str``, read
    from its annotation, ``None`` allowed beside it), or None where text cannot say it (a
    process set, a callable, the model's parameters)."""
    ann = param.annotation
    if isinstance(ann, str):  # an annotation that could not be evaluated
        given = {a.strip() for a in ann.split("|")}
    else:
        given = {getattr(a, "__name__", str(a)) for a in (typing.get_args(ann) or (ann,))}
    given -= {"None", "NoneType"}
    if not given or not given <= set(_KINDS):
        return None
    return next((_KINDS[k] for k in ("bool", "float", "int") if k in given), str)


def option_value(key: str, kind: type, value: str) -> Any:
    """``value`` (text) as option ``key`` takes it (``kind``: :func:`text_kind`)."""
    if kind is bool:
        if value.strip().lower() not in _BOOLS:
            raise SpecError(f"{key}={value!r} is not true or false (write 1/0, true/false, yes/no or on/off)")
        return _BOOLS[value.strip().lower()]
    if kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            raise SpecError(f"{key}={value!r} is not {'an integer' if kind is int else 'a number'}") from None
    return value


def text_options(construct: Callable[..., Any]) -> list[str]:
    """The options of compressor constructor ``construct`` that text can give, in its order."""
    positional, keyword = compressor_parameters(construct)
    return [p.name for p in positional + keyword if text_kind(p) is not None]


def _unknown(name: str, params: dict[str, str], construct: Callable[..., Any]) -> None:
    """A SpecError for keys that are neither the scheme's (its parameters and the policy's) nor
    a compressor option, naming both lists and the closest key."""
    valid = list(parameter_fields(name))
    unknown = sorted(k for k in params if k not in valid and k not in COMPRESSOR_OPTIONS)
    if not unknown:
        return
    options = text_options(construct)
    close = difflib.get_close_matches(unknown[0], valid + options, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    variables = ", ".join(f"{k}: {v}" for k, v in OPTION_VARIABLES.items() if k in options)
    raise SpecError(f"{name}: unknown parameter(s) {', '.join(unknown)}{hint}; valid: the scheme's "
                    f"{', '.join(sorted(valid))}, then the compressor's {', '.join(options)} (those with a variable "
                    f"of their own read it when not given: {variables})")


def compressor_line(text: str, construct: Callable[..., Any], frontend: str, who: str) -> tuple[Config, dict[str, Any]]:
    """``text`` (a spec, then compressor options: ``orq:levels=3,pattern=scatter,link_gbps=1``)
    -> the config and ``{option: value}`` as ``construct`` (the frontend's compressor class)
    takes them. ``frontend`` and ``who`` name the caller in errors: another frontend's option
    says which one has it, an option text cannot give says to pass it in code."""
    name, params = items(text)
    check_name(name, text)
    _unknown(name, params, construct)
    spec, raw = split_options(text)
    config = parse(spec)
    positional, keyword = compressor_parameters(construct)
    params_of = {p.name: p for p in positional + keyword}
    check_keywords(raw, list(params_of), frontend, who)
    options: dict[str, Any] = {}
    for key, value in raw.items():
        kind = text_kind(params_of[key])
        if kind is None:
            raise SpecError(f"{key}= cannot be given as text: pass it in code, {who.removesuffix('()')}({key}=...)")
        options[key] = option_value(key, kind, value)
    return config, options


def merge(line: dict[str, Any], given: dict[str, Any], where: str, who: str) -> dict[str, Any]:
    """The options of a line and of the call, together; one set by both must agree (see the
    module docstring), else a SpecError naming both places."""
    for key in sorted(set(line) & set(given)):
        if line[key] != given[key]:
            raise SpecError(f"{key} is set twice: {key}={line[key]!r} by {where} and {key}={given[key]!r} by {who}; "
                            "set it in one place")
    return {**line, **given}


def spec_settings(spec: str, given: dict[str, Any], construct: Callable[..., Any], frontend: str,
                  who: str = "from_spec()") -> tuple[Config, dict[str, Any]]:
    """``from_spec(spec, **given)``: the config and every option, the line's and the call's."""
    config, line = compressor_line(spec, construct, frontend, who)
    return config, merge(line, given, f"the spec {spec!r}", who)


def env_settings(default: str | None, given: dict[str, Any], construct: Callable[..., Any], frontend: str,
                 who: str = "from_env()") -> tuple[Config, dict[str, Any]]:
    """``from_env(default=..., **given)``: the line in ``HVD_GRADQ`` (a bad one raises SpecError
    naming the variable and its value), the config and every option. Unset or empty:
    ``default``, with a warning when the caller named none (the fallback is then ``none``, no
    compression, which is easy to run by mistake)."""
    raw = os.environ.get(ENV, "")
    if raw.strip():
        try:
            config, line = compressor_line(raw, construct, frontend, who)
        except SpecError as e:
            raise SpecError(f"{ENV}={raw!r} (read by {who}) is not a valid spec: {e}") from None
        return config, merge(line, given, ENV, who)
    if default is None:
        warnings.warn(
            f"{ENV} is not set (or empty): {who} builds 'none', fp32 payloads without compression. Set "
            f"{ENV} to a spec (e.g. {ENV}=orq:levels=5), or pass {who.rstrip('()')}(default='...') to choose "
            "the fallback yourself", UserWarning, stacklevel=3)
        default = "none"
    return spec_settings(default, given, construct, frontend, who)


def env_elements(name: str, default: int, zero: str) -> int:
    """An element-count threshold read from the variable ``name``: ``default`` when unset or
    empty, else a whole number >= 0 (``zero`` says what 0 means), else a GradqError saying what
    to write. The frontends' size lines (TensorFlow's host error feedback, PyTorch's fused
    gathers) read theirs here."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise GradqError(f"{name}={raw!r}: give a number of elements, 0 or more (0: {zero})")
    return value
