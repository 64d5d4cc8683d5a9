"""The :class:`~hvd_gradq.xp.Ops` namespace over torch tensors (CPU or CUDA)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from ..kernels import feedback as fused
from ..xp import _host_result

Array = Any
_DT = {"int64": torch.int64, "float32": torch.float32, "float64": torch.float64, "uint8": torch.uint8}


class TorchOps:
    name = "torch"

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)

    def f32(self, x: Array) -> Array:
        return torch.as_tensor(x, device=self.device).to(torch.float32)

    def i64(self, x: Array) -> Array:
        return torch.as_tensor(x, device=self.device).to(torch.int64)

    def f64(self, x: Array) -> Array:
        return torch.as_tensor(x, device=self.device).to(torch.float64)

    def arange(self, n: int) -> Array:
        return torch.arange(n, dtype=torch.int64, device=self.device)

    def zeros(self, shape: tuple[int, ...], dtype: str) -> Array:
        return torch.zeros(shape, dtype=_DT[dtype], device=self.device)

    def full(self, shape: tuple[int, ...], value: float) -> Array:
        return torch.full(shape, value, dtype=torch.float32, device=self.device)

    def shape(self, x: Array) -> tuple[int, ...]:
        return tuple(int(s) for s in x.shape)

    def reshape(self, x: Array, shape: tuple[int, ...]) -> Array:
        return torch.reshape(x, shape)

    def concat(self, xs: Sequence[Array], axis: int) -> Array:
        return torch.cat(list(xs), dim=axis)

    def amax(self, x: Array, axis: int) -> Array:
        return torch.amax(x, dim=axis, keepdim=True)

    def amin(self, x: Array, axis: int) -> Array:
        return torch.amin(x, dim=axis, keepdim=True)

    def sum(self, x: Array, axis: int) -> Array:
        return torch.sum(x, dim=axis, keepdim=True)

    def sort(self, x: Array, axis: int) -> Array:
        return torch.sort(x, dim=axis).values

    def take(self, x: Array, idx: Array) -> Array:
        return x.reshape(-1)[idx]

    def take_along(self, x: Array, idx: Array) -> Array:
        if x.shape[0] != idx.shape[0]:
            x = x.expand(idx.shape[0], x.shape[1])
        return torch.gather(x, -1, idx)

    def abs(self, x: Array) -> Array:
        return torch.abs(x)

    def sqrt(self, x: Array) -> Array:
        # torch's float32 sqrt is not correctly rounded on CPU (SLEEF); through float64 it is,
        # to the bit, which keeps codes identical to NumPy's.
        return torch.sqrt(x.to(torch.float64)).to(x.dtype) if x.dtype == torch.float32 else torch.sqrt(x)

    def floor(self, x: Array) -> Array:
        return torch.floor(x)

    def where(self, c: Array, a: Array, b: Array) -> Array:
        return torch.where(c, a, b)

    def minimum(self, a: Array, b: Array) -> Array:
        return torch.minimum(a, b)

    def maximum(self, a: Array, b: Array) -> Array:
        return torch.maximum(a, b)

    def clip(self, x: Array, lo: Array, hi: Array) -> Array:
        # bounds may be scalars (fp16 scales clip to a NumPy float32 limit): tensors of x's dtype
        lo, hi = (b if isinstance(b, torch.Tensor) else torch.as_tensor(b, dtype=x.dtype, device=x.device)
                  for b in (lo, hi))
        return torch.minimum(torch.maximum(x, lo), hi)

    def isfinite(self, x: Array) -> Array:
        return torch.isfinite(x)

    def shr(self, x: Array, k: int) -> Array:
        return torch.bitwise_right_shift(x, k)

    def xor(self, a: Array, b: Array) -> Array:
        return torch.bitwise_xor(a, torch.as_tensor(b, device=self.device) if isinstance(b, int) else b)

    def band(self, a: Array, b: int) -> Array:
        return torch.bitwise_and(a, b)

    def floordiv_by(self, a: Array, b: Array) -> Array:
        return torch.div(a, b, rounding_mode="floor")

    def mod(self, a: Array, b: int) -> Array:
        return torch.remainder(a, b)

    def scatter(self, n: int, idx: Array, vals: Array) -> Array:
        out = torch.zeros(n, dtype=torch.float32, device=self.device)
        out[idx] = vals.to(torch.float32)
        return out

    def topk_abs(self, x: Array, k: int) -> Array:
        # TOPK_TIES (hvd_gradq.xp): torch.topk breaks ties as it likes (differently on CPU and
        # CUDA), but the k-th largest value it finds is the same whichever elements it took;
        # the elements are then picked from it: all above it, and its ties by lowest index.
        n = x.shape[0]
        if k >= n:
            return torch.arange(n, dtype=torch.int64, device=self.device)
        a = torch.abs(x)
        t = torch.topk(a, k, sorted=False).values.amin()
        above = a > t
        ties = a == t
        need = k - above.sum()
        chosen = above | (ties & (torch.cumsum(ties, 0) <= need))
        return torch.nonzero(chosen).reshape(-1)

    def to_f16(self, x: Array) -> Array:
        return x.to(torch.float16)

    def to_numpy(self, x: Array) -> NDArray[Any]:
        return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)

    def from_numpy(self, x: NDArray[Any]) -> Array:
        return torch.from_numpy(np.ascontiguousarray(x)).to(self.device)

    def host_view(self, x: Array) -> NDArray[Any] | None:
        """A NumPy array sharing ``x``'s memory (flat), for a contiguous float32 or bool CPU tensor;
        else None. The optional hook compiled host code (:class:`hvd_gradq.feedback.Memory`) asks
        for: it then opens no parallel region of torch's intra-op pool."""
        # a few microseconds: asked several times a tensor, so the cheapest tests (is_cpu, not device.type)
        if (isinstance(x, torch.Tensor) and x.is_cpu and (x.dtype is torch.float32 or x.dtype is torch.bool)
                and not x.requires_grad and x.is_contiguous()):
            v = x.numpy()
            return v if v.ndim == 1 else v.reshape(-1)
        return None

    def orq_levels(self, x: Array, s: int) -> Array | None:
        """ORQ's ``s`` levels of buckets ``x`` (rows, w) searched on this device
        (:mod:`.device_levels`, the host search's bits), or None for an ``s`` it leaves to
        :meth:`host`. The optional hook :func:`hvd_gradq.schemes.orq.choose_levels` looks for."""
        from . import device_levels

        return device_levels.levels(x, s) if s in device_levels.LEVELS else None

    def host(self, fn: Callable[[NDArray[Any]], NDArray[Any]], x: Array, shape: tuple[int, ...]) -> Array:
        """``fn`` on a NumPy copy of ``x`` (``.cpu().numpy()``), the float32 result back on the device."""
        return self.from_numpy(_host_result(fn(self.to_numpy(x)), shape))


#: the namespace of CPU tensors
HOST = TorchOps("cpu")


def all_finite(x: torch.Tensor) -> bool:
    """Whether every element of ``x`` is finite: for a CPU float32 tensor one compiled pass on this
    rank's codec threads (:func:`hvd_gradq.kernels.feedback.all_finite`), never a parallel region
    of torch's intra-op pool; else torch's."""
    view = HOST.host_view(x)
    if view is not None:
        return fused.all_finite(view)
    return bool(torch.isfinite(x).all())
