"""Host-side (NumPy) encoding to wire bytes and decoding of gathered payloads, shared by the
frontends. Uses the fused kernels of :mod:`hvd_gradq.kernels` when they are available."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..api import Payload, dequantize, quantize, split
from ..errors import NonFiniteError, RankMismatchError
from ..schemes.scheme import Scheme
from ..xp import stream_seed


def tensor_key(name: str) -> int:
    """A stable 32-bit key for a tensor name (the same on every rank and every run)."""
    return zlib.crc32(name.encode())


def draw_seed(base: int, rank: int, step: int, name: str) -> int:
    """Independent rounding noise for every (rank, step, tensor), reproducible from ``base``."""
    return stream_seed(base, rank, step, tensor_key(name))


def encode(scheme: Scheme, x: NDArray[Any], seed: int, name: str) -> tuple[NDArray[np.uint8], NDArray[np.float32]]:
    """Payload bytes of flat float32 ``x`` and this rank's own decoded values (for EF and for
    summing without decoding one's own payload twice)."""
    p = quantize(x, scheme, seed=seed, name=name)
    own = dequantize(p).astype(np.float32, copy=False).reshape(-1)
    return p.to_array(), own


def poison() -> NDArray[np.uint8]:
    """The payload a rank sends in place of a gradient that held NaN/Inf (nonfinite=raise): an
    empty ``none`` payload, which tells the others to stop with an error too."""
    return quantize(np.zeros(0, np.float32), "none").to_array()


def split_checked(buf: NDArray[np.uint8], name: str) -> list[Payload]:
    """The payloads of a gathered buffer, all of one size: an empty one is a rank's poison
    (nonfinite=raise, NonFiniteError naming the ranks), other sizes a model that differs."""
    payloads = split(buf)
    sizes = {p.n for p in payloads}
    if len(sizes) > 1:
        bad = [r for r, p in enumerate(payloads) if p.n == 0]
        if bad:
            raise NonFiniteError(f"{name}: rank(s) {bad} had non-finite values (NaN/Inf) in this gradient")
        raise RankMismatchError(
            f"{name}: ranks sent payloads of {sorted(sizes)} elements; the model differs across ranks"
        )
    return payloads


def decode_sum(
    buf: NDArray[np.uint8], own_rank: int, own: NDArray[np.float32] | None, name: str = "tensor"
) -> tuple[NDArray[np.float32], int]:
    """Sum of every payload in a gathered buffer, in rank order; returns (sum, payload count).

    ``own`` (this rank's decoded payload) is used in place of decoding it again: decoding is
    deterministic, so the result is the same bits on every rank.
    """
    payloads = split_checked(buf, name)
    total: NDArray[np.float32] | None = None
    for r, p in enumerate(payloads):
        v = own if (r == own_rank and own is not None) else dequantize(p).astype(np.float32, copy=False).reshape(-1)
        total = v.copy() if total is None else total + v
    assert total is not None
    return total, len(payloads)


CONFIG_BLOCK = 256


def config_block(text: str) -> NDArray[np.uint8]:
    """A rank's configuration as a fixed-size block (2-byte length, then UTF-8), so that one
    allgather of equal shapes carries every rank's configuration and can run asynchronously."""
    raw = text.encode()[: CONFIG_BLOCK - 2]
    out = np.zeros(CONFIG_BLOCK, np.uint8)
    out[0], out[1] = len(raw) >> 8, len(raw) & 0xFF
    out[2 : 2 + len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def check_config_blocks(gathered: NDArray[np.uint8]) -> None:
    """Raise RankMismatchError naming the ranks if the allgathered :func:`config_block` s differ."""
    rows = np.asarray(gathered, np.uint8).reshape(-1, CONFIG_BLOCK)
    _check([bytes(r[2 : 2 + (int(r[0]) << 8 | int(r[1]))]).decode(errors="replace") for r in rows])


def _check(configs: list[str]) -> None:
    if len(set(configs)) > 1:
        groups: dict[str, list[int]] = {}
        for r, c in enumerate(configs):
            groups.setdefault(c, []).append(r)
        detail = "; ".join(f"ranks {rs}: {c!r}" for c, rs in groups.items())
        raise RankMismatchError(f"ranks disagree on the hvd_gradq configuration: {detail}")
