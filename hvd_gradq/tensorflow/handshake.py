"""What the TensorFlow compressor checks before it runs: its arguments and that the script is a
TensorFlow one, at construction (:func:`check_arguments`), and, once, that every rank built the
same compressor, before its first collective (:func:`check_configs`).

Ranks that disagree (another spec, seed, pattern or name) would otherwise send payloads that
decode to garbage or wait in collectives the others never start. At the first trace over a
process set each rank allgathers its configuration as one fixed-size block
(:func:`hvd_gradq.frontend.codec.config_block`, as the PyTorch frontend does) and every rank
raises the same RankMismatchError, naming the ranks, if they differ. It runs eagerly
(``tf.init_scope``), even while a graph is being traced; in a TF1-style graph no eager
collective can run, and the check is skipped.

The same moment, every rank times the codec of the schemes ``auto`` may price on this CPU and
the ranks agree on the maximum (:func:`agree`, :mod:`hvd_gradq.frontend.probe`), whether or not
the configurations are compared: the cost model then reads only values every rank holds.
"""
from __future__ import annotations

import itertools
import re
from typing import Any

import horovod.tensorflow as hvd
import horovod.tensorflow.mpi_ops as mpi_ops
import tensorflow as tf

from ..errors import GradqError
from ..frontend import hosts, names, probe
from ..frontend.codec import check_config_blocks, config_block
from ..frontend.cpu_cost import Figures
from ..frontend.guards import check_initialized
from ..frontend.membership import membership
from ..frontend.names import Kind
from ..frontend.patterns import Pattern
from ..schemes.options import NonFinite
from ..schemes.scheme import Scheme
from ..spec import Config
from .callsite import set_suffix
from .hier import ranks_per_host_of

_COUNTER = itertools.count()
_NAME_OK = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def check_arguments(config: Config, seed: Any, loss_scale: Any, process_set: Any, name: str | None) -> str:
    """Refuse what this frontend cannot serve, with what to use instead; returns the collectives'
    name prefix (``name``, or ``c<k>`` for the k-th compressor built in this process). First, that
    this is the frontend of the script: in a PyTorch script (horovod.torch initialized), Horovod
    would say it "has not been initialized" at the compressor's first call."""
    check_initialized("hvd_gradq.tensorflow", bool(hvd.is_initialized()))
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise GradqError(f"seed must be an integer, not {type(seed).__name__}")
    if config.policy.nonfinite is NonFinite.SKIP:
        raise GradqError(
            f"{config.name}: nonfinite=skip is not supported by hvd_gradq.tensorflow: it changes a "
            "payload's size at run time, and a TF graph's allgather sizes are fixed when it is traced. "
            "Valid here: nonfinite=propagate (NaN results, as Horovod) or nonfinite=raise (the step fails)"
        )
    if loss_scale is not None and not (callable(loss_scale) or isinstance(loss_scale, tf.Variable)):
        raise GradqError(f"loss_scale must be a callable or a tf.Variable, not {type(loss_scale).__name__}")
    if process_set is not None and not hasattr(process_set, "process_set_id"):
        raise GradqError(f"process_set must be a horovod ProcessSet, not {type(process_set).__name__}")
    cid = name if name is not None else f"c{next(_COUNTER)}"
    if not _NAME_OK.match(cid):
        raise GradqError(f"name={cid!r} is not valid: 1-64 letters, digits, '_', '.' or '-'")
    return cid


def check_configs(config: str, ps: Any, suffix: str) -> None:
    """Allgather ``config`` over process set ``ps``; RankMismatchError on every rank if ranks differ."""
    with tf.init_scope():  # runs now, eagerly, even while a graph is being traced
        if not tf.executing_eagerly():  # a TF1-style graph: no eager collective can run now
            return
        name = names.collective("tf", Kind.CONFIG, suffix.lstrip("."))
        gathered = hvd.allgather(tf.constant(config_block(config)), name=name, ignore_name_scope=True,
                                 process_set=ps).numpy()
    check_config_blocks(gathered)


def agree(config: str, check: bool, ps: Any, scheme: Scheme, pattern: Pattern, link_gbps: float,
          fallback: bool) -> Figures | None:
    """Once a process set, eagerly: compare ``config`` (with the cluster layout) across its ranks
    when ``check``, then, where the cost model chooses (``auto``, ``hierarchical``), the CPU
    figures every rank measured, agreed (the maximum). None: one rank, a TF1-style graph, or an
    explicit pattern (the model's table stands; every rank alike)."""
    size, suffix = membership(mpi_ops._basics, ps).size, set_suffix(ps)
    if size <= 1:
        return None
    local = ranks_per_host_of(ps)
    if check:
        check_configs(config + hosts.layout(hvd.size(), local, link_gbps, fallback), ps, suffix)
    with tf.init_scope():
        if not tf.executing_eagerly() or not probe.priced(pattern):
            return None
        return probe.agreed(scheme, size, local, _fp16_round_trip, lambda row: hvd.allgather(
            tf.constant(row), name=names.collective("tf", Kind.CPU, suffix.lstrip(".")), ignore_name_scope=True,
            process_set=ps).numpy())


def _fp16_round_trip(x: Any) -> Any:
    """Horovod's fp16 cast there and back (``hvd.Compression.fp16``), as the probe times it."""
    return tf.cast(tf.cast(tf.constant(x), tf.float16), tf.float32).numpy()
