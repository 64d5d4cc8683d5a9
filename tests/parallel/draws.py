"""The seeds' rule, restated for the oracles from the primitives (so that an oracle does not call
the frontends' hvd_gradq.reduce.names): a tensor's stream is stream_seed(base, rank,
crc32(key)), key its name (``<name>#j`` for scatter chunk j, ``<name>#reduce``, ``<name>#host``...;
TensorFlow's name is the slot's index), and the step is mixed in last by step_words."""
import zlib

import numpy as np

from hvd_gradq.xp import NUMPY, step_words, stream_seed


def words(base: int, rank: int, key: str, step: int) -> tuple[int, int]:
    a, b = step_words(NUMPY, stream_seed(base, rank, zlib.crc32(key.encode())), np.int64(step))
    return int(a), int(b)
