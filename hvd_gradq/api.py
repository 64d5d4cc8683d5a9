"""Framework-free front: quantize NumPy arrays to payloads and back (offline analysis, oracle).

Reading a payload is where spec text becomes a scheme: :mod:`hvd_gradq.wire` validates the
header and hands back the spec as text; :func:`parse_one` parses it here (and refuses a
non-canonical spelling), then lets the wire cut the sections that scheme declares.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import kernels, wire
from .errors import GradqError, NonFiniteError, PayloadError, RangeError, SpecError
from .schemes.options import NonFinite
from .schemes.scheme import Scheme
from .spec import Config, as_config, parse
from .xp import NUMPY, Seed


@dataclass
class Payload(wire.Payload[Scheme]):
    """A quantized tensor bound to its parsed scheme (:class:`hvd_gradq.wire.Payload`)."""

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview | NDArray[Any]) -> Payload:
        """Parse and validate one payload; every field is checked, bad input raises PayloadError."""
        # a private copy: the parsed sections are views of it, never of the caller's array
        buf = wire.private_copy(data)
        payload, used = parse_one(buf)
        if used != buf.shape[0]:
            raise PayloadError(f"{buf.shape[0] - used} trailing bytes after a payload of {used} bytes")
        return payload


@lru_cache(maxsize=256)
def scheme_of(spec_text: str) -> Scheme:
    """The scheme a payload header names; PayloadError if the text is not a canonical spec
    ("ORQ:..." would decode alike but re-encode to other bytes: one spelling per payload)."""
    try:
        scheme = parse(spec_text).scheme
    except SpecError as e:
        raise PayloadError(f"payload names an invalid scheme: {e}") from None
    if scheme.spec != spec_text:
        raise PayloadError(f"payload scheme spec {spec_text!r} is not canonical; expected {scheme.spec!r}")
    return scheme


def parse_one(buf: NDArray[Any], offset: int = 0) -> tuple[Payload, int]:
    """Parse the payload that starts at ``offset`` of a uint8 array; returns it and its end.
    Its sections are views of ``buf`` (no copy): keep ``buf`` unchanged while the payload is used."""
    head = wire.read_header(buf, offset)
    return payload_at(buf, head), head.end


def payload_at(buf: NDArray[Any], head: wire.Header) -> Payload:
    """The payload of ``buf`` that a validated header (:func:`hvd_gradq.wire.read_header`)
    describes, its sections views of ``buf``: for a caller that has read the headers already
    (a header is validated once, its CRC-32 computed once)."""
    scheme = scheme_of(head.spec)
    return Payload(scheme, head.shape, head.dtype, wire.cut(buf, head, scheme))


def split(buf: NDArray[Any]) -> list[Payload]:
    """Parse a concatenation of payloads (as an allgather returns them), in order."""
    out = []
    pos = 0
    while pos < buf.shape[0]:
        p, pos = parse_one(buf, pos)
        out.append(p)
    return out


def _as_float_array(x: Any) -> tuple[NDArray[Any], str]:
    arr = np.asarray(x)
    if arr.dtype.kind != "f":
        raise GradqError(f"quantize takes a floating-point array (float16/32/64), not {arr.dtype}")
    name = str(arr.dtype)
    if name not in ("float16", "float32", "float64"):
        raise GradqError(f"quantize takes float16, float32 or float64 arrays, not {name}")
    return arr, name


F32_MAX = float(np.finfo(np.float32).max)


def quantize(x: Any, spec: str | Scheme | Config, *, seed: Seed = 0, name: str = "tensor",
             threads: int | None = None) -> Payload:
    """Quantize an array with a scheme; ``seed`` fixes every random draw. ``threads``: how many
    threads the compiled encoder uses (the same bytes whatever the count; default
    :func:`hvd_gradq.kernels.parallel.resolve`: ``HVD_GRADQ_THREADS``, else this rank's cores).

    Non-finite input follows the policy's ``nonfinite`` option (a bare scheme: the default),
    ``propagate`` (default: a bucketed scheme decodes every bucket holding NaN/Inf as NaN and the
    others as usual; ``none``, ``fp16`` and ``topk`` carry the non-finite values through),
    ``raise`` (a NonFiniteError naming ``name``) or ``skip`` (sent uncompressed as ``none``, with a
    warning). Finite values that the
    scheme's float32 arithmetic cannot take (``scheme.limit``, e.g. |x| >= 2**127 for a range)
    raise a RangeError (a GradqError) that says so (``skip``: sent uncompressed), as do float64 values beyond
    float32's range.
    """
    config = as_config(spec)
    scheme, nonfinite = config.scheme, config.policy.nonfinite
    arr, dtype = _as_float_array(x)
    with np.errstate(over="ignore"):  # float64 beyond float32's range: checked below
        flat = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
    finite, inside = _scan(flat, scheme.limit, threads)
    if not finite:
        _check_float32_range(arr, flat, name)
        if nonfinite is NonFinite.RAISE:
            bad = int((~np.isfinite(flat)).sum())
            raise NonFiniteError(
                f"{name}: {bad} non-finite value(s) (NaN/Inf) in the gradient; set nonfinite=propagate "
                "to send them on (their buckets decode as NaN), or nonfinite=skip to send such tensors uncompressed"
            )
        if nonfinite is NonFinite.SKIP:
            return _skip(flat, arr.shape, dtype, seed, f"{name}: non-finite values; sent uncompressed this time")
        # propagate: the reference encoders mark such buckets (LevelScheme.encode_rows)
        return payload_of(scheme, scheme.encode(NUMPY, flat, seed), arr.shape, dtype)
    if not inside:
        if nonfinite is NonFinite.SKIP:
            why = f"{name}: values beyond {scheme.name}'s range; sent uncompressed"
            return _skip(flat, arr.shape, dtype, seed, why)
        big = float(np.abs(flat).max())
        raise RangeError(
            f"{name}: a finite value of magnitude {big:.7g} is beyond what {scheme.name} quantizes in float32 "
            f"(|x| < {scheme.limit:.7g}: a range, sum or square of the bucket would overflow float32); scale "
            "the gradient down (a smaller loss scale), use fp16 or none, or nonfinite=skip to send such tensors "
            "uncompressed"
        )
    fast = kernels.encode(scheme, flat, seed, threads=threads)  # the compiled fast path (bit-identical), or None
    parts = fast if fast is not None else scheme.encode(NUMPY, flat, seed)
    return payload_of(scheme, parts, arr.shape, dtype)


def quantize_fed(x: NDArray[np.float32], e: NDArray[np.float32] | None, scale: float | None, scheme: Scheme,
                 seed: Seed, e_out: NDArray[np.float32], flush: bool = False) -> Payload | None:
    """The payload of ``x + e * scale`` (flat float32; ``x`` where ``e`` is None) with error
    feedback's new residual written to ``e_out``, in one pass (:func:`hvd_gradq.kernels.encode_fed`),
    or None where that pass does not apply (no compiled kernel for the scheme, or a compensated
    value :func:`quantize` would not encode as it is: NaN/Inf, beyond ``scheme.limit``): then
    the caller compensates and runs :func:`quantize`, which applies the policy to such values.
    ``flush``: the rule's arithmetic as TensorFlow's kernels do it (subnormals as zeros)."""
    parts = kernels.encode_fed(scheme, x, e, scale, seed, e_out, flush=flush)
    return None if parts is None else payload_of(scheme, parts, (int(x.shape[0]),), "float32")


def _scan(flat: NDArray[Any], limit: float, threads: int | None = None) -> tuple[bool, bool]:
    """(every value finite, every |value| < limit): one compiled pass (:func:`kernels.scan`), or
    two NumPy passes that allocate nothing (a NaN anywhere makes the min and the max NaN)."""
    if flat.size == 0:
        return True, True
    fast = kernels.scan(flat, limit, threads)
    if fast is not None:
        return fast
    lo, hi = float(flat.min()), float(flat.max())
    finite = math.isfinite(lo) and math.isfinite(hi)
    return finite, finite and max(-lo, hi) < limit


def _check_float32_range(arr: NDArray[Any], flat: NDArray[Any], name: str) -> None:
    """A float64 value that is finite but became inf in float32 is not "NaN/Inf": say what it is."""
    if arr.dtype != np.float64:
        return
    grew = np.isinf(flat) & np.isfinite(arr.reshape(-1))
    if grew.any():
        big = float(np.abs(arr.reshape(-1)[grew]).max())
        raise RangeError(
            f"{name}: {int(grew.sum())} float64 value(s) are finite but beyond float32's range (largest magnitude "
            f"{big:.7g} > {F32_MAX:.7g}); hvd_gradq quantizes in float32: scale the gradient down "
            "(e.g. a smaller loss scale)"
        )


def _skip(flat: NDArray[Any], shape: tuple[int, ...], dtype: str, seed: Seed, why: str) -> Payload:
    warnings.warn(why, RuntimeWarning, stacklevel=3)
    plain = parse("none").scheme
    return payload_of(plain, plain.encode(NUMPY, flat, seed), shape, dtype)


def payload_of(scheme: Scheme, parts: dict[str, Any], shape: tuple[int, ...], dtype: str) -> Payload:
    """A payload from a scheme's encoded sections (int64 byte values become uint8)."""
    return Payload(scheme, tuple(shape), dtype, {k: _wire(np.asarray(v)) for k, v in parts.items()})


def _wire(a: NDArray[Any]) -> NDArray[Any]:
    return a.astype(np.uint8) if a.dtype == np.int64 else a


def dequantize(payload: Payload, *, threads: int | None = None) -> NDArray[Any]:
    """Decode a payload to an array of its original shape and dtype. A payload whose sections
    hold an index or a code that no encoder writes raises PayloadError (``Scheme.check_parts``).
    ``threads``: as :func:`quantize`'s."""
    dt = payload.dtype if payload.dtype != "bfloat16" else "float32"
    return decode_flat(payload, threads).reshape(payload.shape).astype(dt, copy=False)  # float32: no second copy


def decode_flat(payload: Payload, threads: int | None = None, *, out: NDArray[np.float32] | None = None,
                acc: bool = False) -> NDArray[np.float32]:
    """The decoded values as a flat float32 array, before the cast to the payload's dtype (what
    a frontend sums across ranks: the sum is rounded to the gradient's dtype once, at the end).
    ``out``: a float32 array of the payload's size to decode into and return; with ``acc`` the
    values are added to it instead, each element one float32 addition (the bits of ``out +
    decoded``): the compiled kernels add as they decode, with no decoded array in between, so a
    sum over ranks holds one full-size buffer (:func:`hvd_gradq.reduce.codec.decode_sum`)."""
    if acc and out is None:
        raise ValueError("acc=True adds to out: give the array to add to")
    payload.scheme.check_parts(payload.parts, payload.n)
    flat = kernels.decode(payload.scheme, payload.parts, payload.n, out=out, acc=acc, threads=threads)
    if flat is None:  # no fast path: the reference, then into ``out``
        parts = {k: (v.astype(np.int64) if v.dtype == np.uint8 else v) for k, v in payload.parts.items()}
        flat = np.asarray(payload.scheme.decode(NUMPY, parts, payload.n), dtype=np.float32).reshape(-1)
        if out is not None:
            if acc:
                np.add(out, flat, out=out)
            else:
                out[...] = flat
            flat = out
    return flat.reshape(-1)
