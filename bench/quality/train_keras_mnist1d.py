"""MNIST-1D with Keras ``model.fit`` and ``horovod.tensorflow.keras.DistributedOptimizer``, gradients
compressed by hvd_gradq.

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python bench/quality/train_keras_mnist1d.py \\
        --compression orq:levels=5 --epochs 5

The same CNN, data, schedule and summary as ``train_mnist1d.py``. The compressor is
``hvd_gradq.tensorflow.from_spec(spec)``; Horovod traces it into Keras' train function, so the
compress share is measured in the graph (see ``measure.tf_timed_compressor``).
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository root, so that `bench.` imports work
    sys.path.insert(0, str(ROOT))

from bench import measure  # noqa: E402


class _Steps(tf.keras.callbacks.Callback):  # type: ignore[misc]
    """Sets the learning rate, times each step, reads the compressor's time, drives the progress bar,
    stops at --max-steps."""

    def __init__(self, total: int, warmup: int, peak_lr: float, clock: measure.StepClock, timed: object,
                 bar: object) -> None:
        super().__init__()
        self.total, self.warmup, self.peak_lr = total, warmup, peak_lr
        self.clock, self.timed, self.bar = clock, timed, bar
        self.step = 0
        self.t0 = 0.0
        self.losses: list[float] = []

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.t0 = time.perf_counter()
        # the schedule of measure.lr_at (a Keras LearningRateSchedule would not survive Horovod
        # rebuilding the optimizer from its config)
        self.model.optimizer.learning_rate = measure.lr_at(self.step, self.total, self.warmup, self.peak_lr)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        loss = float((logs or {}).get("loss", float("nan")))  # waits for the step to finish
        dt = time.perf_counter() - self.t0
        self.clock.add(dt, self.timed.step_time())
        self.losses.append(loss)
        self.step += 1
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        if self.step >= self.total:
            self.model.stop_training = True


def main() -> None:
    args = measure.parse_args(__doc__.split("\n")[0])
    hvd.init()
    measure.tf_setup()
    rank, size = hvd.rank(), hvd.size()

    data = measure.load_mnist1d()
    x, y = measure.shard(data["x"], data["y"], rank, size)
    xt, yt = measure.shard(data["x_test"], data["y_test"], rank, size)
    spe, total = measure.plan(len(x), args.batch_size, args.epochs, args.max_steps)

    model = measure.tf_model(args.seed)
    sizes = [int(np.prod(v.shape)) for v in model.trainable_variables]
    inner, timed, scheme, kind = measure.tf_compression(args.compression, args.seed, hvd, len(sizes))
    opt = measure.tf_optimizer(args.optimizer, args.lr)
    opt = hvd.DistributedOptimizer(opt, compression=timed)
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    ds = (tf.data.Dataset.from_tensor_slices((x, y))
          .shuffle(len(x), seed=args.seed * 1000 + rank, reshuffle_each_iteration=True)
          .batch(args.batch_size, drop_remainder=True).repeat())
    clock = measure.StepClock(total)
    bar = measure.progress(rank, total, f"keras {args.compression}", args.quiet)
    steps_cb = _Steps(total, measure.warmup_steps(spe, total), args.lr, clock, timed, bar)
    t_start = time.perf_counter()
    model.fit(ds, epochs=math.ceil(total / spe), steps_per_epoch=spe, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), steps_cb])
    bar.close()
    wall = time.perf_counter() - t_start
    acc, test_loss = measure.tf_evaluate(model, xt, yt, hvd)

    summary = measure.make_summary(
        args, framework="tensorflow (keras fit)", example="train_keras_mnist1d", scheme=scheme, nranks=size,
        steps=steps_cb.step, epochs_run=round(steps_cb.step / spe, 3), n_params=sum(sizes), accuracy=acc,
        test_loss=test_loss, train_loss=float(np.mean(steps_cb.losses[-spe:])), clock=clock,
        bytes_info=measure.bytes_summary(inner.stats() if kind is None else None, kind, sizes, size, steps_cb.step),
        wall_s=wall,
    )
    if rank == 0:
        measure.print_summary(summary)
        measure.write_json(args.json, summary)


if __name__ == "__main__":
    main()
