"""The summable pattern's side of an evenly spaced level scheme: a scale shared by all ranks.

Codes of several workers add up only when every worker rounded against the same table. The
frontends agree on it with a Max-allreduce: :func:`local_stats` is what a rank contributes,
:func:`encode_shared` rounds against the table the reduced statistics fix, and
:func:`decode_codes` turns the summed codes back into floats (``count`` workers' ``lo`` each).
These are free functions over an :class:`~.level.EvenLevelScheme`, not methods, because they
are the frontends' protocol around the scheme rather than part of what a scheme is; PyTorch,
TensorFlow and the tests' NumPy reference run these same lines, each on its own ``Ops``.
"""

from __future__ import annotations

import numpy as np

from ..xp import Array, Ops, Seed, uniforms
from .level import EvenLevelScheme, bucket_rows


def encode_shared(scheme: EvenLevelScheme, ops: Ops, x: Array, stats: Array, seed: Seed) -> tuple[Array, Array]:
    """Codes (n,) and meta (buckets, m) of flat ``x`` against the shared table that the
    max-reduced ``stats`` (buckets, k) fix; the summable pattern's encoder."""
    n = ops.shape(x)[0]
    metas, codes = [], []
    b = 0
    for start, rows, w in bucket_rows(n, scheme.bucket):
        xb = scheme.clip_rows(ops, ops.reshape(x[start : start + rows * w], (rows, w)))
        meta = scheme.round_meta(ops, scheme.meta_from_stats(ops, stats[b : b + rows]))
        table = scheme.table(ops, meta)
        u = ops.reshape(uniforms(ops, seed, start, rows * w), (rows, w)) if scheme.draws else None
        codes.append(ops.reshape(scheme.assign(ops, xb, table, u), (rows * w,)))
        metas.append(meta)
        b += rows
    if not codes:
        return ops.zeros((0,), "int64"), ops.zeros((0, scheme.meta_width), "float32")
    return ops.concat(codes, 0), ops.concat(metas, 0)


def local_stats(scheme: EvenLevelScheme, ops: Ops, x: Array) -> Array:
    """This rank's per-bucket statistics (buckets, k) for the shared-scale max-allreduce."""
    n = ops.shape(x)[0]
    out = []
    for start, rows, w in bucket_rows(n, scheme.bucket):
        xb = scheme.clip_rows(ops, ops.reshape(x[start : start + rows * w], (rows, w)))
        out.append(scheme.shared_stats(ops, xb))
    return ops.concat(out, 0) if out else ops.zeros((0, 1), "float32")


def decode_codes(scheme: EvenLevelScheme, ops: Ops, codes: Array, meta: Array, n: int, count: int = 1) -> Array:
    """Decode (summed) codes against per-bucket ``meta``: ``count``*lo + step*codes, float32."""
    out = []
    b = 0
    for start, rows, w in bucket_rows(n, scheme.bucket):
        lo, step = scheme.affine(ops, meta[b : b + rows])
        c = ops.f32(ops.reshape(codes[start : start + rows * w], (rows, w)))
        out.append(ops.reshape(lo * np.float32(count) + step * c, (rows * w,)))
        b += rows
    if not out:
        return ops.zeros((0,), "float32")
    return ops.concat(out, 0) if len(out) > 1 else out[0]
