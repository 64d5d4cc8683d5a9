"""Length-prefixed blocks: several ranks' opaque bytes in one allgathered buffer, and several
tensors' parts in one collective.

Each block is its length (8 bytes, little-endian) then its bytes, so the concatenation that an
allgather of blocks of different sizes returns splits back into one block per rank. Used for the
checkpoint's gather of every rank's residuals (``state_dict(all_ranks=True)``), whose contents are
``torch.save`` output: this module only frames it.

*Tagged frames* (:func:`frames`, :func:`split_frames`) carry a tag (8 bytes) before the length:
the parts of several tensors that one rank sends another in a single alltoall, each found again
by its tag (PyTorch's driver runs the hierarchical pattern's phases of every tensor of a round as
one collective: :mod:`hvd_gradq.torch.transport`). Empty parts are left out: a receiver reads a
missing tag as no elements.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import PayloadError

LEN = 8  #: bytes of the length before each block


def block(data: bytes) -> NDArray[np.uint8]:
    """``data`` framed as one block (a fresh, writable uint8 array)."""
    return np.frombuffer(len(data).to_bytes(LEN, "little") + data, np.uint8).copy()


def split_blocks(raw: Any, count: int) -> list[bytes]:
    """The ``count`` blocks of a concatenation of :func:`block` outputs; PayloadError if it is not one."""
    buf = memoryview(bytes(raw))
    out, pos = [], 0
    for _ in range(count):
        if pos + LEN > len(buf):
            raise PayloadError(f"blocks: {len(buf)} bytes hold fewer than {count} blocks")
        n = int.from_bytes(buf[pos : pos + LEN], "little")
        if pos + LEN + n > len(buf):
            raise PayloadError(f"blocks: a block of {n} bytes runs past the end of {len(buf)}")
        out.append(bytes(buf[pos + LEN : pos + LEN + n]))
        pos += LEN + n
    if pos != len(buf):
        raise PayloadError(f"blocks: {len(buf) - pos} bytes left after {count} blocks")
    return out


FRAME = 16  #: bytes before each tagged frame: its tag, then its length (u64 each, little-endian)


def as_bytes(a: NDArray[Any]) -> NDArray[np.uint8]:
    """``a``'s bytes, flat (a view where ``a`` is contiguous): what a frame carries of a part."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def frames(parts: list[tuple[int, NDArray[np.uint8]]]) -> list[NDArray[np.uint8]]:
    """The tagged frames of ``(tag, bytes)`` parts, in order, empty parts left out: a list of
    arrays to concatenate (the parts themselves, not copies)."""
    out: list[NDArray[np.uint8]] = []
    for tag, data in parts:
        if data.shape[0]:
            out.append(np.frombuffer(tag.to_bytes(8, "little") + int(data.shape[0]).to_bytes(8, "little"), np.uint8))
            out.append(data)
    return out


def split_frames(buf: NDArray[np.uint8]) -> dict[int, NDArray[np.uint8]]:
    """{tag: bytes} of a concatenation of :func:`frames` output (views of ``buf``); PayloadError
    if it is not one, or holds a tag twice."""
    out: dict[int, NDArray[np.uint8]] = {}
    pos, end = 0, int(buf.shape[0])
    while pos < end:
        if pos + FRAME > end:
            raise PayloadError(f"frames: {end - pos} bytes left, fewer than a frame's {FRAME}-byte head")
        head = bytes(buf[pos:pos + FRAME])
        tag, n = int.from_bytes(head[:8], "little"), int.from_bytes(head[8:], "little")
        if pos + FRAME + n > end:
            raise PayloadError(f"frames: a frame of {n} bytes runs past the end of {end}")
        if tag in out:
            raise PayloadError(f"frames: tag {tag:#x} twice in one buffer")
        out[tag] = buf[pos + FRAME:pos + FRAME + n]
        pos += FRAME + n
    return out
