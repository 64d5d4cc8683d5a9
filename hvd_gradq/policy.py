"""What a frontend does around a scheme, apart from its mathematics: error feedback, warm-up and
non-finite gradients.

**Why apart.** A scheme (:mod:`hvd_gradq.schemes`) is what encoding and decoding need: its
buckets, levels, clipping, the precision of its scales. Whether a rank adds a residual before
encoding, sends the first steps uncompressed or stops on a NaN changes nothing in how a
payload's bytes are laid out or read back, so none of it travels in a payload header
(:mod:`hvd_gradq.wire.payload`), and a decoder never has to know it. It is a :class:`Policy`,
kept beside the scheme in a :class:`hvd_gradq.spec.Config` (BytePS picks its error feedback by
``ef_type`` around any compressor in the same way).

**One grammar.** Users still write the policy into the same spec string as the scheme
(``orq:levels=5,ef=true,warmup=10,nonfinite=raise``) and pass the same keywords to the factories
(``gq.ORQ(levels=5, ef=True)``): :func:`hvd_gradq.spec.parse` splits the keys of :data:`KEYS`
off into a Policy and hands the rest to the scheme. The values are checked here, with the same
messages as any scheme parameter's.

**Error feedback is a named variant** (:mod:`hvd_gradq.feedback`'s registry): ``ef=false`` is
``none``, ``ef=true`` is ``classic`` (e <- p - decode(Q(p)), p = g + e), and a variant
registered there is valid as ``ef=<its name>`` with no change here or in a frontend. A scheme
class may change the default (:attr:`hvd_gradq.schemes.scheme.Scheme.default_ef`: BinGrad is
biased, so its error feedback is on unless a user turns it off).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from . import feedback
from .errors import SpecError
from .schemes.options import NonFinite, as_bool, changed, convert, param

__all__ = ["KEYS", "NonFinite", "Policy"]


@dataclass(frozen=True, kw_only=True)
class Policy:
    """Error feedback, warm-up and non-finite handling for one compressor (every tensor it sends).

    ``feedback``: the error-feedback variant's name (``none``, ``classic``, or any registered
    one; spelled ``ef`` in a spec, where ``true``/``false`` name ``classic``/``none``).
    ``nonfinite``: what a gradient holding NaN/Inf becomes (:class:`NonFinite`). ``warmup``: how
    many first steps of each tensor go as Horovod's exact fp32 allreduce."""

    feedback: str = param(feedback.NONE, bool, "error feedback: e <- p - decode(Q(p)), p = g + e", key="ef")
    nonfinite: NonFinite = param(NonFinite.PROPAGATE, NonFinite, "propagate | raise | skip")
    warmup: int = param(0, int, "the first steps of each tensor go uncompressed (fp32 allreduce)")

    def __post_init__(self) -> None:
        feedback.rule(self.feedback)  # a SpecError naming the registered variants
        if self.warmup < 0:
            raise SpecError(f"warmup={self.warmup} must be 0 (none) or a number of steps")

    @property
    def ef(self) -> bool:
        """Whether tensors keep error-feedback residuals (any variant but ``none``)."""
        return feedback.rule(self.feedback).active

    @classmethod
    def of(cls, who: str, params: dict[str, Any], default_ef: bool = False) -> Policy:
        """The policy of a spec's policy keys (``ef``, ``nonfinite``, ``warmup``: strings or
        Python values), the rest at their defaults (``default_ef``: the scheme class's). ``who``
        (the scheme's name) starts every error message."""
        out: dict[str, Any] = {"feedback": feedback.CLASSIC if default_ef else feedback.NONE}
        for key, raw in params.items():
            name = KEYS[key]
            out[name] = _variant(who, raw) if name == "feedback" else convert(who, FIELDS[name], raw)
        try:
            return cls(**out)
        except SpecError as e:
            raise SpecError(f"{who}: {e}") from None

    def items(self, default_ef: bool = False) -> list[str]:
        """``key=value`` of what differs from the defaults (``default_ef``: the scheme class's),
        as a spec spells it: ``ef=true``, ``warmup=10``."""
        base = Policy(feedback=feedback.CLASSIC if default_ef else feedback.NONE)
        out = []
        if self.feedback != base.feedback:
            out.append(f"ef={_ef_text(self.feedback)}")
        rest = dataclasses.replace(self, feedback=feedback.NONE)
        return out + changed(rest)


FIELDS = {f.name: f for f in dataclasses.fields(Policy)}
#: spec key -> Policy field, in the order a canonical spec writes them
KEYS: dict[str, str] = {f.metadata.get("key", f.name): f.name for f in dataclasses.fields(Policy)}


def _variant(who: str, raw: Any) -> str:
    """``ef``'s value: a boolean (``classic`` or ``none``) or a registered variant's name."""
    flag = as_bool(raw)
    if flag is not None:
        return feedback.CLASSIC if flag else feedback.NONE
    extra = [n for n in feedback.rules() if n not in (feedback.CLASSIC, feedback.NONE)]
    if isinstance(raw, str) and raw.strip().lower() in extra:
        return raw.strip().lower()
    more = f", or an error-feedback variant: {', '.join(extra)}" if extra else ""
    raise SpecError(f"{who}: ef={raw!r} is not a boolean; valid: true or false{more}")


def _ef_text(variant: str) -> str:
    return {feedback.CLASSIC: "true", feedback.NONE: "false"}.get(variant, variant)
