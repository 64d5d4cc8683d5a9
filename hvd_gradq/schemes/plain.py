"""Pass-through schemes: ``none`` (fp32) and ``fp16`` (half precision, 2x)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import GradqError, SpecError
from ..spec import register
from ..xp import Array, Ops
from .base import Scheme, Section, param

FP16_MAX = 65504.0


@register("none")
@dataclass(frozen=True, kw_only=True)
class NoneScheme(Scheme):
    """No compression: the float32 values themselves."""

    unbiased: ClassVar[bool] = True

    def sections(self, n: int) -> list[Section]:
        return [Section("values", "float32", n)]

    def code_bits(self, n: int) -> float:
        return 32.0 * n

    def encode(self, ops: Ops, x: Array, seed: int) -> dict[str, Array]:
        return {"values": ops.f32(x)}

    def decode(self, ops: Ops, parts: dict[str, Array], n: int) -> Array:
        return ops.f32(parts["values"])


@register("fp16")
@dataclass(frozen=True, kw_only=True)
class FP16Scheme(Scheme):
    """IEEE half precision. Values beyond fp16's range (|x| > 65504) either raise (default,
    ``overflow=raise``) or saturate to +-65504 (``overflow=saturate``); never a silent inf."""

    unbiased: ClassVar[bool] = False
    overflow: str = param("raise", str, "raise | saturate")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.overflow not in ("raise", "saturate"):
            raise SpecError(f"fp16: overflow={self.overflow!r} is not valid; valid: raise, saturate")

    def sections(self, n: int) -> list[Section]:
        return [Section("values", "float16", n)]

    def code_bits(self, n: int) -> float:
        return 16.0 * n

    def encode(self, ops: Ops, x: Array, seed: int) -> dict[str, Array]:
        lim = np.float32(FP16_MAX)
        if self.overflow == "saturate":
            x = ops.clip(x, -lim, lim)
        elif ops.shape(x)[0] and hasattr(ops, "guard_max_abs"):
            # A graph namespace (TensorFlow) cannot read values back while tracing: it adds a
            # run-time check that fails the step with this message instead.
            x = ops.guard_max_abs(
                x, FP16_MAX, "fp16: a value exceeds fp16's range (65504); use fp16:overflow=saturate "
                "to clamp, or a scheme with per-bucket scales")
        elif ops.shape(x)[0] and float(ops.to_numpy(ops.amax(ops.abs(x), 0))[0]) > FP16_MAX:
            big = float(ops.to_numpy(ops.amax(ops.abs(x), 0))[0])
            if big == big and big != float("inf"):
                raise GradqError(
                    f"fp16: a value of magnitude {big:.6g} exceeds fp16's range (65504); "
                    "use fp16:overflow=saturate to clamp, or a scheme with per-bucket scales"
                )
        return {"values": ops.to_f16(x)}

    def decode(self, ops: Ops, parts: dict[str, Array], n: int) -> Array:
        return ops.f32(parts["values"])
