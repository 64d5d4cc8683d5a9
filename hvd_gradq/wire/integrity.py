"""The checks of what hvd_gradq sends that is not a payload, and where a received buffer of
payloads fails its own (every payload carries a CRC-32: :mod:`.payload`).

* **The summable pattern's lanes** (int32 packed codes) are summed by Horovod's allreduce, so no
  per-rank CRC survives the sum. Their checksum is linear over integer addition instead: rank r
  appends h_r = sum_i w_i * lane_i mod P and g_r = sum_i w_i**2 * lane_i mod P (P = 2**31 - 1,
  w_i in [1, 2**30] from a 32-bit hash of the lane's index) to its lanes as
  :data:`CHECK_LANES` lanes of 8-bit pieces, in the same allreduce. The pieces add up to
  sum_r h_r and sum_r g_r (a piece summed over fewer than 2**23 ranks fits its lane), and every
  rank checks that the summed lanes L give sum_i w_i * L_i == sum_r h_r mod P (and the same for
  g): :func:`with_check`, :func:`checked`. An error vector e in the summed lanes passes only if
  sum_i w_i e_i and sum_i w_i**2 e_i are both 0 mod P: for errors that cancel under any fixed
  weights (the weighted payload sum's +2 at one place, -1 at a place of twice the weight) a
  chance of about 2**-31, not 1. All int64 arithmetic on values below 2**63, in any ``Ops``
  (a TensorFlow graph runs it as written).
* **Statistics** (the summable pattern's Max-allreduce) are not linear; :func:`digest` is the
  CRC-32 of what a rank received, as two 16-bit halves in float32 (exact). Every rank appends
  it (mod P, :data:`DIGEST_LANES` lanes of 8-bit pieces, covered by the lanes' checksum) to the
  lanes it sends next, so the lanes' sum brings each rank the sum of every rank's digest: where
  it is not ``size`` times the rank's own, the ranks received different statistics
  (:func:`digest_lanes`, :func:`digests_agree`). Every rank whose lanes arrived intact learns
  it in the same collective, so every rank can stop at once (a corrupted statistic can also
  look like a peer's stop signal: a stop decided on it must not be the only news).
* **fp32 pieces** (the hierarchical pattern's alltoalls inside a host): each piece travels with
  its CRC-32 as two float32 elements after it (:func:`piece_checks`, :func:`first_bad_piece`).

:func:`first_corrupt` says which payload of a received buffer fails its header or CRC-32,
without raising: every rank must reach the round where they compare verdicts.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..xp import MASK32, Array, Ops, hash32
from .payload import crc32, intact

#: The lanes' checksum modulus (a Mersenne prime: x mod P folds as (x & P) + (x >> 31)).
P = (1 << 31) - 1
_KEY = 0x5BD1E995  # the weights' stream: any fixed 32-bit value, the same on every rank
_MUL = 0x7FEB352D  # an odd multiplier below 2**31 (a 32-bit value times it fits int64)
_PIECE_BITS = 8
_PIECES = 4  # 8-bit pieces of a value below 2**31
#: Lanes appended to a rank's lanes: its two checksums, in 8-bit pieces.
CHECK_LANES = 2 * _PIECES
#: Lanes of the digest of the statistics a rank received, in 8-bit pieces (before its checksums).
DIGEST_LANES = _PIECES
#: Ranks whose summed pieces still fit an int32 lane.
MAX_RANKS = (1 << 31) // (1 << _PIECE_BITS) - 1
_BLOCK = 1 << 20


def _fold(ops: Ops, x: Array) -> Array:
    """A value congruent to int64 ``x`` mod P, of magnitude below 2**31 + |x| / 2**31."""
    return ops.band(x, P) + ops.shr(x, 31)


def _weights(ops: Ops, k: int) -> tuple[Array, Array]:
    """(w, w**2 mod P) of lanes 0..k-1: w in [1, 2**30] from one multiply-xorshift round of the
    lane's index (a bijection of 32-bit values: weights repeat only through the mask), w**2
    folded below 2**31 + 2."""
    idx = ops.arange(k)
    h = ops.band(ops.xor(ops.band(idx, MASK32), _KEY) * _MUL, MASK32)
    if k > MASK32:
        h = hash32(ops, ops.xor(h, ops.band(ops.shr(idx, 32), MASK32)))
    w = ops.band(ops.xor(h, ops.shr(h, 15)), (1 << 30) - 1) + 1
    return w, _fold(ops, _fold(ops, w * w))


def _dot(ops: Ops, w: Array, lanes: Array) -> Array:
    """sum_i w_i * lanes_i mod P, int64 (1,) in [0, P)."""
    k = int(ops.shape(lanes)[0])
    terms = _fold(ops, w * lanes)  # |w * lane| < 2**63: below 2**33 in magnitude
    if k > _BLOCK:  # sums of blocks (below 2**53), folded, so that no sum reaches 2**63
        rows = -(-k // _BLOCK)
        if rows * _BLOCK != k:
            terms = ops.concat([terms, ops.zeros((rows * _BLOCK - k,), "int64")], 0)
        terms = _fold(ops, _fold(ops, ops.sum(ops.reshape(terms, (rows, _BLOCK)), 1)))
    return ops.mod(ops.reshape(ops.sum(ops.reshape(terms, (-1,)), 0), (1,)), P)


def _pieces(ops: Ops, h: Array) -> Array:
    """int64 (1,) below 2**31 -> its 8-bit pieces, lowest first, int64 (_PIECES,)."""
    return ops.concat([ops.band(ops.shr(h, _PIECE_BITS * j), (1 << _PIECE_BITS) - 1) for j in range(_PIECES)], 0)


def _whole(ops: Ops, pieces: Array) -> Array:
    """Summed pieces (each below 2**31) -> the sum of the values they were cut from, mod P, (1,)."""
    scale = ops.i64(ops.from_numpy(np.array([1 << (_PIECE_BITS * j) for j in range(_PIECES)], np.int64)))
    return ops.mod(ops.reshape(ops.sum(ops.i64(pieces) * scale, 0), (1,)), P)


def with_check(ops: Ops, lanes: Array) -> Array:
    """This rank's int64 lanes (values below 2**31) and their :data:`CHECK_LANES` check lanes."""
    lanes = ops.i64(lanes)
    w, w2 = _weights(ops, int(ops.shape(lanes)[0]))
    return ops.concat([lanes, _pieces(ops, _dot(ops, w, lanes)), _pieces(ops, _dot(ops, w2, lanes))], 0)


def checked(ops: Ops, summed: Array) -> tuple[Array, Array]:
    """(the summed lanes without their check lanes, float32 (1,): 1.0 where they agree with the
    summed checksums, 0.0 where the sum was corrupted)."""
    summed = ops.i64(summed)
    k = int(ops.shape(summed)[0]) - CHECK_LANES
    lanes, tail = summed[:k], summed[k:]
    w, w2 = _weights(ops, k)
    ok1 = ops.f32(_dot(ops, w, lanes) == _whole(ops, tail[:_PIECES]))
    ok2 = ops.f32(_dot(ops, w2, lanes) == _whole(ops, tail[_PIECES:]))
    return lanes, ops.minimum(ok1, ok2)


def digest_lanes(ops: Ops, halves: Array) -> Array:
    """A :func:`digest` (float32 [low 16 bits, high 16 bits]) mod P as int64 (:data:`DIGEST_LANES`,)
    lanes of 8-bit pieces: what a rank appends to its lanes before :func:`with_check`."""
    return _pieces(ops, _digest_mod(ops, halves))


def _digest_mod(ops: Ops, halves: Array) -> Array:
    d = ops.i64(halves)  # exact: both halves are below 2**16
    return ops.mod(d[0:1] + d[1:2] * (1 << 16), P)


def digests_agree(ops: Ops, lanes: Array, halves: Array, size: int) -> tuple[Array, Array]:
    """(summed lanes without the :data:`DIGEST_LANES` at their end, float32 (1,): 1.0 where the
    summed digests are ``size`` times this rank's own ``halves`` mod P, 0.0 where some rank
    received other statistics). Differences that cancel (two ranks whose digests differ from
    this one's by opposite amounts mod P) pass with a chance of about 2**-31."""
    lanes = ops.i64(lanes)
    k = int(ops.shape(lanes)[0]) - DIGEST_LANES
    own = _digest_mod(ops, halves)
    return lanes[:k], ops.f32(_whole(ops, lanes[k:]) == ops.mod(own * size, P))


def _halves(crc: int) -> list[float]:
    return [float(crc & 0xFFFF), float(crc >> 16)]


def digest(values: NDArray[Any]) -> NDArray[np.float32]:
    """CRC-32 of float32 ``values``' bytes as float32 [low 16 bits, high 16 bits] (exact): a host
    function (``Ops.host``) over what a rank received."""
    return np.array(_halves(crc32(np.ascontiguousarray(values, np.float32))), np.float32)


def piece_checks(x: NDArray[Any], sizes: Sequence[int]) -> NDArray[np.float32]:
    """The CRC-32 of each consecutive piece of ``sizes`` float32 elements of flat ``x``, two
    float32 halves each (what :func:`first_bad_piece` checks): a host function."""
    flat = np.ascontiguousarray(x, np.float32).reshape(-1)
    out: list[float] = []
    at = 0
    for s in sizes:
        out += _halves(crc32(flat[at : at + s]))
        at += s
    return np.array(out, np.float32)


def first_bad_piece(buf: NDArray[Any], sizes: Sequence[int]) -> NDArray[np.float32]:
    """float32 [i + 1] for the first piece of flat ``buf`` (pieces of ``sizes[i]`` float32
    elements, each followed by its two check elements) whose CRC-32 does not match, [0] if none:
    a host function."""
    flat = np.ascontiguousarray(buf, np.float32).reshape(-1)
    at = 0
    for i, s in enumerate(sizes):
        piece, check = flat[at : at + s], flat[at + s : at + s + 2]
        at += s + 2
        if check.shape[0] != 2 or list(check) != _halves(crc32(piece)):
            return np.array([i + 1], np.float32)
    return np.array([0.0], np.float32)


def first_corrupt(buf: NDArray[Any]) -> tuple[int, str] | None:
    """(index, why) of the first payload of a received buffer whose bytes are not as sent (its
    magic, length or CRC-32: :func:`~.payload.intact`), or None: the payloads one after the other
    (1-D), or one a row of a fixed width (2-D: a row's bytes past its payload are padding).
    Never raises."""
    arr = np.asarray(buf)
    if arr.dtype != np.uint8:
        return 0, f"a buffer of payloads is uint8, not {arr.dtype}"
    why = "its magic, length or CRC-32 does not match: the bytes were corrupted in transit"
    if arr.ndim == 2:
        for i, row in enumerate(arr):
            if intact(np.ascontiguousarray(row)) is None:
                return i, why
        return None
    flat = np.ascontiguousarray(arr.reshape(-1))
    pos, i = 0, 0
    while pos < flat.shape[0]:
        end = intact(flat, pos)
        if end is None:
            return i, why
        pos, i = end, i + 1
    return None
