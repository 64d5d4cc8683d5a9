"""5 steps of a tiny Keras model under stock hvd.DistributedGradientTape in a tf.function."""
import argparse
import hashlib

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from harness import report

ap = argparse.ArgumentParser()
ap.add_argument("--perturb-rank", type=int, default=-1)
ap.add_argument("--compression", default="")
args = ap.parse_args()

hvd.init()
tf.random.set_seed(0)
model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu"), tf.keras.layers.Dense(2)])
model.build((None, 8))
opt = tf.keras.optimizers.SGD(0.1)
compression = hvd.Compression.none
if args.compression:
    import hvd_gradq.tensorflow as gq

    compression = gq.from_spec(args.compression)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


hvd.broadcast_variables(model.variables, root_rank=0)
rng = np.random.default_rng(100 + hvd.rank())
for i in range(5):
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = rng.integers(0, 2, 32)
    loss = step(x, y)
    if i == 0:
        hvd.broadcast_variables(opt.variables(), root_rank=0)
if hvd.rank() == args.perturb_rank:
    v = model.trainable_variables[0]
    v.assign_add(tf.ones_like(v) * 1e-6)
h = hashlib.sha256()
for v in model.trainable_variables:
    h.update(v.numpy().tobytes())
report(hvd.rank(), {"digest": h.hexdigest(), "loss": float(loss), "size": hvd.size()})
