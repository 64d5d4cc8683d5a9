"""MNIST-1D with a custom TensorFlow loop: ``tf.GradientTape`` wrapped in ``hvd.DistributedGradientTape``
inside a ``tf.function``, gradients compressed by hvd_gradq.

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python bench/quality/train_tape_mnist1d.py \\
        --compression orq:levels=5 --epochs 5

The same CNN, data, schedule and summary as ``train_mnist1d.py``; the compressor is
``hvd_gradq.tensorflow.from_spec(spec)``, traced into the step function by Horovod.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository root, so that `bench.` imports work
    sys.path.insert(0, str(ROOT))

from bench import measure  # noqa: E402


def main() -> None:
    args = measure.parse_args(__doc__.split("\n")[0])
    hvd.init()
    measure.tf_setup()
    rank, size = hvd.rank(), hvd.size()

    data = measure.load_mnist1d()
    x, y = measure.shard(data["x"], data["y"], rank, size)
    xt, yt = measure.shard(data["x_test"], data["y_test"], rank, size)
    spe, total = measure.plan(len(x), args.batch_size, args.epochs, args.max_steps)
    warmup = measure.warmup_steps(spe, total)

    model = measure.tf_model(args.seed)
    variables = model.trainable_variables
    sizes = [int(np.prod(v.shape)) for v in variables]
    inner, timed, scheme, kind = measure.tf_compression(args.compression, args.seed, hvd, len(sizes))
    opt = measure.tf_optimizer(args.optimizer, args.lr)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=timed)
        grads = tape.gradient(loss, variables)
        opt.apply_gradients(zip(grads, variables))
        return loss

    clock = measure.StepClock(total)
    bar = measure.progress(rank, total, f"tape {args.compression}", args.quiet)
    step, epoch, losses = 0, 0, []
    t_start = time.perf_counter()
    while step < total:
        order = measure.epoch_order(len(x), args.seed, epoch, rank)
        epoch_losses = []
        for b in range(spe):
            if step >= total:
                break
            t0 = time.perf_counter()
            opt.learning_rate = measure.lr_at(step, total, warmup, args.lr)  # a variable once created
            idx = order[b * args.batch_size : (b + 1) * args.batch_size]
            loss = float(train_step(tf.constant(x[idx]), tf.constant(y[idx])))
            if step == 0:  # every rank starts from rank 0's weights and optimizer state
                hvd.broadcast_variables(model.variables, root_rank=0)
                hvd.broadcast_variables(opt.variables(), root_rank=0)
            clock.add(time.perf_counter() - t0, timed.step_time())
            epoch_losses.append(loss)
            step += 1
            bar.update(1)
            bar.set_postfix(epoch=epoch, loss=f"{loss:.3f}", refresh=False)
        losses = epoch_losses
        epoch += 1
    bar.close()
    wall = time.perf_counter() - t_start
    acc, test_loss = measure.tf_evaluate(model, xt, yt, hvd)

    summary = measure.make_summary(
        args, framework="tensorflow (GradientTape)", example="train_tape_mnist1d", scheme=scheme, nranks=size,
        steps=total, epochs_run=round(total / spe, 3), n_params=sum(sizes), accuracy=acc, test_loss=test_loss,
        train_loss=float(np.mean(losses)) if losses else float("nan"), clock=clock,
        bytes_info=measure.bytes_summary(inner.stats() if kind is None else None, kind, sizes, size, total),
        wall_s=wall,
    )
    if rank == 0:
        measure.print_summary(summary)
        measure.write_json(args.json, summary)


if __name__ == "__main__":
    main()
