"""Error feedback for the PyTorch frontend: one residual per key, owned in one place.

A residual ``e`` is what compression left out of a tensor: the next step sends ``g + e`` and
keeps ``(g + e) - decoded`` (Seide et al. 2014; Karimireddy et al. 2019). Keys are the
parameter's name for a rank's own gradient and ``<name>#reduce`` for the reduced chunk that a rank
re-compresses in the scatter pattern (its server-side residual). This is GRACE's ``Memory``,
with the two things mixed precision needs (issue 12):

* **Loss scale.** With ``GradScaler`` the gradients that reach Horovod are multiplied by a scale
  S that changes (halved after an overflow, doubled after a run of good steps). A residual kept
  in scaled units would be off by that factor after every change, so residuals are stored
  unscaled (``e / S``) and rescaled with the current S when used. GradScaler's scales are
  powers of two, so both conversions are exact.
* **Skipped steps.** When a step's reduced gradients hold NaN/Inf (an overflow on any rank, which
  ``nonfinite=propagate`` carries to every rank as stock Horovod does), GradScaler skips the step
  on every rank. The residuals written during that step described an update that never happened,
  so :meth:`rollback` restores every residual the step wrote. Every rank decides on the same
  decoded bits, so they roll back together.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import GradqError

LossScale = Callable[[], Any]


class Memory:
    """Residuals keyed by tensor name, in unscaled float32 units, with a per-step undo log."""

    def __init__(self, loss_scale: LossScale | None = None) -> None:
        if loss_scale is not None and not callable(loss_scale):
            raise GradqError(
                "loss_scale must be a callable returning the current loss scale, e.g. "
                f"loss_scale=scaler.get_scale for a torch GradScaler; got {type(loss_scale).__name__}"
            )
        self._loss_scale = loss_scale
        self.residuals: dict[str, torch.Tensor] = {}
        self._undo: dict[str, torch.Tensor | None] = {}
        self._scale = 1.0

    def begin_step(self) -> None:
        """A new step starts: forget the undo log, read the loss scale once for the whole step."""
        self._undo.clear()
        if self._loss_scale is not None:
            s = float(self._loss_scale())
            if not s > 0 or s == float("inf"):
                raise GradqError(f"loss_scale() returned {s}; it must be a positive finite number")
            self._scale = s

    def compensate(self, key: str, x: torch.Tensor) -> torch.Tensor:
        """``x`` plus the residual of ``key`` (in the current loss scale's units)."""
        e = self.residuals.get(key)
        if e is None:
            return x
        e = e.to(x.device)
        return x + (e * self._scale if self._scale != 1.0 else e)

    def update(self, key: str, sent: torch.Tensor, decoded: torch.Tensor) -> None:
        """Keep ``sent - decoded`` for ``key``; where that is not finite, the old residual stays."""
        old = self.residuals.get(key)
        if key not in self._undo:
            self._undo[key] = old
        e = sent - decoded.to(sent.device)
        if self._scale != 1.0:
            e = e / self._scale
        bad = ~torch.isfinite(e)
        if bool(bad.any()):
            e = torch.where(bad, old if old is not None else torch.zeros_like(e), e)
        self.residuals[key] = e

    def rollback(self) -> None:
        """Undo every residual written since :meth:`begin_step` (the step was skipped)."""
        for key, old in self._undo.items():
            if old is None:
                self.residuals.pop(key, None)
            else:
                self.residuals[key] = old
        self._undo.clear()

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.residuals.values())
