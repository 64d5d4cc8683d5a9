"""What the TensorFlow compressor adds to the shared checks
(:class:`hvd_gradq.frontend.compressor.CompressorCore`): its own arguments and that the script is a
TensorFlow one, at construction (:func:`check_arguments`), and the eager allgather the core's
handshake runs on, once a process set, before the first collective (:func:`gatherer`).

The handshake runs eagerly (``tf.init_scope``), even while a graph is being traced, on a thread
the caller waits for at most the core's bound (:func:`bounded`); in a TF1-style graph no eager
collective can run, and the check is skipped (:func:`gatherer` is then None): every rank
compares its configuration and agrees on the CPU figures as the PyTorch frontend does, with the
same block (:func:`hvd_gradq.reduce.handshake.config_block`).
"""
from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

from ..errors import GradqError
from ..frontend.compressor import Gather
from ..frontend.guards import check_initialized
from ..reduce import handshake, names
from ..reduce.names import Kind
from ..schemes.options import NonFinite
from ..spec import Config
from .callsite import set_suffix

_COUNTER = itertools.count()
_NAME_OK = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def check_frontend() -> None:
    """That this is the frontend of the script: in a PyTorch script (horovod.torch initialized),
    Horovod would say it "has not been initialized" at the compressor's first call."""
    check_initialized("hvd_gradq.tensorflow", bool(hvd.is_initialized()))


def check_arguments(config: Config, loss_scale: Any, name: str | None) -> str:
    """Refuse what this frontend cannot serve, with what to use instead; returns the collectives'
    name prefix (``name``, or ``c<k>`` for the k-th compressor built in this process)."""
    if config.policy.nonfinite is NonFinite.SKIP:
        raise GradqError(
            f"{config.name}: nonfinite=skip is not supported by hvd_gradq.tensorflow: it changes a "
            "payload's size at run time, and a TF graph's allgather sizes are fixed when it is traced. "
            "Valid here: nonfinite=propagate (NaN results, as Horovod) or nonfinite=raise (the step fails)"
        )
    if loss_scale is not None and not (callable(loss_scale) or isinstance(loss_scale, tf.Variable)):
        raise GradqError(f"loss_scale must be a callable or a tf.Variable, not {type(loss_scale).__name__}")
    cid = name if name is not None else f"c{next(_COUNTER)}"
    if not _NAME_OK.match(cid):
        raise GradqError(f"name={cid!r} is not valid: 1-64 letters, digits, '_', '.' or '-'")
    return cid


def gatherer(ps: Any) -> Gather | None:
    """The handshake's allgather over process set ``ps``, run eagerly and waited for at most the
    seconds the core gives (:func:`bounded`); None in a TF1-style graph, where no eager collective
    can run now. Call it, and what it returns, under ``tf.init_scope()``."""
    if not tf.executing_eagerly():
        return None
    suffix = set_suffix(ps).lstrip(".")

    def gather(row: Any, kind: Kind, seconds: float) -> Any:
        name = names.collective("tf", kind, suffix)
        return bounded(lambda: hvd.allgather(tf.constant(row), name=name, ignore_name_scope=True,
                                             process_set=ps).numpy(), name, seconds)

    return gather


def bounded(run: Callable[[], Any], name: str, seconds: float) -> Any:
    """``run()`` (an eager collective named ``name``) on a daemon thread, waited for at most
    ``seconds``; past them :class:`~hvd_gradq.reduce.handshake.Stalled`. Horovod's TensorFlow ops
    give no handle to poll in eager mode (PyTorch's ``allgather_async`` does), so the thread waits
    in Horovod instead of the caller; one that times out stays there until Horovod shuts down
    (the error it leads to ends the job)."""
    box: list[tuple[bool, Any]] = []

    def target() -> None:
        try:
            box.append((True, run()))
        except BaseException as e:  # handed to the caller's thread, raised there
            box.append((False, e))

    thread = threading.Thread(target=target, name=f"hvd_gradq handshake {name}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise handshake.Stalled(name, seconds)
    ok, value = box[0]
    if not ok:
        raise value
    return value


def fp16_round_trip(x: Any) -> Any:
    """Horovod's fp16 cast there and back (``hvd.Compression.fp16``), as the probe times it."""
    return tf.cast(tf.cast(tf.constant(x), tf.float16), tf.float32).numpy()
