"""The poison payload: what a rank sends in place of a gradient it could not encode.

A rank that stops on a gradient (NaN/Inf under ``nonfinite=raise``, a value beyond its scheme's
range, any other error while encoding) must still take part in the collective, or every other
rank waits for its payload forever. It sends this instead, and every rank that receives it
raises the same error after the collective. Both frontends send and read exactly these bytes
(PyTorch's allgathers of variable-length payloads, TensorFlow's rows of a traced width).

Layout: a payload header (:mod:`.payload`) with no dimensions and no sections, whose spec text
is ``!<why>``, or ``!<why>@<origin>`` when it passes on another rank's stop (the hierarchical
pattern's later phases), so that the error names the rank that stopped first. No scheme's spec
begins with ``!``, so a poison is never taken for a gradient's payload, and it walks like any
payload (its header's ``total`` says where the next one starts); readers look for poisons before
they parse a scheme (:func:`stop_in`). It is 24 bytes (no origin), shorter than any payload a
frontend sends (a header, a scheme's name and at least one byte of codes): where rows have a
fixed width (TensorFlow), it is zero-padded to the row, and readers take ``total`` bytes.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import PayloadError
from .payload import CHECK_OFFSET, Header, checksum, header_bytes, header_size, read_header

#: the first character of a poison's spec text (no scheme's)
MARK = "!"


class Stop(enum.IntEnum):
    """Why a rank stopped before encoding a gradient, as its poison tells the others."""

    NONFINITE = 1  #: NaN/Inf under ``nonfinite=raise`` (:class:`~hvd_gradq.errors.NonFiniteError`)
    RANGE = 2  #: a finite value the scheme cannot quantize (:class:`~hvd_gradq.errors.RangeError`)
    ERROR = 3  #: any other error while encoding it


def _spec(why: Stop, origin: int | None) -> str:
    return f"{MARK}{int(why)}" if origin is None else f"{MARK}{int(why)}@{int(origin)}"


#: bytes of a poison that names no origin (what a fixed-width row must hold)
SIZE = header_size(_spec(Stop.ERROR, None), 0)


def poison(why: Stop = Stop.NONFINITE, origin: int | None = None, width: int | None = None) -> NDArray[np.uint8]:
    """The poison for ``why`` (naming ``origin``, the rank that stopped first, when it is passed
    on), zero-padded to ``width`` bytes where rows have a fixed width."""
    spec = _spec(why, origin)
    total = header_size(spec, 0)
    buf = np.frombuffer(header_bytes(spec, "float32", (), total), np.uint8).copy()
    buf[CHECK_OFFSET : CHECK_OFFSET + 4] = np.frombuffer(struct.pack("<I", checksum(buf)), np.uint8)
    if width is None:
        return buf
    if width < total:
        raise PayloadError(f"a poison needs {total} bytes; a row of {width} cannot hold it")
    return np.concatenate([buf, np.zeros(width - total, np.uint8)])


def poisons(widths: Sequence[int], why: Stop = Stop.NONFINITE) -> NDArray[np.uint8]:
    """Payloads of ``widths`` bytes one after the other (a rank's chunks), each a padded poison."""
    return np.concatenate([poison(why, width=w) for w in widths]) if widths else np.zeros(0, np.uint8)


def stop_in(head: Header) -> tuple[Stop, int | None] | None:
    """(why, the rank it names or None: the sender) of a poison's header; None for a payload's."""
    if not head.spec.startswith(MARK) or head.shape:
        return None
    why, _, origin = head.spec[len(MARK) :].partition("@")
    try:
        return Stop(int(why)), (int(origin) if origin else None)
    except ValueError:
        raise PayloadError(f"corrupt poison payload: spec {head.spec!r}") from None


def stops(heads: Sequence[Header], ranks: Sequence[int] | None = None) -> dict[int, Stop]:
    """{rank: why} of the poisons among the headers of gathered payloads (payload i from rank
    ``ranks[i]``, by default i; a poison that names another rank counts for that one)."""
    out: dict[int, Stop] = {}
    for i, head in enumerate(heads):
        got = stop_in(head)
        if got is not None:
            why, origin = got
            out[origin if origin is not None else (ranks[i] if ranks is not None else i)] = why
    return out


def headers(buf: NDArray[Any]) -> list[Header]:
    """The validated headers of a concatenation of payloads (poisons included), in order."""
    out: list[Header] = []
    pos = 0
    while pos < buf.shape[0]:
        head = read_header(buf, pos)
        out.append(head)
        pos = head.end
    return out
