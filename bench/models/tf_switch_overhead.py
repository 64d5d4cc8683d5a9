"""What TensorFlow's plan switch (hvd_gradq.tensorflow.switch) adds to a step: stock Horovod fp16
and fp32 beside the same plans forced through the switch, and a measuring ``auto`` after its
first trial, one model each, in one launch, timed in interleaved rounds (the slowest rank's step).

    horovodrun --gloo -np 2 -H localhost:2 .venv/bin/python bench/models/tf_switch_overhead.py

Prints each variant's median step and its ratio to the first variant's; ``--variants`` picks
them: ``fp16``, ``fp32`` (stock), ``sw16``, ``sw32`` (the plan forced through the switch: a trial
that never runs on its own, its plan set by hand), ``auto`` (ORQ-5 measuring, run until its
first trial has chosen)."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import horovod.tensorflow as hvd
import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import keras_models

import hvd_gradq.tensorflow as gq
from hvd_gradq.plan import trial as tr


def make(variant: str, model_name: str) -> tuple[Any, Any]:
    """(a traced training step, its compressor or None) for one variant, on its own model copy."""
    tf.keras.utils.set_random_seed(0)
    model = keras_models.build(model_name, 64, 128, 2)
    hvd.broadcast_variables(model.variables, root_rank=0)
    x, y = keras_models.batch(model_name, 16, 64, 128, hvd.rank())
    comp: Any
    if variant in ("fp16", "fp32"):
        comp, own = (hvd.Compression.fp16 if variant == "fp16" else hvd.Compression.none), None
    else:
        comp = own = gq.from_spec("orq", name=variant)
        if variant in ("sw16", "sw32"):
            script = tr.Trial(start=10**9)  # never runs on its own: the plan is set here
            script.plan = "fp16" if variant == "sw16" else "fp32"
            comp._measured.trial = script
    opt = tf.keras.optimizers.legacy.SGD(0.01, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step() -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=comp, sparse_as_dense=True)
        vs = model.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, vs), vs))
        return loss

    return step, own


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="fp16,fp32,sw16,sw32,auto")
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="timed steps a variant a round")
    args = ap.parse_args()
    hvd.init()
    variants = args.variants.split(",")
    made = {v: make(v, args.model) for v in variants}
    for v in variants:  # traced, kernels loaded; a measuring compressor to its first choice
        step, comp = made[v]
        for _ in range(3):
            step().numpy()
        k = 0
        while v == "auto" and comp.trial.phase.value != "chosen" and k < 200:
            step().numpy()
            k += 1
        if v == "auto" and hvd.rank() == 0:
            print(f"auto took {comp.trial.plan} after {k} trial steps", flush=True)
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:
            for i in range(args.steps):
                t = time.perf_counter()
                made[v][0]().numpy()
                took = tf.constant(time.perf_counter() - t)
                times[v].append(float(hvd.allreduce(took, op=hvd.Max, name=f"t.{v}.{r}.{i}").numpy()))
    if hvd.rank() == 0:
        base = statistics.median(times[variants[0]])
        for v in variants:
            m = statistics.median(times[v])
            print(f"{v:6s} median step {m * 1e3:7.1f} ms  {m / base:.2f}x {variants[0]}'s")


if __name__ == "__main__":
    main()
