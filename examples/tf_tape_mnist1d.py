"""MNIST-1D with a custom TensorFlow loop: ``tf.GradientTape`` wrapped in ``hvd.DistributedGradientTape``
inside a ``tf.function``, gradients compressed by hvd_gradq.

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python examples/tf_tape_mnist1d.py \\
        --compression orq:levels=5 --epochs 5

The same CNN and data as ``torch_mnist1d.py``. Rank 0 prints the test accuracy and the bytes the
compressor sent (``--json`` writes them). The measured version is ``bench/quality/train_tape_mnist1d.py``.
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from mnist1d_data import load_mnist1d, lr_at, parse_args, progress, report

import hvd_gradq.tensorflow as gq


def cnn(seed: int, channels: int = 25, length: int = 40, classes: int = 10) -> tf.keras.Model:
    """The MNIST-1D paper's CNN: three stride-2 convolutions (padding 1), then a linear layer."""
    tf.keras.utils.set_random_seed(seed)
    L = tf.keras.layers
    return tf.keras.Sequential([
        L.Input((length,)), L.Reshape((length, 1)),
        L.ZeroPadding1D(1), L.Conv1D(channels, 5, strides=2, activation="relu"),
        L.ZeroPadding1D(1), L.Conv1D(channels, 3, strides=2, activation="relu"),
        L.ZeroPadding1D(1), L.Conv1D(channels, 3, strides=2, activation="relu"),
        L.Flatten(), L.Dense(classes),
    ])


def evaluate(model: tf.keras.Model, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Accuracy and mean loss over the whole test set: each rank scores its shard, then one allreduce."""
    logits = model(x, training=False)
    loss = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float64))
    counts = tf.stack([correct, tf.reduce_sum(tf.cast(loss, tf.float64)), tf.constant(float(len(y)), tf.float64)])
    tot = hvd.allreduce(counts, op=hvd.Sum, name="example.eval").numpy()
    return float(tot[0] / tot[2]), float(tot[1] / tot[2])


def main() -> None:
    args = parse_args(__doc__.split("\n")[0])
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x, y, xt, yt = load_mnist1d(rank, size)
    per_epoch = len(x) // args.batch_size
    total = per_epoch * args.epochs if not args.max_steps else min(args.max_steps, per_epoch * args.epochs)

    model = cnn(args.seed)
    variables = model.trainable_variables
    compression = gq.from_spec(args.compression, seed=args.seed)
    opt = tf.keras.optimizers.legacy.Adam(learning_rate=args.lr)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    bar = progress(rank, total, f"tape {args.compression}", args.quiet)
    rng = np.random.default_rng([args.seed, rank])
    for step in range(total):
        if step % per_epoch == 0:
            order = rng.permutation(len(x))
        idx = order[(step % per_epoch) * args.batch_size:][:args.batch_size]
        opt.learning_rate = lr_at(step, total, args.lr)  # a variable once created: no retracing
        loss = float(train_step(tf.constant(x[idx]), tf.constant(y[idx])))
        if step == 0:  # the optimizer's slots exist now: every rank starts from rank 0's state
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
    bar.close()

    acc, test_loss = evaluate(model, xt, yt)
    if rank == 0:
        summary = {"example": "tf_tape_mnist1d", "compression": args.compression, "ranks": size, "steps": total,
                   "test_accuracy": acc, "test_loss": test_loss}
        report(summary, compression.stats(), args.json)


if __name__ == "__main__":
    main()
