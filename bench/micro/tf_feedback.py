"""TensorFlow's error feedback: the classic rule as graph ops (before) against its two host ops
(:class:`hvd_gradq.feedback.Memory` with ``TFOps.host_op``), in one ``tf.function`` of many tensors,
interleaved in one process so that both see the same machine. Prints each side's median step
time, their ratio and the load average.

    .venv/bin/python bench/micro/tf_feedback.py --tensors 100 --elements 65536 --reps 20 [--procs 2]

``--procs 2`` runs two such processes at once, each call started together (a barrier), as two
ranks sharing a host's cores do: where TF's parallel regions of one wait for the other's.

A step is what the compressor does around a tensor's codec: compensate with the residual (a loss
scale as a traced tensor), a stand-in decode (``sign``'s: the mean magnitude times the sign), and
the residual update with the result's NaN check and a warm-up flag, for every tensor.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import tensorflow as tf

from hvd_gradq.feedback import Memory
from hvd_gradq.tensorflow.ops import TFOps
from hvd_gradq.tensorflow.store import SlotStore


class GraphOps(TFOps):
    """TensorFlow's operations only: the rule as graph ops (before the host ops)."""

    host_op = None


class HostOps(TFOps):
    """The host ops whatever the tensor's size (the compressor's own from ``host_op_min()``)."""

    def host_op_min(self) -> int:
        return 0


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


def run(a: argparse.Namespace, barrier: Any = None, results: Any = None) -> dict[str, float]:
    """One process's interleaved runs (with ``barrier``: each call started with every other
    process's, as ranks of a step are); the median seconds of each side."""
    rng = np.random.default_rng(0)
    grads = [tf.constant(rng.standard_normal(a.elements).astype(np.float32)) for _ in range(a.tensors)]
    scale = tf.Variable(1024.0)
    sides = {"graph ops": step_fn(GraphOps(), grads, scale), "host ops": step_fn(HostOps(), grads, scale)}
    warm = tf.constant(False)
    for f in sides.values():  # trace and compile first
        f(warm).numpy()
        f(warm).numpy()
    times: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(a.reps):
        for name, f in (list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]):  # ABBA
            if barrier is not None:
                barrier.wait()
            t0 = time.perf_counter()
            f(warm).numpy()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    if results is not None:
        results.put(med)
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--elements", type=int, default=65536)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--procs", type=int, default=1, help="processes at once, each call in step (2: two ranks a host)")
    a = ap.parse_args()
    if a.procs == 1:
        meds = [run(a)]
    else:
        ctx = mp.get_context("spawn")
        barrier, results = ctx.Barrier(a.procs), ctx.Queue()
        procs = [ctx.Process(target=run, args=(a, barrier, results)) for _ in range(a.procs)]
        for p in procs:
            p.start()
        meds = [results.get() for _ in procs]
        for p in procs:
            p.join()
    for i, med in enumerate(meds):
        print(f"process {i}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in med.items())
              + f" (median a step, {a.tensors} tensors of {a.elements}); "
              f"graph/host {med['graph ops'] / med['host ops']:.2f}x")
    print(f"{a.procs} process(es), TF's default threads ({tf.config.threading.get_intra_op_parallelism_threads()}: "
          f"its cores), {os.cpu_count()} CPUs; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
