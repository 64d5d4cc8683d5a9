"""PyTorch's side of error feedback: where residuals live, and the loss scale read once a step.

The rule itself (compensate, update, keep the old residual where the new one is not finite, roll
a skipped step back) is :class:`hvd_gradq.feedback.Memory`, shared with TensorFlow. What is
PyTorch's own:

* :class:`TensorStore`: residuals are plain float32 tensors in a dict keyed by parameter name
  (and ``<name>#reduce`` for the scatter pattern's server side), on the gradient's device, so
  ``state_dict`` can save them with ``torch.save``.
* **The loss scale** comes from a callable (``scaler.get_scale`` of a ``GradScaler``), read once
  at the first ``compress()`` of a step (:func:`read_loss_scale`): every tensor of a step sees the
  same scale even if the scaler changes it half-way. GradScaler's scales are powers of two, so
  the unscaled residuals are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import GradqError

LossScale = Callable[[], Any]


class TensorStore:
    """Residuals as float32 tensors, keyed by name; a :class:`hvd_gradq.feedback.Store`."""

    def __init__(self) -> None:
        self.residuals: dict[str, torch.Tensor] = {}

    def read(self, key: str, like: torch.Tensor) -> torch.Tensor | None:
        """The residual of ``key`` on ``like``'s device; one of another size (restored from a
        checkpoint of another model or world) is refused here, naming it, before torch's
        arithmetic fails on it with a bare size error."""
        e = self.residuals.get(key)
        if e is None:
            return None
        if e.numel() != like.numel():
            raise GradqError(
                f"the error-feedback residual of {key!r} has {e.numel()} elements; this step's gradient (or its "
                f"chunk) has {like.numel()}. It was restored from a checkpoint of another model or world size: "
                "load the compressor's state into the model and world it was saved with, or leave it out (a fresh "
                "compressor)")
        return e.to(like.device)

    def write(self, key: str, value: torch.Tensor) -> None:
        self.residuals[key] = value

    def forget(self, key: str) -> None:
        self.residuals.pop(key, None)

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.residuals.values())


def check_loss_scale(loss_scale: Any) -> LossScale | None:
    """``loss_scale`` as given to the compressor, refused early if it cannot be one."""
    if loss_scale is not None and not callable(loss_scale):
        raise GradqError(
            "loss_scale must be a callable returning the current loss scale, e.g. "
            f"loss_scale=scaler.get_scale for a torch GradScaler; got {type(loss_scale).__name__}"
        )
    fn: LossScale | None = loss_scale
    return fn


def read_loss_scale(loss_scale: LossScale | None) -> float | None:
    """The step's loss scale (None without one), checked: positive and finite."""
    if loss_scale is None:
        return None
    s = float(loss_scale())
    if not s > 0 or s == float("inf"):
        raise GradqError(f"loss_scale() returned {s}; it must be a positive finite number")
    return s
