"""Per-bucket non-finite masks of ``nonfinite=propagate`` in the summable pattern (the gather
pattern's payloads, bytes included, are made on the host: :mod:`.host`)."""
from __future__ import annotations

from typing import Any

import tensorflow as tf


def bad_buckets(x: Any, d: int, n: int) -> Any:
    """(buckets,) bool: whether each bucket of ``d`` elements of flat ``x`` holds a NaN/Inf."""
    nb = -(-n // d)
    fin = tf.concat([tf.math.is_finite(x), tf.ones((nb * d - n,), tf.bool)], 0)
    return tf.logical_not(tf.reduce_all(tf.reshape(fin, (nb, d)), axis=1))


def per_element(buckets: Any, d: int, n: int) -> Any:
    """A per-bucket mask spread to the ``n`` elements."""
    return tf.repeat(buckets, d)[:n]
