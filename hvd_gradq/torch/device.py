"""Encoding and decoding on the gradient's own device: only payload bytes cross to the host.

On a GPU the host path (:mod:`hvd_gradq.reduce.codec`: the compiled kernels) would copy every
full-size gradient to the host, and every decoded one back. Here the scheme's own mathematics
runs on the tensor's device through :class:`~hvd_gradq.torch.ops.TorchOps` (the same source the
NumPy reference runs, so the same bits: ``tests/parallel/test_torch_compat.py`` trains with
``codec=device`` on CPU tensors and compares digests with the host path), the packed sections
(a fraction of the gradient) are copied to the host to be framed as a payload, and the gathered
payloads go back to the device to be decoded and summed there.

Every pattern takes this path: gather and scatter through :func:`encode_any`, :func:`sum_any`
and :func:`decode_any` (which choose it from where the values are), summable by running its
statistics, codes and lanes with the device's ``TorchOps`` (only the per-bucket statistics and
the packed lanes cross). What still reads full buckets on the host: ORQ with 6 levels or more
and BinGrad-pb, whose level search is a host function (``Ops.host``: the exact programs are
sequential); ORQ-4/5 search on the device (:mod:`.device_levels`, the host search's bits on
CPU tensors), as BinGrad-b and ORQ-2/3 always did. A
tensor the device path cannot take as it is (NaN/Inf, or values beyond the scheme's float32
range) goes to the host path, which applies the scheme's ``nonfinite`` policy and its errors.

``codec=`` (compressor option, or ``HVD_GRADQ_CODEC``): ``auto`` (the device path for CUDA
tensors, the host kernels for CPU ones, which are faster there), ``host`` or ``device``.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from ..api import Payload, decode_flat, payload_of
from ..errors import GradqError
from ..reduce import codec
from ..schemes.scheme import Scheme
from ..spec import SchemeLike, as_config
from ..xp import Seed
from .ops import TorchOps

#: The environment variable that sets ``codec`` when the compressor gets none.
ENV = "HVD_GRADQ_CODEC"
CODECS = ("auto", "host", "device")


def resolve_codec(codec: str | None) -> str:
    """``codec`` if given, else ``HVD_GRADQ_CODEC``, else ``auto``; a GradqError names the valid ones."""
    value = codec if codec is not None else (os.environ.get(ENV, "").strip() or "auto")
    if value not in CODECS:
        where = "codec=" if codec is not None else ENV
        raise GradqError(f"{where}: {value!r} is not a codec; use one of {', '.join(CODECS)}")
    return value


def on_device(codec: str, x: torch.Tensor) -> bool:
    """Whether ``x`` is encoded on its device under ``codec``."""
    return codec == "device" or (codec == "auto" and x.is_cuda)


def encode(scheme: Scheme, x: torch.Tensor, seed: Seed,
           own: bool = True) -> tuple[NDArray[np.uint8], torch.Tensor | None] | None:
    """The payload bytes of flat float32 ``x`` and this rank's decoded values (on ``x``'s device;
    None where ``own`` is False), or None when ``x`` holds values the device path leaves to the
    host path (see the docstring)."""
    if x.numel() and not bool((x.abs() < scheme.limit).all()):  # NaN compares False: the host path
        return None
    ops = TorchOps(x.device)
    parts = scheme.encode(ops, x, seed)
    mine = scheme.decode(ops, parts, x.numel()) if own else None
    host = {k: v.cpu().numpy() for k, v in parts.items()}  # payload-sized copies
    return payload_of(scheme, host, (x.numel(),), "float32").to_array(), mine


def decode_sum(buf: NDArray[np.uint8], own_rank: int, own: torch.Tensor | None, name: str,
               ranks: Sequence[int] | None = None, where: torch.device | None = None,
               out: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """The sum over ranks, in rank order, of the payloads in a gathered buffer, decoded on
    ``own``'s device (``own`` stands for this rank's payload; None: decoded as the others, on
    ``where``); returns (sum, payload count). The same checks as the host path's
    :func:`hvd_gradq.reduce.codec.decode_sum`, and its one buffer (``out``, else a fresh tensor)
    that each payload is added to in place, in rank order."""
    payloads = codec.split_checked(buf, name, ranks)
    if not payloads:
        raise GradqError(f"{name}: the gathered buffer holds no payload")
    dev = own.device if own is not None else torch.device("cpu") if where is None else where
    total = torch.empty(payloads[0].n, dtype=torch.float32, device=dev) if out is None else out
    for r, p in enumerate(payloads):
        v = own if r == own_rank and own is not None else decode_on(p, dev)  # check_parts: bad codes raise
        if r:
            total.add_(v)
        else:
            total.copy_(v)
    return total, len(payloads)


def encode_any(scheme: SchemeLike, x: torch.Tensor, seed: Seed, what: str,
               device: bool, own: bool = True) -> tuple[NDArray[np.uint8], Any]:
    """The payload and own values of flat float32 ``x`` (None for them where ``own`` is False):
    on its device when ``device`` (own: a tensor there) and the device path takes it, else on
    the host (own: NumPy; the host path raises NonFiniteError under a config's nonfinite=raise)."""
    got = encode(as_config(scheme).scheme, x, seed, own) if device else None
    return got if got is not None else codec.encode(scheme, x.cpu().numpy(), seed, what, own)


def sum_any(buf: NDArray[np.uint8], own_rank: int, own: Any, name: str, ranks: Sequence[int] | None = None,
            where: torch.device | None = None, out: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """The sum of a gathered buffer's payloads where ``own`` lives (a tensor: its device; NumPy:
    the host kernels, as a CPU tensor; None: on ``where``, the host kernels where that is None),
    and the payload count; into ``out`` where given (a float32 tensor of the sum's size)."""
    if isinstance(own, torch.Tensor) or (own is None and where is not None):
        return decode_sum(buf, own_rank, own, name, ranks, where, out)
    host = None if out is None else out.numpy()
    total, count = codec.decode_sum(buf, own_rank, own, name, ranks, host)
    return (out if out is not None else torch.from_numpy(total)), count


def decode_any(p: Payload, like: Any) -> torch.Tensor:
    """One payload decoded (flat float32) where ``like`` lives, as :func:`sum_any` does."""
    if not isinstance(like, torch.Tensor):
        return torch.from_numpy(np.ascontiguousarray(decode_flat(p)))
    return decode_on(p, like.device)


def decode_on(p: Payload, where: torch.device) -> torch.Tensor:
    """One payload decoded (flat float32) on device ``where`` by the scheme's own mathematics
    (:class:`~hvd_gradq.torch.ops.TorchOps`: the device path, on CPU tensors too)."""
    p.scheme.check_parts(p.parts, p.n)
    parts = {k: torch.from_numpy(_math(a)).to(where) for k, a in p.parts.items()}
    out: torch.Tensor = p.scheme.decode(TorchOps(where), parts, p.n).reshape(-1)
    return out


def _math(a: NDArray[Any]) -> NDArray[Any]:
    """Wire bytes back to the int64 byte values the schemes' Ops math takes."""
    return a.astype(np.int64) if a.dtype == np.uint8 else np.ascontiguousarray(a)
