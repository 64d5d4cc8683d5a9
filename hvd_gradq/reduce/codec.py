"""The host codec the reduction core's patterns and the frontends share: a flat float32 array to
wire bytes and its own decoded values, and a gathered buffer back to its decoded sum (NumPy; the
compiled kernels of :mod:`hvd_gradq.kernels` where they are available). A gathered poison raises
the stop protocol's error (:mod:`.stop`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..api import Payload, decode_flat, dequantize, payload_at, quantize, quantize_fed
from ..errors import RankMismatchError
from ..schemes.scheme import Scheme
from ..spec import Config
from ..wire.poison import headers, stops
from ..xp import Seed
from .stop import stopped


def encode(scheme: Scheme | Config, x: NDArray[Any], seed: Seed, name: str,
           own: bool = True) -> tuple[NDArray[np.uint8], NDArray[np.float32] | None]:
    """Payload bytes of flat float32 ``x`` and this rank's own decoded values (what error
    feedback subtracts), or None for them where ``own`` is False: a full-size array that a sum
    can do without (:func:`decode_sum` decodes this rank's payload as any other); a config's
    ``nonfinite`` applies."""
    p = quantize(x, scheme, seed=seed, name=name)
    return p.to_array(), dequantize(p).astype(np.float32, copy=False).reshape(-1) if own else None

def encode_fed(scheme: Scheme | Config, x: NDArray[np.float32], e: NDArray[np.float32] | None, scale: float | None,
               e_out: NDArray[np.float32], seed: Seed) -> NDArray[np.uint8] | None:
    """The payload bytes of ``x`` compensated with the residual ``e`` (None: none yet), its new
    residual written to ``e_out``, in one pass (:func:`hvd_gradq.kernels.encode_fed`); None where
    that pass does not apply (no compiled kernel, or a value the input check refuses), and the
    caller compensates and encodes as :func:`encode` does, with the policy's ``nonfinite``."""
    p = quantize_fed(x, e, scale, scheme.scheme if isinstance(scheme, Config) else scheme, seed, e_out)
    return None if p is None else p.to_array()


def split_checked(buf: NDArray[np.uint8], name: str, ranks: Sequence[int] | None = None) -> list[Payload]:
    """The payloads of a gathered buffer, all of one size: a poison (:func:`poison`) raises the
    error of :func:`stopped` naming the ranks that sent one (``ranks[i]`` is the rank of the
    i-th payload; by default i), other sizes a model that differs (RankMismatchError)."""
    heads = headers(buf)  # each header validated (and its CRC-32 computed) once
    peers = stops(heads, ranks)
    if peers:
        raise stopped(name, peers)
    payloads = [payload_at(buf, head) for head in heads]
    sizes = {p.n for p in payloads}
    if len(sizes) > 1:
        raise RankMismatchError(
            f"{name}: ranks sent payloads of {sorted(sizes)} elements; the model differs across ranks"
        )
    return payloads

def decode_sum(
    buf: NDArray[np.uint8], own_rank: int, own: NDArray[np.float32] | None, name: str = "tensor",
    ranks: Sequence[int] | None = None, out: NDArray[np.float32] | None = None,
) -> tuple[NDArray[np.float32], int]:
    """Sum of every payload in a gathered buffer, in rank order; returns (sum, payload count).

    ``own`` (this rank's decoded payload, or None: decoded as the others) is used in place of
    decoding it again: decoding is deterministic, so the result is the same bits on every rank.
    ``ranks``: as in :func:`split_checked`, for the errors.

    *Memory.* The sum builds up in one float32 buffer, ``out`` where given (the caller's storage
    for the result) else a fresh array, each payload decoded straight into it
    (:func:`hvd_gradq.api.decode_flat`'s ``acc``: the compiled kernels add as they decode), so a
    sum over N ranks holds that one full-size array, where decoding each and adding held three
    (a 300M-element gradient: 1.1 GiB each). In-place float32 additions in rank order have the
    bits of ``v0 + v1 + ...``.
    """
    payloads = split_checked(buf, name, ranks)
    if not payloads:
        raise RankMismatchError(f"{name}: the gathered buffer holds no payload")
    total = np.empty(payloads[0].n, np.float32) if out is None else out
    for r, p in enumerate(payloads):
        if r == own_rank and own is not None:
            if r:
                np.add(total, own, out=total)
            else:
                total[...] = own
        else:
            decode_flat(p, out=total, acc=r > 0)
    return total, len(payloads)
