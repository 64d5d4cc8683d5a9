"""The smallest real hvd_gradq training script (TensorFlow): a small MLP learns a random linear map
from synthetic data, its gradients sent as ORQ with 5 levels (``gq.ORQ()``: the README's "Which scheme" pick
when unsure of the optimizer).

    horovodrun -np 2 -H localhost:2 .venv/bin/python examples/minimal_tf.py
"""
import hashlib

import horovod.tensorflow as hvd
import tensorflow as tf

import hvd_gradq.tensorflow as gq

hvd.init()
tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="relu"),
                             tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.legacy.SGD(learning_rate=0.02)
compression = gq.ORQ()  # ORQ-5, no error feedback
target = tf.random.stateless_normal((32, 1), seed=[7, 0])  # the same map on every rank


@tf.function
def train_step(x: tf.Tensor) -> tf.Tensor:
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - x @ target))
    tape = hvd.DistributedGradientTape(tape, compression=compression)  # the same averaged gradient everywhere
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss


losses = []
for step in range(200):
    losses.append(float(train_step(tf.random.stateless_normal((64, 32), seed=[1000 + hvd.rank(), step]))))
    if step == 0:  # the optimizer's state exists now: every rank continues from rank 0's
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)

weights = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.variables)).hexdigest()[:16]
sent = compression.stats()["total"]["all"]
print(f"rank {hvd.rank()}: loss {sum(losses[:10]) / 10:.4f} -> {sum(losses[-10:]) / 10:.4f}, weights {weights}, "
      f"sent {sent['sent']} B, x{sent['ratio_vs_fp32']:.1f} less than fp32", flush=True)
