"""Length-prefixed blocks: several ranks' opaque bytes in one allgathered buffer.

Each block is its length (8 bytes, little-endian) then its bytes, so the concatenation that an
allgather of blocks of different sizes returns splits back into one block per rank. Used for the
checkpoint's gather of every rank's residuals (``state_dict(all_ranks=True)``), whose contents are
``torch.save`` output: this module only frames it.
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
