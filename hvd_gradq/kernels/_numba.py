# mypy: ignore-errors
"""numba kernels: the reference pipeline of :mod:`hvd_gradq.schemes`, fused per bucket.

Every floating-point operation below is the reference's, in the reference's order and width
(float32 where it is float32, float64 where it is float64, no fused multiply-add, no fast-math),
so that the metas, the packed bytes and the decoded floats are bit-identical to
``scheme.encode(NUMPY, ...)`` / ``scheme.decode(NUMPY, ...)``. Where the reference uses a fixed
summation order (``xp.tree_sum``, ``xp.scan_sum``) the kernels use the same one, or a cheaper
one where the sum is provably exact (then every order gives the same bits).

One pass over each bucket: statistics, codes into a small buffer, packed straight into the
output bytes; decoding unpacks a bucket's codes and writes its floats. Loops are written so
that LLVM vectorizes them (views indexed from 0, integer keys for min/max reductions, 32-bit
hashing in LLVM IR, float32 index arithmetic).

Limits, as documented in :mod:`hvd_gradq.kernels`: input must be finite (the callers check, as
they do for the reference); of +0.0 and -0.0 a bucket's min/max may take the other sign than
NumPy's reduction does, and a level taken from a sorted bucket (bingrad, orq) the other sign
than the reference's sort (of float64, not float32, values) leaves at that index: NumPy's sorts
order equal values as they go. The same floats decode, and the codes are the same: a zero's
sign never decides a comparison. Codes beyond a table (a malformed payload, where the
reference raises) decode to NaN.

The loops live in ``_nb_common``, ``_nb_pack``, ``_nb_even``, ``_nb_levels``, ``_nb_search`` and ``_nb_table``;
this module re-exports them. Only those modules import numba; :mod:`hvd_gradq.kernels` imports
them on first use.
"""
from __future__ import annotations

from ._nb_common import f16_round
from ._nb_even import even_decode, even_encode, sign_encode
from ._nb_pack import final_flush
from ._nb_table import bingrad_pb, orq_exact, orq_small_encode, sorted_encode, table_decode

__all__ = [
    "bingrad_pb", "even_decode", "even_encode", "f16_round", "final_flush", "orq_exact", "orq_small_encode",
    "sign_encode", "sorted_encode", "table_decode",
]
