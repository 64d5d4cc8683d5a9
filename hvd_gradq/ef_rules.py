"""Error feedback's variants: which rule a tensor follows is the policy's ``ef``
(:class:`hvd_gradq.policy.Policy`), a name in the small registry here: ``none`` (no residual)
and ``classic`` (:mod:`hvd_gradq.feedback`'s rule; a spec's ``ef=true``). A variant is one class
with :meth:`Rule.compensate` and :meth:`Rule.residual`, registered with
``@register_rule("name")``; it is then valid as ``ef=name`` in a spec and a factory's ``ef=``
keyword, and :class:`hvd_gradq.feedback.Memory` runs it (the frontends call only ``Memory``, so
they are unchanged). Loss-scale units, the non-finite guard and the undo log stay ``Memory``'s,
the same for every variant."""
from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, TypeVar

from .errors import SpecError
from .xp import Array


class Rule:
    """One error-feedback variant: what is sent given the residual, and the residual it leaves.
    Both take and return tensors of the namespace in use (``+``/``-`` work in all of them)."""

    name: ClassVar[str] = "?"
    #: whether tensors under this rule keep residuals at all (``none``: no)
    active: ClassVar[bool] = True

    def compensate(self, x: Array, e: Array) -> Array:
        """The tensor to send, from the gradient ``x`` and the stored residual ``e`` (already in
        the step's loss-scale units)."""
        raise NotImplementedError

    def residual(self, sent: Array, decoded: Array) -> Array:
        """The residual to keep, from what was sent and what the receivers decoded (in the
        step's loss-scale units; :class:`Memory` divides by the scale)."""
        raise NotImplementedError


_RULES: dict[str, Rule] = {}
R = TypeVar("R", bound=type[Rule])


def register_rule(name: str) -> Callable[[R], R]:
    """Class decorator: make an error-feedback variant available as ``ef=name``; a duplicate
    name, or one a spec reads as a boolean (``true``, ``off``, ...), is refused."""

    def deco(cls: R) -> R:
        if name in _RULES or name.lower() in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            raise SpecError(f"error-feedback variant {name!r} is already registered or reads as a boolean")
        cls.name = name
        _RULES[name] = cls()
        return cls

    return deco


def rule(name: str) -> Rule:
    """The variant registered as ``name``, or a SpecError listing those that are."""
    try:
        return _RULES[name]
    except KeyError:
        raise SpecError(f"unknown error-feedback variant {name!r}; valid: {', '.join(sorted(_RULES))}") from None


def rules() -> list[str]:
    """The registered variants' names, sorted."""
    return sorted(_RULES)


@register_rule("none")
class NoFeedback(Rule):
    """No error feedback: nothing is kept, the gradient is sent as it is."""

    active: ClassVar[bool] = False

    def compensate(self, x: Array, e: Array) -> Array:
        return x

    def residual(self, sent: Array, decoded: Array) -> Array:
        return sent - sent


@register_rule("classic")
class Classic(Rule):
    """``p = g + e`` is sent, ``e <- p - decode(Q(p))`` kept (Seide et al. 2014; Karimireddy et
    al. 2019): a spec's ``ef=true``."""

    def compensate(self, x: Array, e: Array) -> Array:
        return x + e

    def residual(self, sent: Array, decoded: Array) -> Array:
        return sent - decoded


#: the variant ``ef=true`` names
CLASSIC = "classic"
#: the variant ``ef=false`` names
NONE = "none"
