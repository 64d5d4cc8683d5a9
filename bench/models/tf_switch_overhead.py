"""What TensorFlow's plan switch (hvd_gradq.tensorflow.switch) adds to a step: stock Horovod fp16
and fp32 beside the same plans forced through the switch, and a measuring ``auto`` after its
first trial, one model each, in one launch, timed in interleaved rounds (the slowest rank's step).

    horovodrun --gloo -np 2 -H localhost:2 .venv/bin/python bench/models/tf_switch_overhead.py

Prints each variant's median step and its ratio to the first variant's; ``--variants`` picks
them: ``fp16``, ``fp32`` (stock), ``sw16``, ``sw32`` (the plan forced through the switch: a trial
that never runs on its own, its plan set by hand), ``auto`` (measuring, run until its first
trial has chosen); ``--scheme`` is the compressor of the last three (``orq``: ORQ-5;
``bingrad``: error feedback on, whose fp16/fp32 steps after the first take the PLAIN branches)."""
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
from bench.models import trainer_tf
from hvd_gradq.plan import trial


def make(variant: str, model_name: str, scheme: str) -> Any:
    """The model benchmark's trainer (:class:`trainer_tf.Trainer`: the same model, batch,
    optimizer and traced step) for one variant; the forced plans' trial is set before the step
    is first traced."""
    args = argparse.Namespace(model=model_name, image=64, seq=128, layers=2, batch=16, seed=0, lr=0.01)
    tr = trainer_tf.Trainer(variant if variant in ("fp16", "fp32") else scheme, args)
    if variant in ("sw16", "sw32"):
        script = trial.Trial(start=10**9)  # never runs on its own: the plan is set here
        script.plan = "fp16" if variant == "sw16" else "fp32"
        tr.compressor._measured.trial = script
    return tr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="fp16,fp32,sw16,sw32,auto")
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--scheme", default="orq", help="the switched variants' compressor (a spec)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="timed steps a variant a round")
    args = ap.parse_args()
    hvd.init()
    variants = args.variants.split(",")
    made = {v: make(v, args.model, args.scheme) for v in variants}
    for v in variants:  # traced, kernels loaded; a measuring compressor to its first choice
        tr = made[v]
        for _ in range(3):
            tr.step()
        k = 0
        while v == "auto" and tr.compressor.trial.phase.value != "chosen" and k < 200:
            tr.step()
            k += 1
        if v == "auto" and hvd.rank() == 0:
            print(f"auto took {tr.compressor.trial.plan} after {k} trial steps", flush=True)
    times: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:
            for i in range(args.steps):
                t = time.perf_counter()
                made[v].step()
                took = tf.constant(time.perf_counter() - t)
                times[v].append(float(hvd.allreduce(took, op=hvd.Max, name=f"t.{v}.{r}.{i}").numpy()))
    if hvd.rank() == 0:
        base = statistics.median(times[variants[0]])
        for v in variants:
            m = statistics.median(times[v])
            print(f"{v:6s} median step {m * 1e3:7.1f} ms  {m / base:.2f}x {variants[0]}'s")


if __name__ == "__main__":
    main()
