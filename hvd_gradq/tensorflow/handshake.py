"""The one-time check that every rank built the same compressor, before its first collective.

Ranks that disagree (another spec, seed, pattern or name) would otherwise send payloads that
decode to garbage or wait in collectives the others never start. At the first trace over a
process set each rank allgathers its configuration as one fixed-size block
(:func:`hvd_gradq.frontend.codec.config_block`, as the PyTorch frontend does) and every rank
raises the same RankMismatchError, naming the ranks, if they differ. It runs eagerly
(``tf.init_scope``), even while a graph is being traced; in a TF1-style graph no eager
collective can run, and the check is skipped.
"""
from __future__ import annotations

from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from ..frontend.codec import check_config_blocks, config_block


def check_configs(config: str, ps: Any, suffix: str) -> None:
    """Allgather ``config`` over process set ``ps``; RankMismatchError on every rank if ranks differ."""
    with tf.init_scope():  # runs now, eagerly, even while a graph is being traced
        if not tf.executing_eagerly():  # a TF1-style graph: no eager collective can run now
            return
        gathered = hvd.allgather(tf.constant(config_block(config)), name=f"hvd_gradq.tfconfig{suffix}",
                                 ignore_name_scope=True, process_set=ps).numpy()
    check_config_blocks(gathered)
