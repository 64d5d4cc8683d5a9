"""Length-prefixed blocks and tagged frames (hvd_gradq/wire/blocks.py): what PyTorch's driver
sends in one fused alltoall comes back part by part, and a buffer that is not a run of frames
is refused saying why."""
from __future__ import annotations

import numpy as np
import pytest

from hvd_gradq.errors import PayloadError
from hvd_gradq.wire import blocks


def _bytes(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_tagged_frames_split_back_into_their_parts_empty_ones_left_out() -> None:
    parts = [(7, _bytes(13, 1)), (2**64 - 1, _bytes(0, 2)), (0, _bytes(4096, 3)), (123456789, _bytes(1, 4))]
    made = blocks.frames(parts)
    assert len(made) == 2 * 3  # a head and the bytes a non-empty part; the empty one is not sent
    assert made[1] is parts[0][1]  # the parts themselves, not copies
    buf = np.concatenate(made)
    assert buf.shape[0] == sum(blocks.FRAME + p.shape[0] for _, p in parts if p.shape[0])
    got = blocks.split_frames(buf)
    assert sorted(got) == sorted(t for t, p in parts if p.shape[0])
    for tag, data in parts:
        if data.shape[0]:
            assert np.array_equal(got[tag], data), tag
    assert blocks.split_frames(np.zeros(0, np.uint8)) == {}


def test_a_buffer_that_is_not_frames_is_refused() -> None:
    buf = np.concatenate(blocks.frames([(1, _bytes(10, 5)), (2, _bytes(3, 6))]))
    with pytest.raises(PayloadError, match="fewer than a frame's 16-byte head"):
        blocks.split_frames(buf[:-3 - 16 + 5])  # the second frame's head cut short
    with pytest.raises(PayloadError, match="runs past the end"):
        blocks.split_frames(buf[:-1])
    twice = np.concatenate(blocks.frames([(9, _bytes(2, 7)), (9, _bytes(2, 8))]))
    with pytest.raises(PayloadError, match="twice"):
        blocks.split_frames(twice)
