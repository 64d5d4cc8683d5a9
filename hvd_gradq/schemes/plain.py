"""Pass-through schemes: ``none`` (fp32) and ``fp16`` (half precision, 2x)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import RangeError, SpecError
from ..xp import Array, Ops, Seed
from .options import param
from .registry import register
from .scheme import Scheme, Section

FP16_MAX = 65504.0
OVERFLOW = ("inf", "raise", "saturate")


@register("none", export="NoCompression",
          doc="fp32 payloads through hvd_gradq's own collectives (a baseline).")
@dataclass(frozen=True, kw_only=True)
class NoneScheme(Scheme):
    """No compression: the float32 values themselves."""

    unbiased_rounding: ClassVar[bool] = True

    def sections(self, n: int) -> list[Section]:
        return [Section("values", "float32", n)]

    def code_bits(self, n: int) -> float:
        return 32.0 * n

    def encode(self, ops: Ops, x: Array, seed: Seed) -> dict[str, Array]:
        return {"values": ops.f32(x)}

    def decode(self, ops: Ops, parts: dict[str, Array], n: int) -> Array:
        return ops.f32(parts["values"])


@register("fp16", export="FP16", doc="Half precision, 2x.")
@dataclass(frozen=True, kw_only=True)
class FP16Scheme(Scheme):
    """IEEE half precision. Values beyond fp16's range (|x| > 65504):

    * ``overflow=inf`` (default): the IEEE cast, as Horovod's own ``Compression.fp16`` does:
      they become +-inf, which torch's GradScaler sees, skipping the step and lowering its loss
      scale (loss-scaled gradients of 2**18 are finite in fp32 and must not stop training);
    * ``overflow=raise``: an error naming the magnitude;
    * ``overflow=saturate``: clamped to +-65504, finite but biased.

    NaN and Inf in the input come through as NaN and Inf (``nonfinite=propagate``)."""

    unbiased_rounding: ClassVar[bool] = False
    overflow: str = param("inf", str, "inf | raise | saturate")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.overflow not in OVERFLOW:
            raise SpecError(f"fp16: overflow={self.overflow!r} is not valid; valid: {', '.join(OVERFLOW)}")

    def sections(self, n: int) -> list[Section]:
        return [Section("values", "float16", n)]

    def code_bits(self, n: int) -> float:
        return 16.0 * n

    def encode(self, ops: Ops, x: Array, seed: Seed) -> dict[str, Array]:
        lim = np.float32(FP16_MAX)
        if self.overflow == "saturate":
            x = ops.clip(x, -lim, lim)
        elif self.overflow == "inf":
            with np.errstate(over="ignore"):  # the overflow to +-inf is what is asked for
                return {"values": ops.to_f16(x)}
        elif ops.shape(x)[0] and hasattr(ops, "guard_max_abs"):
            # A graph namespace (TensorFlow) cannot read values back while tracing: it adds a
            # run-time check that fails the step with this message instead.
            x = ops.guard_max_abs(
                x, FP16_MAX, "fp16: a value exceeds fp16's range (65504); use fp16:overflow=saturate "
                "to clamp, or a scheme with per-bucket scales")
        elif ops.shape(x)[0] and float(ops.to_numpy(ops.amax(ops.abs(x), 0))[0]) > FP16_MAX:
            big = float(ops.to_numpy(ops.amax(ops.abs(x), 0))[0])
            if big == big and big != float("inf"):
                raise RangeError(
                    f"fp16: a value of magnitude {big:.6g} exceeds fp16's range (65504); "
                    "use fp16:overflow=saturate to clamp, or a scheme with per-bucket scales"
                )
        return {"values": ops.to_f16(x)}

    def decode(self, ops: Ops, parts: dict[str, Array], n: int) -> Array:
        return ops.f32(parts["values"])
