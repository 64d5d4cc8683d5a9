"""The gather pattern's payloads, made and read on the host by the code PyTorch uses.

Every gathered payload of the TensorFlow frontend is encoded and decoded here, through
``tf.numpy_function``: the bytes come from :func:`hvd_gradq.api.quantize`'s own pieces (the
compiled kernels of every level scheme, or the NumPy reference where the input holds NaN/Inf, a
value beyond ``scheme.limit``, or the scheme has no kernel) and :class:`hvd_gradq.Payload`'s
layout; the gathered payloads are parsed, checked (header, checksum, codes) and decoded by
:func:`hvd_gradq.api.split` / :func:`~hvd_gradq.api.decode_flat`. So the frontend lays no bytes
of its own (``hvd_gradq/wire`` owns them), and a TensorFlow step costs what a PyTorch step costs
for the same scheme: as a TF op chain, ORQ-5's level search alone took 94% of a small model's
step (issue 13). The bytes are the NumPy reference's, bit for bit (``tests/unit/test_tf_ops.py``).

Why the graph stays correct:

* *Static shapes.* ``numpy_function`` outputs have unknown shapes; the payload's size is known
  when the graph is built (``scheme.nbytes``), so it is set, and Horovod's allgather is traced
  with it as before.
* *Nothing raises before the collective.* An exception in the encoder would fail this rank
  only and leave the others waiting in the allgather. The encoder never raises for values:
  non-finite input and values beyond the limit take the reference path, which marks their
  buckets NaN (``nonfinite=raise`` is handled by the compressor before encoding: it sends an
  all-zero poison payload). Decoding runs after the collective on the same bytes on every rank,
  so a poison or corrupted payload fails every rank alike, with the same message.
* *Draws.* The two seed words come from the graph (``step_words``: a step counter in a
  variable), so a retrace or a restored checkpoint continues the same random stream.

Not XLA-compilable (``jit_compile=True``), as Horovod's own collectives are not.
"""
from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import tensorflow as tf
from numpy.typing import NDArray

from .. import kernels
from ..api import Payload, decode_flat, split
from ..errors import NonFiniteError
from ..schemes.level import LevelScheme
from ..schemes.scheme import Scheme
from ..wire.payload import MAGIC, header_size
from ..xp import NUMPY


def _parts(math: Scheme, x: NDArray[np.float32], a: int, b: int) -> dict[str, Any]:
    lo, hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
    if isinstance(math, LevelScheme) and np.isfinite(lo) and np.isfinite(hi) and max(-lo, hi) < math.limit:
        fast = kernels.encode(math, x, (a, b))
        if fast is not None:
            return fast
    # no kernel (none, fp16, topk), NaN/Inf (level schemes mark those buckets NaN), beyond the
    # limit, or kernels turned off
    words: Any = (np.int64(a), np.int64(b))  # the seed already split (xp.uniforms takes either)
    with np.errstate(all="ignore"):
        return dict(math.encode(NUMPY, x, words))


@cache
def payload_encoder(scheme: Scheme, math: Scheme, shape: tuple[int, ...], dtype: str, n: int) -> Any:
    """(x f32[n], a, b) -> the whole payload, uint8[total]: ``math`` encodes, the header names
    ``scheme`` (the same scheme with its error-feedback flag)."""
    total = header_size(scheme.spec, len(shape)) + scheme.nbytes(n)

    def host(x: NDArray[np.float32], a: np.int64, b: np.int64) -> NDArray[np.uint8]:
        parts = _parts(math, np.ascontiguousarray(x, np.float32).reshape(-1), int(a), int(b))
        wire = {k: (v.astype(np.uint8) if v.dtype == np.int64 else v) for k, v in parts.items()}
        return Payload(scheme, shape, dtype, wire).to_array()

    def encode(x: Any, a: Any, b: Any) -> Any:
        out = tf.numpy_function(host, [x, a, b], tf.uint8, stateful=False, name="hvd_gradq_encode")
        return tf.ensure_shape(out, (total,))

    return encode


@cache
def gathered_decoder(n: int, size: int, rank: int, poison_message: str | None) -> Any:
    """rows uint8[size, total] -> (the sum of every rank's decoded payload in rank order, this
    rank's own decoded payload), both float32[n]. Every payload is parsed and checked (header,
    checksum, codes) before it is decoded; every rank runs this on the same bytes.

    ``poison_message`` (``nonfinite=raise``): a row that is not a payload (the all-zero poison a
    rank sends when its gradient held NaN/Inf) raises NonFiniteError with this message."""

    def host(rows: NDArray[np.uint8]) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
        rows = np.ascontiguousarray(rows)
        if poison_message is not None and any(bytes(r[: len(MAGIC)]) != MAGIC for r in rows):
            raise NonFiniteError(poison_message)
        total: NDArray[np.float32] | None = None
        own: NDArray[np.float32] | None = None
        for r, p in enumerate(split(rows.reshape(-1))):
            v = decode_flat(p)
            if r == rank:
                own = v
            total = v.copy() if total is None else total + v
        assert total is not None and own is not None
        return total, own

    def decode(rows: Any) -> Any:
        out, own = tf.numpy_function(host, [rows], (tf.float32, tf.float32), stateful=False,
                                     name="hvd_gradq_decode")
        return tf.ensure_shape(out, (n,)), tf.ensure_shape(own, (n,))

    return decode
