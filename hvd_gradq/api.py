"""Framework-free front: quantize NumPy arrays to payloads and back (offline analysis, oracle)."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import kernels
from .errors import GradqError, NonFiniteError
from .payload import Payload
from .schemes.base import NonFinite, Scheme
from .spec import parse
from .xp import NUMPY


def as_scheme(spec: str | Scheme) -> Scheme:
    return spec if isinstance(spec, Scheme) else parse(spec)


def _as_float_array(x: Any) -> tuple[NDArray[Any], str]:
    arr = np.asarray(x)
    if arr.dtype.kind != "f":
        raise GradqError(f"quantize takes a floating-point array (float16/32/64), not {arr.dtype}")
    name = str(arr.dtype)
    if name not in ("float16", "float32", "float64"):
        raise GradqError(f"quantize takes float16, float32 or float64 arrays, not {name}")
    return arr, name


def quantize(x: Any, spec: str | Scheme, *, seed: int = 0, name: str = "tensor") -> Payload:
    """Quantize an array with a scheme; ``seed`` fixes every random draw.

    Non-finite input follows the scheme's ``nonfinite`` option: ``raise`` (a NonFiniteError
    naming ``name``), ``skip`` (sent uncompressed as ``none``, with a warning) or ``propagate``
    (buckets holding NaN/Inf decode to NaN).
    """
    scheme = as_scheme(spec)
    arr, dtype = _as_float_array(x)
    flat = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
    if not np.isfinite(flat).all():
        if scheme.nonfinite is NonFinite.RAISE:
            bad = int((~np.isfinite(flat)).sum())
            raise NonFiniteError(
                f"{name}: {bad} non-finite value(s) (NaN/Inf) in the gradient; set nonfinite=skip "
                "to send such tensors uncompressed, or nonfinite=propagate"
            )
        if scheme.nonfinite is NonFinite.SKIP:
            warnings.warn(f"{name}: non-finite values; sent uncompressed this time", RuntimeWarning, stacklevel=2)
            scheme = parse("none")
            parts = scheme.encode(NUMPY, flat, seed)
            return Payload(scheme, tuple(arr.shape), dtype, {k: np.asarray(v) for k, v in parts.items()})
        return _propagate(scheme, flat, arr.shape, dtype, seed)
    fast = kernels.encode(scheme, flat, seed)  # the compiled fast path (bit-identical), or None
    parts = fast if fast is not None else scheme.encode(NUMPY, flat, seed)
    return Payload(scheme, tuple(arr.shape), dtype, {k: _wire(np.asarray(v)) for k, v in parts.items()})


def _wire(a: NDArray[Any]) -> NDArray[Any]:
    return a.astype(np.uint8) if a.dtype == np.int64 else a


def _propagate(scheme: Scheme, flat: NDArray[Any], shape: tuple[int, ...], dtype: str, seed: int) -> Payload:
    """Encode with non-finite buckets zeroed, then mark their scales NaN so they decode NaN."""
    from .schemes.base import LevelScheme

    if not isinstance(scheme, LevelScheme):
        raise GradqError(f"{scheme.name}: nonfinite=propagate is supported by level schemes only; use raise or skip")
    d = scheme.bucket
    bad_elem = ~np.isfinite(flat)
    nb = -(-flat.size // d)
    bad_bucket = np.zeros(nb, bool)
    np.logical_or.at(bad_bucket, np.arange(flat.size) // d, bad_elem)
    clean = np.where(np.repeat(bad_bucket, d)[: flat.size], np.float32(0), flat)
    parts = {k: _wire(np.asarray(v)) for k, v in scheme.encode(NUMPY, clean, seed).items()}
    meta = parts["meta"].reshape(nb, scheme.meta_width).copy()
    meta[bad_bucket] = np.nan
    parts["meta"] = meta.reshape(-1)
    return Payload(scheme, tuple(shape), dtype, parts)


def dequantize(payload: Payload) -> NDArray[Any]:
    """Decode a payload to an array of its original shape and dtype."""
    flat = kernels.decode(payload.scheme, payload.parts, payload.n)  # fast path, or None
    if flat is None:
        parts = {k: (v.astype(np.int64) if v.dtype == np.uint8 else v) for k, v in payload.parts.items()}
        flat = np.asarray(payload.scheme.decode(NUMPY, parts, payload.n), dtype=np.float32)
    dt = payload.dtype if payload.dtype != "bfloat16" else "float32"
    return flat.reshape(payload.shape).astype(dt)
