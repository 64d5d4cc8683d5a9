"""The public constructors both frontends export: ``ORQ(levels=5, ...)``, one a scheme, and the
checks ``from_spec`` and ``from_env`` share with them.

**One list of factories.** Which factories exist, and their names and first doc lines, is what
each scheme declares in its own file (``@register("orq", export="ORQ", doc=...)``,
:mod:`hvd_gradq.schemes.registry`); :func:`install_factories` binds them in each frontend
module, so neither frontend spells out a factory, and a new scheme reaches both by itself.

**One source for every keyword.** A factory's signature is made, not written: the scheme's
parameters come from its class (the dataclass fields :func:`hvd_gradq.schemes.options.param`
declares, with their kinds, defaults and doc lines), then the policy's (``ef``, ``nonfinite``,
``warmup``: :class:`hvd_gradq.policy.Policy`'s fields, ``ef``'s default the scheme class's),
the compressor's options from the
frontend's compressor constructor (its signature, and the ``Args:`` of its docstring). So
``help(gq.ORQ)`` and ``inspect.signature(gq.ORQ)`` show ``levels=5`` and every option, and a
parameter added to a scheme or an option added to a compressor reaches the factories by itself.

**Slips it catches** (each a :class:`~hvd_gradq.errors.SpecError` saying what to write instead):
the factory passed uncalled (``compression=gq.ORQ``: its ``compress`` raises, naming
``gq.ORQ()``), positional scheme values (``gq.ORQ(5)``), another frontend's option
(``codec=`` in TensorFlow: :data:`FRONTEND_ONLY`), an unknown keyword (with the closest valid
one). ``from_spec()`` and ``HVD_GRADQ`` (a spec, then compressor options as text) are
:mod:`.settings`'. Kept framework-free so that either frontend imports it without the other.
"""
from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import inspect
import textwrap
import typing
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from ..errors import GradqError, SpecError
from ..policy import KEYS, Policy
from ..schemes.registry import Declaration, declarations
from ..spec import build, scheme_class
from .frameworks import FRONTENDS

C = TypeVar("C")

#: The environment variable ``from_env`` reads.
ENV = "HVD_GRADQ"

#: Compressor options one frontend has and the other has not: option -> the frontend that has it.
#: Each frontend's options are its compressor constructor's keywords; tests/unit/test_slips.py
#: checks this table against both constructors.
FRONTEND_ONLY: dict[str, str] = {
    "named_parameters": "hvd_gradq.torch",
    "codec": "hvd_gradq.torch",
    "name": "hvd_gradq.tensorflow",
}
_SCALARS = (str, bytes, int, float, bool)  # never a compressor's positional argument (named_parameters)


# -- the scheme's parameters and the compressor's options ------------------------------------------------
def parameter_fields(name: str) -> dict[str, dataclasses.Field[Any]]:
    """Spec key -> the dataclass field that declares it, for scheme ``name``: the scheme's own
    and inherited parameters, then the policy's (``ef``, ``nonfinite``, ``warmup``)."""
    cls = scheme_class(name)
    mro = cls.__mro__

    def declared_at(f: dataclasses.Field[Any]) -> int:  # the most derived class declaring it
        return next((i for i, k in enumerate(mro) if f.name in inspect.get_annotations(k)), len(mro))

    out = {f.name: f for f in sorted((f for f in dataclasses.fields(cls) if f.init), key=declared_at)}
    policy = {f.name: f for f in dataclasses.fields(Policy)}
    return out | {key: policy[field] for key, field in KEYS.items()}


def scheme_parameters(name: str) -> list[inspect.Parameter]:
    """The parameters of scheme ``name`` as keyword-only :class:`inspect.Parameter` s: its own
    first (those its class declares, e.g. ORQ's ``levels``), then those it inherits, then the
    policy's; enum values as the strings a spec uses, ``ef`` at the scheme class's default."""
    out = []
    for key, f in parameter_fields(name).items():
        kind = f.metadata.get("kind")
        default: Any = scheme_class(name).default_ef if key == "ef" else f.default
        annotation: Any = kind if isinstance(kind, type) else inspect.Parameter.empty
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            annotation = typing.Literal.__getitem__(tuple(m.value for m in kind))
            default = default.value
        out.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))
    return out


def own_parameters(name: str) -> list[str]:
    """The parameters scheme ``name``'s class declares itself (ORQ: ``levels``), none for those
    with only the shared ones (``none``, ``sign``)."""
    cls = scheme_class(name)
    inherited = {f.name for k in cls.__mro__[1:] if dataclasses.is_dataclass(k) for f in dataclasses.fields(k)}
    return [f.name for f in dataclasses.fields(cls) if f.init and f.name not in inherited]


@functools.cache
def compressor_parameters(construct: Callable[..., Any]) -> tuple[list[inspect.Parameter], list[inspect.Parameter]]:
    """(positional, keyword-only) parameters of a compressor constructor ``construct(scheme, ...)``
    (PyTorch: ``named_parameters`` positional), annotations evaluated where they can be."""
    init = getattr(construct, "__init__", construct)
    try:
        sig = inspect.signature(init, eval_str=True)
    except Exception:  # an annotation that names something only a type checker sees
        sig = inspect.signature(init)
    params = list(sig.parameters.values())
    params = params[2:] if params and params[0].name == "self" else params[1:]  # self, scheme
    positional = [p for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    keyword = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return positional, keyword


def option_docs(doc: str | None) -> dict[str, str]:
    """``{name: text}`` from a Google-style ``Args:`` section (the compressors' docstrings)."""
    out: dict[str, str] = {}
    lines = inspect.cleandoc(doc or "").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Args:") + 1
    except StopIteration:
        return out
    indent, name = None, None
    for line in lines[start:]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth < indent:
            break
        key, colon, text = line.strip().partition(":")
        if depth == indent and colon and key.isidentifier():
            name = key
            out[name] = text.strip()
        elif name is not None:
            out[name] += " " + line.strip()
    return out


def check_options(options: Iterable[str], construct: Callable[..., Any], frontend: str, who: str) -> None:
    """Raise SpecError for a keyword ``construct`` does not take: another frontend's option
    ("codec= is PyTorch only (hvd_gradq.torch)"), or an unknown one, with the closest valid
    keyword. ``who`` names the call in the message."""
    positional, keyword = compressor_parameters(construct)
    check_keywords(options, [p.name for p in positional + keyword], frontend, who)


def check_keywords(given: Iterable[str], valid: list[str], frontend: str, who: str) -> None:
    for key in sorted(given):
        if key in valid:
            continue
        owner = FRONTEND_ONLY.get(key)
        if owner is not None and owner != frontend:
            framework = FRONTENDS[owner].framework
            raise SpecError(f"{key}= is {framework} only ({owner}); {who} of {frontend} does not take it")
        close = difflib.get_close_matches(key, valid, n=1)
        hint = f" (did you mean {close[0]}=?)" if close else ""
        raise SpecError(f"{who}: unknown keyword {key}={hint}; valid: {', '.join(valid)}")


# -- the factories -----------------------------------------------------------------------------------
def _fill(text: str, indent: str = "        ") -> str:
    return textwrap.fill(text, 100, initial_indent=indent, subsequent_indent=indent + "    ")


class SchemeFactory(Generic[C]):
    """``ORQ(*, levels=5, ..., seed=0, pattern='auto', ...)``: builds the scheme from its
    keywords and hands it, with the compressor's options, to the frontend's compressor class.

    A factory object rather than a closure so that it carries a real signature (``__signature__``)
    and docstring, and so that passing it uncalled (``compression=gq.ORQ``) fails at Horovod's
    first ``compress`` with a message naming ``gq.ORQ()``. (``__get__`` makes it a method
    descriptor, which ``help()`` renders with its signature, as it does a function.)"""

    def __init__(self, export: str, scheme: str, doc: str, construct: Callable[..., C], frontend: str) -> None:
        self.__name__ = self.__qualname__ = export
        self.__module__ = frontend
        self.scheme = scheme
        self.construct = construct
        self.frontend = frontend
        params = scheme_parameters(scheme)
        positional, options = compressor_parameters(construct)
        self._positional = [p.name for p in positional]
        self._scheme_keys = [p.name for p in params]
        self._option_keys = [p.name for p in options]
        self.__signature__ = inspect.Signature(positional + params + options, return_annotation=construct)
        self.__doc__ = self._doc(doc, params, positional + options)

    def example(self, value: Any = None) -> str:
        """``ORQ(levels=5)``: the scheme's first own parameter at ``value`` (else its default)."""
        own = own_parameters(self.scheme) or ([] if value is None else self._scheme_keys)
        if not own:
            return f"{self.__name__}()"
        default = next(p.default for p in self.__signature__.parameters.values() if p.name == own[0])
        return f"{self.__name__}({own[0]}={default if value is None else value!r})"

    def _doc(self, head: str, params: list[inspect.Parameter], options: list[inspect.Parameter]) -> str:
        fields = parameter_fields(self.scheme)
        cname = getattr(self.construct, "__name__", "the compressor")
        lines = [head, "", f"Returns a {self.frontend}.{cname}; pass it called: ``compression=gq.{self.example()}``.",
                 "", f"Scheme parameters (keyword only; the same names in spec strings and {ENV}):"]
        for p in params:
            kind = fields[p.name].metadata.get("kind")
            if isinstance(kind, type) and issubclass(kind, enum.Enum):
                what = " | ".join(m.value for m in kind)
            else:
                what = getattr(kind, "__name__", str(kind))
            doc = fields[p.name].metadata.get("doc", "")
            lines.append(_fill(f"{p.name} ({what}, default {p.default!r}): {doc}", "    "))
        docs = option_docs(getattr(self.construct, "__doc__", None))
        lines += ["", f"Compressor options ({self.frontend}.{cname}):"]
        for p in options:
            where = "; may be passed positionally" if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else ""
            lines.append(_fill(f"{p.name} (default {p.default!r}{where}): {docs.get(p.name, '')}", "    "))
        return "\n".join(lines)

    def __call__(self, *args: Any, **kwargs: Any) -> C:
        if len(args) > len(self._positional) or any(isinstance(a, _SCALARS) for a in args):
            besides = f", besides {', '.join(self._positional)}" if self._positional else ""
            first = next((a for a in args if isinstance(a, _SCALARS)), args[0])
            raise SpecError(
                f"{self.__name__} takes keyword arguments only{besides}: {self.example(first)}; "
                f"its parameters: {', '.join(self._scheme_keys)}; compressor options: {', '.join(self._option_keys)}")
        check_keywords(kwargs, self._positional + self._scheme_keys + self._option_keys, self.frontend,
                       self.__name__)
        scheme = {k: v for k, v in kwargs.items() if k in self._scheme_keys}
        options = {k: v for k, v in kwargs.items() if k not in self._scheme_keys}
        return self.construct(build(self.scheme, **scheme), *args, **options)

    def __get__(self, obj: Any, owner: type | None = None) -> SchemeFactory[C]:
        return self

    def __repr__(self) -> str:
        return f"<{self.frontend}.{self.__name__}: a compressor factory; call it, gq.{self.example()}>"

    def uncalled(self) -> GradqError:
        """The error for this factory passed where a compressor belongs."""
        return GradqError(
            f"{self.frontend}.{self.__name__} is a factory, not a compressor: pass it called, "
            f"compression=gq.{self.__name__}() (e.g. compression=gq.{self.example()})")

    # what Horovod calls on ``compression=``: the factory passed uncalled
    def compress(self, tensor: Any) -> Any:
        raise self.uncalled()

    def decompress(self, tensor: Any, ctx: Any) -> Any:
        raise self.uncalled()


@functools.cache
def _factory(export: str, declared: Declaration, construct: Callable[..., C], frontend: str) -> SchemeFactory[C]:
    # one object a declaration and frontend: the module's attribute and its __getattr__ agree
    # (gq.ORQ is gq.ORQ); a scheme registered again is a new declaration, so a new factory
    return SchemeFactory(export, declared.name, declared.doc, construct, frontend)


def scheme_factories(construct: Callable[..., C], frontend: str) -> dict[str, SchemeFactory[C]]:
    """The factory of every registered scheme that declares an export name, for ``frontend``
    (its module name), keyed by that name, in registration order."""
    return {d.export: _factory(d.export, d, construct, frontend) for d in declarations() if d.export is not None}


def install_factories(namespace: dict[str, Any], construct: Callable[..., C]) -> list[str]:
    """Bind every scheme's factory in a frontend module (``namespace``: its ``globals()``, whose
    ``__name__`` names the frontend) and return their names, sorted, for the module's
    ``__all__``. Real module attributes, so ``help(gq)``, ``dir(gq)`` and ``from ... import *``
    see them; a scheme registered later is reached through :func:`late_factory`.
    An export name the module already binds (``from_spec``, or an import) is refused, since the
    factory would hide it."""
    frontend = namespace["__name__"]
    factories = scheme_factories(construct, frontend)
    taken = sorted(set(factories) & set(namespace))
    if taken:
        owners = ", ".join(f"{e} (scheme {factories[e].scheme!r})" for e in taken)
        raise SpecError(f"{frontend} already has a name a scheme declares as its export: {owners}; "
                        "choose another export= in the scheme's @register")
    namespace.update(factories)
    return sorted(factories)


def late_factory(frontend: str, name: str, construct: Callable[..., C]) -> SchemeFactory[C]:
    """The factory exported as ``name`` by a scheme registered after ``frontend`` loaded (a
    plugin's, a test's): the frontend module's ``__getattr__``, which Python asks only for names
    the module lacks. Any other name raises AttributeError, as a module does."""
    declared = next((d for d in declarations() if d.export == name), None)
    if declared is None:
        raise AttributeError(f"module {frontend!r} has no attribute {name!r}")
    return _factory(name, declared, construct, frontend)


def with_options(fn: Callable[..., C], construct: Callable[..., Any]) -> Callable[..., C]:
    """``fn`` (``from_spec`` / ``from_env``, whose compressor options arrive as ``**options``) with
    a signature that lists those options, read from ``construct``, for ``help()`` and IDEs."""
    try:
        sig = inspect.signature(fn, eval_str=True)
    except Exception:  # an annotation that names something only a type checker sees
        sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    names = {p.name for p in own}
    _, keyword = compressor_parameters(construct)
    fn.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=own + [p for p in keyword if p.name not in names])
    return fn
