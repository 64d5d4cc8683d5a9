"""``nonfinite=raise`` for the tensors Horovod's own allreduce reduces (PyTorch): tiny tensors,
``warmup``'s exact steps, ``auto``'s fp16/fp32 plans, and one-rank sets.

A compressed tensor's encoder sees this rank's NaN/Inf before anything is sent, and the stop
protocol (:mod:`hvd_gradq.reduce.stop`) tells every rank which rank held them. A tensor handed
to Horovod as it is has no encoder: only its sum shows them, and a sum carries any rank's
NaN/Inf to every rank, bit for bit. So each such sum is checked as ``decompress()`` returns it
(the compressor's one compiled pass over it, which error feedback's rollback reads too), and the
first that fails is raised at the step's last ``decompress()``: every rank then raises alike,
before the optimizer applies the step; and where a compressed tensor of the same step stopped,
its error (which names the rank) is the one raised, since it comes first or at the same call.
Off unless ``nonfinite=raise``: the default ``propagate`` leaves the sums to the user's
``GradScaler``, as stock Horovod does.
"""
from __future__ import annotations

from ..policy import Policy
from ..reduce.stop import plain_nonfinite
from ..schemes.options import NonFinite
from .context import Pass


class PlainCheck:
    """The step's first non-finite sum of a :class:`~.context.Pass` tensor, raised at its end."""

    def __init__(self, policy: Policy) -> None:
        self.on = policy.nonfinite is NonFinite.RAISE
        self._first: Pass | None = None

    def begin_step(self) -> None:
        self._first = None  # a step that stopped on another error: nothing of it is raised later

    def saw(self, ctx: Pass) -> None:
        """``ctx``'s tensor came back as a sum holding NaN/Inf."""
        if self.on and self._first is None:
            self._first = ctx

    def end_of_step(self) -> None:
        """The step's last ``decompress()`` has its result: raise for the first non-finite sum."""
        first, self._first = self._first, None
        if first is not None:
            raise plain_nonfinite(first.name, first.how)
