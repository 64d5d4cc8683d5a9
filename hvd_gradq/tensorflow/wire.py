"""Payload bytes in the graph: the header (static per shape, dtype and spec), the checksum,
their check on receipt, and the per-bucket non-finite masks of ``nonfinite=propagate``.

The layout is :meth:`hvd_gradq.Payload.to_array`'s, so the NumPy reference parses what the
graph sends (the tests' oracle does).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from ..payload import CHECK_OFFSET, header_bytes, header_size
from ..schemes.base import Scheme

_MOD = 65521


def header(scheme: Scheme, dtype: str, shape: tuple[int, ...], n: int) -> tuple[bytes, int]:
    """(header bytes, total payload size) of a tensor of ``n`` elements."""
    spec = scheme.spec
    total = header_size(spec, len(shape)) + scheme.nbytes(n)
    return header_bytes(spec, dtype, shape, total), total


def payload(body: Any, head: bytes, total: int) -> Any:
    """The payload bytes (uint8): the constant header with the checksum of header and body,
    a weighted int64 byte sum computed here, then the body."""
    hl = len(head)
    hw = (np.arange(hl, dtype=np.int64) % _MOD) + 1
    hsum = int(np.dot(np.frombuffer(head, np.uint8).astype(np.int64), hw))
    bw = tf.math.floormod(tf.range(hl, total, dtype=tf.int64), _MOD) + 1
    check = tf.bitwise.bitwise_and(hsum + tf.reduce_sum(tf.cast(body, tf.int64) * bw), 0xFFFFFFFF)
    cb = tf.cast(tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(check, tf.constant([0, 8, 16, 24], tf.int64)), 0xFF), tf.uint8)
    hb = np.frombuffer(head, np.uint8)
    return tf.concat([tf.constant(hb[:CHECK_OFFSET]), cb, tf.constant(hb[CHECK_OFFSET + 4 :]), body], 0)


def verify(rows: Any, head: bytes, total: int, what: str) -> Any:
    """An assertion that every gathered payload (rows of ``total`` bytes) has the expected
    header and checksum."""
    hb = np.frombuffer(head, np.uint8).astype(np.int64)
    keep = np.ones(len(head), bool)
    keep[CHECK_OFFSET : CHECK_OFFSET + 4] = False
    r64 = tf.cast(rows, tf.int64)
    head_ok = tf.reduce_all(tf.equal(tf.boolean_mask(r64[:, : len(head)], keep, axis=1), hb[keep][None, :]))
    w = (np.arange(total, dtype=np.int64) % _MOD) + 1
    w[CHECK_OFFSET : CHECK_OFFSET + 4] = 0
    sums = tf.bitwise.bitwise_and(tf.reduce_sum(r64 * tf.constant(w), axis=1), 0xFFFFFFFF)
    stored = tf.reduce_sum(r64[:, CHECK_OFFSET : CHECK_OFFSET + 4]
                           * tf.constant([1, 1 << 8, 1 << 16, 1 << 24], tf.int64), axis=1)
    ok = tf.logical_and(head_ok, tf.reduce_all(tf.equal(sums, stored)))
    return tf.debugging.Assert(ok, [
        f"hvd_gradq: a gathered payload for {what} has a wrong header or checksum (corrupted in "
        "transit, or ranks disagree on the scheme); checksums computed/stored:", sums, stored])


def bad_buckets(x: Any, d: int, n: int) -> Any:
    """(buckets,) bool: whether each bucket of ``d`` elements of flat ``x`` holds a NaN/Inf."""
    nb = -(-n // d)
    fin = tf.concat([tf.math.is_finite(x), tf.ones((nb * d - n,), tf.bool)], 0)
    return tf.logical_not(tf.reduce_all(tf.reshape(fin, (nb, d)), axis=1))


def per_element(buckets: Any, d: int, n: int) -> Any:
    """A per-bucket mask spread to the ``n`` elements."""
    return tf.repeat(buckets, d)[:n]
