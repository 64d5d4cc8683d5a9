"""The wire format: one self-describing, checksummed byte string per tensor.

Layout (little-endian)::

    magic  b"HVGQ"            4
    version u8 (=3)           1
    dtype   u8                1   the input's dtype (see DTYPES)
    ndim    u8                1
    flags   u8 (=0)           1
    total   u64               8   the whole payload's length, header included
    check   u32               4   CRC-32 of the whole payload, these four bytes as zero
    speclen u16               2
    dims    u64 * ndim
    spec    utf-8 * speclen       the scheme's canonical spec text: its name and the parameters
                                  that differ from their defaults ("orq", "orq:levels=3")
    sections                      as the scheme declares them for n = prod(dims); sizes exact

**The maths only, defaults left out** (since version 2). The spec text names what decoding needs
and nothing else: the scheme and its non-default parameters (bucket, levels, clip, scales, ...).
The policy a rank applies around the scheme (error feedback, warm-up, non-finite handling:
:mod:`hvd_gradq.policy`) changes no byte of a payload, so it is not written. A 512-element ORQ-5
payload's header is 22 + 8 + 3 = **33 bytes** (``"orq"``); version 1 spelled out every parameter,
policy included (``"orq:bucket=512,ef=false,nonfinite=propagate,warmup=0,clip=0.0,scales=fp32,
levels=5"``, 82 characters), **112 bytes**, 39% of that payload. The price of leaving defaults
out: a scheme's defaults are part of this format. Changing one changes what a header means, so
it needs a new VERSION (``tests/unit/test_payload.py`` pins every default).

**Version 3: CRC-32.** The check field holds ``zlib.crc32`` of the whole payload with the field
itself zeroed (:func:`checksum`). Version 2 held a weighted byte sum, sum(byte_i * (1 + i mod
65521)) mod 2**32, which misses errors that cancel (+2 at one byte, -1 at a byte of twice the
weight: 9 in 2,000,000 random double-bit flips went through); CRC-32 detects every error of one
or two flipped bits in a payload below 512 MiB (its Hamming distance is 3 up to 2**32 bits),
every error burst of up to 32 bits, and any other error with probability 1 - 2**-32, and runs
in C (about 0.3 ns a byte here, seven times faster than the weighted sum's NumPy dot products).
Versions 3 and 2 differ in the check field alone.

A payload of another version is refused (:class:`~hvd_gradq.errors.PayloadError`); versions 1
and 2 with a message that says so and what to do: re-encode with this version. Payloads are
messages between ranks of one job, which run one hvd_gradq, not an archive format.

The header carries the spec as text; this module never parses it. Laying out or cutting the
sections needs only what :class:`Codec` declares (the spec text and the sections for ``n``
elements), so a scheme is handed in by whoever turns spec text into a scheme
(:mod:`hvd_gradq.api`, where decoding is requested).
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray

from ..errors import PayloadError

MAGIC = b"HVGQ"
VERSION = 3
_FIXED = struct.Struct("<4sBBBBQIH")
CHECK_OFFSET = 16
MAX_NDIM = 16
MAX_ELEMENTS = 1 << 40
DTYPES = {1: "float32", 2: "float16", 3: "float64", 4: "bfloat16"}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}
_ZERO_CHECK = bytes(4)


class SectionLike(Protocol):
    """One part of a payload on the wire (``hvd_gradq.schemes.scheme.Section`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def nbytes(self) -> int: ...


class Codec(Hashable, Protocol):
    """What the wire needs of a scheme: its spec text and its sections for ``n`` elements."""

    @property
    def spec(self) -> str: ...
    def sections(self, n: int) -> Sequence[SectionLike]: ...
    def nbytes(self, n: int) -> int: ...


S = TypeVar("S", bound=Codec)


def crc32(data: Any, crc: int = 0) -> int:
    """CRC-32 (``zlib.crc32``) of ``data``'s bytes (a contiguous array or bytes), continuing ``crc``."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return zlib.crc32(data, crc)
    return zlib.crc32(np.ascontiguousarray(data), crc)  # type: ignore[arg-type]  # (an array is a buffer)


def checksum(buf: NDArray[Any]) -> int:
    """The payload checksum of a uint8 array whose check field is already zeroed: its CRC-32."""
    return crc32(buf)


def _checksum_skipping_check(buf: NDArray[Any]) -> int:
    """``checksum`` of ``buf`` as if its check field were zero, without copying it."""
    crc = crc32(buf[:CHECK_OFFSET])
    crc = zlib.crc32(_ZERO_CHECK, crc)
    return crc32(buf[CHECK_OFFSET + 4 :], crc)


@lru_cache(maxsize=4096)
def _sections(codec: Codec, n: int) -> Sequence[SectionLike]:
    return codec.sections(n)


@lru_cache(maxsize=4096)
def header_bytes(spec: str, dtype: str, shape: tuple[int, ...], total: int) -> bytes:
    """The header for a payload (check field zero)."""
    sb = spec.encode()
    return (
        _FIXED.pack(MAGIC, VERSION, DTYPE_CODES[dtype], len(shape), 0, total, 0, len(sb))
        + struct.pack(f"<{len(shape)}Q", *shape)
        + sb
    )


def header_size(spec: str, ndim: int) -> int:
    return _FIXED.size + 8 * ndim + len(spec.encode())


@dataclass
class Payload(Generic[S]):
    """A quantized tensor: its scheme, shape and dtype, and its wire sections (NumPy arrays)."""

    scheme: S
    shape: tuple[int, ...]
    dtype: str
    parts: dict[str, NDArray[Any]]

    @property
    def n(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes that cross the wire for this tensor, header included."""
        return header_size(self.scheme.spec, len(self.shape)) + self.scheme.nbytes(self.n)

    @property
    def body_nbytes(self) -> int:
        """Bytes of the sections alone (codes and scales), without the header."""
        return self.scheme.nbytes(self.n)

    def to_bytes(self) -> bytes:
        return bytes(self.to_array())

    def to_array(self) -> NDArray[Any]:
        """The payload as a uint8 array (no copy of the sections beyond one concatenation)."""
        spec = self.scheme.spec
        pieces = [np.frombuffer(header_bytes(spec, self.dtype, self.shape, self.nbytes), np.uint8)]
        for sec in _sections(self.scheme, self.n):
            arr = np.ascontiguousarray(np.asarray(self.parts[sec.name]).astype(sec.dtype, copy=False))
            if arr.size != sec.count:
                raise PayloadError(f"section {sec.name!r} holds {arr.size} values; the scheme needs {sec.count}")
            pieces.append(arr.reshape(-1).view(np.uint8))
        buf = np.concatenate(pieces)
        buf[CHECK_OFFSET : CHECK_OFFSET + 4] = np.frombuffer(struct.pack("<I", checksum(buf)), np.uint8)
        return buf


@dataclass(frozen=True)
class Header:
    """A payload's validated header: where it starts and ends, and the spec text it names."""

    offset: int
    size: int  # header bytes (fixed part, dims, spec)
    total: int  # the whole payload, header included
    dtype: str
    shape: tuple[int, ...]
    spec: str

    @property
    def n(self) -> int:
        return math.prod(self.shape)

    @property
    def end(self) -> int:
        return self.offset + self.total


def private_copy(data: bytes | bytearray | memoryview | NDArray[Any]) -> NDArray[Any]:
    """A uint8 copy of ``data`` that parsed sections may view (never the caller's array)."""
    buf = np.frombuffer(bytes(data), np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).copy()
    if buf.dtype != np.uint8:
        raise PayloadError(f"a payload is bytes or a uint8 array, not {buf.dtype}")
    return buf


_FRAME = struct.Struct("<4s4xQI")  # the fixed part's magic, total and check


def intact(buf: NDArray[Any], offset: int = 0) -> int | None:
    """Where the payload at ``offset`` of a contiguous uint8 array ends, if its bytes are as sent
    (the magic, a total that fits, the CRC-32 of the whole payload), else None. Nothing else is
    checked (:func:`read_header` does, when the payload is decoded): it tells corruption in
    transit from a payload as sent in a few microseconds, where parsing every field costs ten
    times that, on every payload of every step (:func:`hvd_gradq.wire.integrity.first_corrupt`)."""
    if buf.shape[0] - offset < _FIXED.size:
        return None
    magic, total, check = _FRAME.unpack_from(memoryview(buf), offset)  # type: ignore[arg-type]
    if magic != MAGIC or total < _FIXED.size or total > buf.shape[0] - offset:
        return None
    return offset + total if _checksum_skipping_check(buf[offset : offset + total]) == check else None


def read_header(buf: NDArray[Any], offset: int = 0) -> Header:
    """Validate the header (every field, and the checksum of the whole payload) that starts at
    ``offset`` of a uint8 array; the spec text is returned as it is, unparsed."""
    size = buf.shape[0] - offset
    if size < _FIXED.size:
        raise PayloadError(f"truncated payload: {size} bytes, a header needs at least {_FIXED.size}")
    magic, version, dcode, ndim, flags, total, check, speclen = _FIXED.unpack(bytes(buf[offset : offset + _FIXED.size]))
    if magic != MAGIC:
        raise PayloadError(f"not an hvd_gradq payload: magic {magic!r}, expected {MAGIC!r}")
    if version == 1:
        raise PayloadError(
            "payload version 1: written by an older hvd_gradq, whose header spelled out every scheme parameter "
            f"and the error-feedback, warm-up and non-finite policy; this hvd_gradq reads version {VERSION} only "
            "(the scheme's non-default parameters alone, a CRC-32). Re-encode the tensor with this version "
            "(hvd_gradq.quantize), and run one hvd_gradq version on every rank")
    if version == 2:
        raise PayloadError(
            "payload version 2: written by an older hvd_gradq, whose checksum was a weighted byte sum that misses "
            f"errors which cancel; this hvd_gradq reads version {VERSION} only (the same layout, checked by CRC-32). "
            "Re-encode the tensor with this version (hvd_gradq.quantize), and run one hvd_gradq version on every rank")
    if version != VERSION:
        raise PayloadError(f"payload version {version} is not supported; this hvd_gradq reads version {VERSION}")
    if dcode not in DTYPES:
        raise PayloadError(f"unknown dtype code {dcode}; valid: {sorted(DTYPES)}")
    if ndim > MAX_NDIM:
        raise PayloadError(f"payload claims {ndim} dimensions; at most {MAX_NDIM}")
    if flags != 0:
        raise PayloadError(f"unknown payload flags {flags:#x}")
    if total > size:
        raise PayloadError(f"truncated payload: header says {total} bytes, {size} present")
    hlen = _FIXED.size + 8 * ndim + speclen
    if total < hlen:
        raise PayloadError(f"corrupt payload: total length {total} is shorter than its header ({hlen})")
    view = buf[offset : offset + total]
    if _checksum_skipping_check(view) != check:
        raise PayloadError("payload checksum mismatch (CRC-32): the bytes were corrupted or truncated in transit")
    dims = struct.unpack(f"<{ndim}Q", bytes(view[_FIXED.size : _FIXED.size + 8 * ndim]))
    n = 1
    for d in dims:
        if d > MAX_ELEMENTS:
            raise PayloadError(f"payload claims a dimension of {d}; at most {MAX_ELEMENTS}")
        n *= d
    if n > MAX_ELEMENTS:
        raise PayloadError(f"payload claims {n} elements; at most {MAX_ELEMENTS}")
    try:
        spec = bytes(view[_FIXED.size + 8 * ndim : hlen]).decode()
    except UnicodeDecodeError as e:
        raise PayloadError(f"payload names an invalid scheme: {e}") from None
    return Header(offset, hlen, total, DTYPES[dcode], tuple(int(d) for d in dims), spec)


def cut(buf: NDArray[Any], head: Header, codec: Codec) -> dict[str, NDArray[Any]]:
    """The sections of the payload ``head`` describes, as ``codec`` declares them: views of
    ``buf`` (no copy), so keep ``buf`` unchanged while they are used."""
    if codec.spec != head.spec:
        raise PayloadError(f"payload names the scheme {head.spec!r}, not {codec.spec!r}")
    view = buf[head.offset : head.end]
    parts: dict[str, NDArray[Any]] = {}
    pos = head.size
    for sec in _sections(codec, head.n):
        if pos + sec.nbytes > head.total:
            raise PayloadError(
                f"truncated payload: section {sec.name!r} needs {sec.nbytes} bytes at {pos}, total {head.total}"
            )
        parts[sec.name] = view[pos : pos + sec.nbytes].view(np.dtype(sec.dtype))
        pos += sec.nbytes
    if pos != head.total:
        raise PayloadError(f"corrupt payload: sections end at {pos}, header says {head.total}")
    return parts
