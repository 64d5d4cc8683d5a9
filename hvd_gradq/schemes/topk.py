"""Top-K sparsification (Aji & Heafield 2017; Stich et al. 2018 with error feedback): keep the
``ratio`` share of elements of largest magnitude. Indices are sent at ceil(log2 n) bits each;
the kept values are coded by another scheme (``values``: fp16 by default, or any registered
scheme name with its default parameters, e.g. ``values=orq``). Biased without ``ef``.

Which elements are kept is one total order in every namespace (:data:`hvd_gradq.xp.TOPK_TIES`:
larger magnitude first, equal magnitudes by lower index), so the host kernels, ``codec=device``
and TensorFlow keep the same ones when fp16/bf16 gradients tie at the k-th place.

Non-finite input (``nonfinite=propagate``): NaN and +-Inf rank above every finite magnitude, so
they are kept first and come through as the value scheme codes them (fp16 and none: as they are;
a bucketed value scheme: their bucket of kept values decodes as NaN). The decoded tensor then
holds NaN or Inf wherever the input did, as far as ``ratio`` keeps them (at least one)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import PayloadError, SpecError
from ..wire.packing import pack_bits, unpack_bits
from ..xp import NUMPY, Array, Ops, Seed
from .options import param
from .registry import build, names, register
from .scheme import Scheme, Section


def index_bits(n: int) -> int:
    return max(1, math.ceil(math.log2(max(n, 2))))


@register("topk", export="TopK",
          doc="Top-K: the ``ratio`` share of largest magnitudes, values coded by ``values``.")
@dataclass(frozen=True, kw_only=True)
class TopK(Scheme):
    ratio: float = param(0.01, float, "share of elements kept, in (0, 1]")
    values: str = param("fp16", str, "scheme name coding the kept values (fp16, none, orq, ...)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.ratio <= 1.0:
            raise SpecError(f"topk: ratio={self.ratio} is not valid; valid: 0 < ratio <= 1")
        if self.values == "topk" or self.values not in names():
            valid = [n for n in names() if n != "topk"]
            raise SpecError(f"topk: values={self.values!r} is not valid; valid: {', '.join(valid)}")

    @property
    def value_scheme(self) -> Scheme:
        return build(self.values, bucket=self.bucket)

    @property
    def limit(self) -> float:
        return self.value_scheme.limit

    def kept(self, n: int) -> int:
        return min(n, max(1, math.ceil(self.ratio * n))) if n else 0

    def sections(self, n: int) -> list[Section]:
        k = self.kept(n)
        vs = self.value_scheme.sections(k)
        return [Section("indices", "uint8", -(-(k * index_bits(n)) // 8))] + [
            Section("v_" + s.name, s.dtype, s.count) for s in vs
        ]

    def code_bits(self, n: int) -> float:
        k = self.kept(n)
        return k * index_bits(n) + self.value_scheme.code_bits(k)

    def encode(self, ops: Ops, x: Array, seed: Seed) -> dict[str, Array]:
        n = ops.shape(x)[0]
        k = self.kept(n)
        # NaN ranks as +inf (x == x is false for NaN only); finite input is selected as before
        key = ops.where(x == x, x, ops.full((1,), math.inf))
        idx = ops.topk_abs(key, k)
        vals = ops.take(x, idx)
        out = {"indices": pack_bits(ops, idx, index_bits(n))}
        for name, arr in self.value_scheme.encode(ops, vals, seed).items():
            out["v_" + name] = arr
        return out

    def check_parts(self, parts: dict[str, NDArray[Any]], n: int) -> None:
        k = self.kept(n)
        if k:
            idx = np.asarray(unpack_bits(NUMPY, np.asarray(parts["indices"]).astype(np.int64), index_bits(n), k))
            if int(idx.max()) >= n:
                raise PayloadError(
                    f"corrupt top-k payload: index {int(idx.max())} is out of range for a tensor of {n} elements"
                )
            if k > 1 and not bool(np.all(np.diff(idx) > 0)):
                raise PayloadError("corrupt top-k payload: indices must be strictly increasing (each kept once)")
        vparts = {name[2:]: arr for name, arr in parts.items() if name.startswith("v_")}
        self.value_scheme.check_parts(vparts, k)

    def decode(self, ops: Ops, parts: dict[str, Array], n: int) -> Array:
        k = self.kept(n)
        idx = unpack_bits(ops, parts["indices"], index_bits(n), k)
        vparts = {name[2:]: arr for name, arr in parts.items() if name.startswith("v_")}
        vals = self.value_scheme.decode(ops, vparts, k)
        return ops.scatter(n, idx, vals)
