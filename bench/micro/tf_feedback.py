"""TensorFlow's error feedback: the classic rule as graph ops (before) against its two host ops
(:class:`hvd_gradq.feedback.Memory` with ``TFOps.host_op``), in one ``tf.function`` of many tensors,
interleaved in one process so that both see the same machine. Prints each side's median step
time, their ratio and the load average.

    .venv/bin/python bench/micro/tf_feedback.py --tensors 100 --elements 65536 --reps 20

A step is what the compressor does around a tensor's codec: compensate with the residual (a loss
scale as a traced tensor), a stand-in decode (``sign``'s: the mean magnitude times the sign), and
the residual update with the result's NaN check and a warm-up flag, for every tensor.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import tensorflow as tf

from hvd_gradq.feedback import Memory
from hvd_gradq.tensorflow.ops import TFOps
from hvd_gradq.tensorflow.store import SlotStore


class GraphOps(TFOps):
    """TensorFlow's operations only: the rule as graph ops (before the host ops)."""

    host_op = None


def step_fn(ops: TFOps, grads: list, scale: tf.Variable) -> tf.types.experimental.GenericFunction:
    n = int(grads[0].shape[0])
    res = {f"t{i}": tf.Variable(tf.zeros(n)) for i in range(len(grads))}
    owners = {k: tf.Variable(np.int64(0)) for k in res}
    mem = Memory(ops, SlotStore(res, owners, 0), undo=False)

    @tf.function
    def step(warm: tf.Tensor) -> tf.Tensor:
        outs = []
        for i, g in enumerate(grads):
            key = f"t{i}"
            mem.begin_step(scale.read_value())
            x = mem.compensate(key, g)
            dec = tf.sign(x) * tf.reduce_mean(tf.abs(x))
            mem.update(key, x, dec, result=dec, hold=warm)
            outs.append(dec[0])
        return tf.stack(outs)

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--elements", type=int, default=65536)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    grads = [tf.constant(rng.standard_normal(a.elements).astype(np.float32)) for _ in range(a.tensors)]
    scale = tf.Variable(1024.0)
    sides = {"graph ops": step_fn(GraphOps(), grads, scale), "host ops": step_fn(TFOps(), grads, scale)}
    warm = tf.constant(False)
    for f in sides.values():  # trace and compile first
        f(warm).numpy()
        f(warm).numpy()
    times: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(a.reps):
        for name, f in (list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]):  # ABBA
            t0 = time.perf_counter()
            f(warm).numpy()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k}: median {v * 1e3:.1f} ms a step ({a.tensors} tensors of {a.elements})")
    print(f"ratio graph/host: {med['graph ops'] / med['host ops']:.2f}x; "
          f"intra-op threads {tf.config.threading.get_intra_op_parallelism_threads()}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
