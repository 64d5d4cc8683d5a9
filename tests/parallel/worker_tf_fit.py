"""Every scheme, with and without error feedback, in one launch: a small Keras model trained with
``model.fit`` for 2 epochs under ``horovod.tensorflow.keras.DistributedOptimizer``.

Reports, per run: a digest of the final weights (ranks must agree bit for bit), the loss of the
trained model on the whole generated data set (the test compares it with the uncompressed run),
the compressor's byte accounting and the patterns its slots used. ``--runs`` picks runs
(comma-separated labels; default: all).
"""
import argparse
import hashlib
import time

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk
import numpy as np
import tensorflow as tf
from harness import report

import hvd_gradq.tensorflow as gq

ap = argparse.ArgumentParser()
ap.add_argument("--runs", default="")
# shifts the data, the model's init and the rounding noise (0: the suite's run); for measuring
# how the losses spread across seeds when setting the tolerances in test_tf.py
ap.add_argument("--seed", type=int, default=0)
args = ap.parse_args()

hvd.init()
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)

SCHEMES = {
    "fp16": lambda ef: gq.FP16(ef=ef, seed=args.seed),
    "uniform": lambda ef: gq.Uniform(bits=4, ef=ef, seed=args.seed),
    "qsgd": lambda ef: gq.QSGD(levels=4, ef=ef, seed=args.seed),
    "terngrad": lambda ef: gq.TernGrad(ef=ef, seed=args.seed),
    "sign": lambda ef: gq.Sign(ef=ef, seed=args.seed),
    "topk": lambda ef: gq.TopK(ratio=0.1, ef=ef, seed=args.seed),
    "bingrad": lambda ef: gq.BinGrad(ef=ef, seed=args.seed),
    "orq": lambda ef: gq.ORQ(levels=5, ef=ef, seed=args.seed),
}
RUNS = {"none": (lambda: hvd.Compression.none, 1)}
for name, make in SCHEMES.items():
    RUNS[name] = (lambda make=make: make(False), 1)
    RUNS[name + "+ef"] = (lambda make=make: make(True), 1)
# locally accumulated gradients, one reduction every 2 batches (and its uncompressed baseline)
RUNS["none/bpps2"] = (lambda: hvd.Compression.none, 2)
RUNS["qsgd+ef/bpps2"] = (lambda: gq.QSGD(levels=4, ef=True, seed=args.seed), 2)

# A generated 4-class problem: a random linear teacher plus noise; each rank its own shard.
rng = np.random.default_rng(7 + args.seed)
W = rng.standard_normal((16, 4)).astype(np.float32)
X = rng.standard_normal((512 * hvd.size(), 16)).astype(np.float32)
Y = np.argmax(X @ W + 0.5 * rng.standard_normal((X.shape[0], 4)), axis=1)
XS, YS = X[hvd.rank() :: hvd.size()], Y[hvd.rank() :: hvd.size()]


def build():
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(args.seed)
    return tf.keras.Sequential([
        tf.keras.Input((16,)),
        tf.keras.layers.Dense(40, activation="relu"),  # kernel 640 = a full bucket of 512 and a tail
        tf.keras.layers.Dense(4),
    ])


out = {}
wanted = [r for r in args.runs.split(",") if r] or list(RUNS)
for label in wanted:
    make, bpps = RUNS[label]
    t0 = time.perf_counter()
    model = build()
    comp = make()
    opt = hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.3), compression=comp,
                                    backward_passes_per_step=bpps, average_aggregated_gradients=True)
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    cpu0 = time.process_time()
    hist = model.fit(XS, YS, batch_size=32, epochs=2, verbose=0, shuffle=False)
    cpu1 = time.process_time()
    full = model.evaluate(X, Y, batch_size=1024, verbose=0)  # the whole data set: the same on every rank
    h = hashlib.sha256()
    for v in model.trainable_variables:
        h.update(v.numpy().tobytes())
    rec = {"digest": h.hexdigest(), "loss": float(full), "train_loss": [float(v) for v in hist.history["loss"]],
           "seconds": time.perf_counter() - t0, "cpu": cpu1 - cpu0}
    if isinstance(comp, gq.GradqCompressor):
        rec["ratio"] = comp.stats()["total"]["all"]["ratio_vs_fp32"]
        rec["patterns"] = sorted({s["pattern"] for s in comp.slots()})
        rec["steps"] = [s["steps"] for s in comp.slots()]
    out[label] = rec
    if hvd.rank() == 0:
        print(label, {k: v for k, v in rec.items() if k != "digest"}, flush=True)
report(hvd.rank(), {"runs": out, "size": hvd.size()})
