"""MNIST-1D with Keras ``model.fit`` and ``horovod.tensorflow.keras.DistributedOptimizer``, gradients
compressed by hvd_gradq.

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/keras_mnist1d.py \\
        --compression orq:levels=5 --epochs 5

The same CNN and data as ``tf_tape_mnist1d.py``; Horovod traces the compressor into Keras' train
function. Rank 0 prints the test accuracy and the bytes the compressor sent (``--json`` writes
them). The measured version is ``bench/quality/train_keras_mnist1d.py``.
"""
from __future__ import annotations

import math

import horovod.tensorflow.keras as hvd
import tensorflow as tf
from mnist1d_data import load_mnist1d, lr_at, parse_args, progress, report
from tf_tape_mnist1d import cnn, evaluate

import hvd_gradq.tensorflow as gq


class Schedule(tf.keras.callbacks.Callback):  # type: ignore[misc]
    """Sets the learning rate each step, drives the progress bar, stops at --max-steps. (A Keras
    LearningRateSchedule would not survive Horovod rebuilding the optimizer from its config.)"""

    def __init__(self, total: int, peak_lr: float, bar: object) -> None:
        super().__init__()
        self.total, self.peak_lr, self.bar, self.step = total, peak_lr, bar, 0

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.model.optimizer.learning_rate = lr_at(self.step, self.total, self.peak_lr)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.step += 1
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{float((logs or {}).get('loss', float('nan'))):.3f}", refresh=False)
        if self.step >= self.total:
            self.model.stop_training = True


def main() -> None:
    args = parse_args(__doc__.split("\n")[0])
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x, y, xt, yt = load_mnist1d(rank, size)
    per_epoch = len(x) // args.batch_size
    total = per_epoch * args.epochs if not args.max_steps else min(args.max_steps, per_epoch * args.epochs)

    model = cnn(args.seed)
    compression = gq.from_spec(args.compression, seed=args.seed)
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(learning_rate=args.lr), compression=compression)
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    ds = (tf.data.Dataset.from_tensor_slices((x, y))
          .shuffle(len(x), seed=args.seed * 1000 + rank, reshuffle_each_iteration=True)
          .batch(args.batch_size, drop_remainder=True).repeat())
    bar = progress(rank, total, f"keras {args.compression}", args.quiet)
    schedule = Schedule(total, args.lr, bar)
    model.fit(ds, epochs=math.ceil(total / per_epoch), steps_per_epoch=per_epoch, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), schedule])
    bar.close()

    acc, test_loss = evaluate(model, xt, yt)
    if rank == 0:
        summary = {"example": "keras_mnist1d", "compression": args.compression, "ranks": size,
                   "steps": schedule.step, "test_accuracy": acc, "test_loss": test_loss}
        report(summary, compression.stats(), args.json)


if __name__ == "__main__":
    main()
