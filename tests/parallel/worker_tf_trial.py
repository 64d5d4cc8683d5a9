"""auto's measured choice in a TensorFlow job (hvd_gradq.plan.trial, hvd_gradq.tensorflow.switch),
several checks a launch: PyTorch's worker_torch_trial.py, for ``DistributedGradientTape``.

``trial``: a model of many variables trains through stock ``hvd.DistributedGradientTape`` inside
a ``tf.function`` with the trial on (``fallback=True``): each rank records the plan of every
step; the trial ends; stats()['auto'], the bytes by pattern and the log line say what it did.

``switch``: error feedback across plan switches, scripted (the trial's plan set by hand before
each step, no timing): a gradient that leaves compression for Horovod's fp32 delivers every
residual it held with that step (the oracle: the exact mean over ranks of gradient + residuals,
gathered raw), and holds none after it; back under compression it builds one again; fp16
likewise, to fp16's rounding. The step after such a step (fp16 or fp32 again) touches no
residual: a residual written there by hand (as a restored checkpoint would) is held bit for bit
and the step sends the gradient alone. The gradient is the step's input (``loss = sum(w * c)``),
so the oracle knows it exactly. Once with gather (own residuals) and once with scatter (own and
the owner's ``#reduce`` residual on the chunk this rank owns)."""
from __future__ import annotations

import argparse
import hashlib
import io
import sys

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from harness import report
from measuring_link import link_report, measuring

import hvd_gradq.tensorflow as gq
from hvd_gradq.plan import trial as tr
from hvd_gradq.plan.layout import chunk_bounds

ap = argparse.ArgumentParser()
ap.add_argument("--mode", required=True)
args = ap.parse_args()
hvd.init()
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
rank, size = hvd.rank(), hvd.size()


def digest(variables) -> str:
    h = hashlib.sha256()
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def trial_mode() -> dict:
    stream, stderr = io.StringIO(), sys.stderr
    sys.stderr = stream  # the package's log writes to the sys.stderr of the moment (hvd_gradq.log)
    tf.keras.utils.set_random_seed(0)
    widths = [64, 256, 256, 128, 64, 32, 16, 8, 1]
    model = tf.keras.Sequential([tf.keras.Input((widths[0],))]
                                + [tf.keras.layers.Dense(w, activation="tanh") for w in widths[1:-1]]
                                + [tf.keras.layers.Dense(1)])
    comp = gq.from_spec("orq:ef=true", fallback=True)
    opt = tf.keras.optimizers.SGD(0.01)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        tape = hvd.DistributedGradientTape(tape, compression=comp)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    hvd.broadcast_variables(model.variables, root_rank=0)
    plans, steps = [], 60
    for k in range(steps):
        rng = np.random.default_rng(1000 * k + rank)
        step(tf.constant(rng.standard_normal((16, widths[0]), np.float32)),
             tf.constant(rng.standard_normal((16, 1), np.float32)))
        plans.append(comp.trial.plan)
    sys.stderr = stderr
    stats = comp.stats()
    with measuring():  # a compressor whose handshake measures the link rate (eagerly, as at a trace)
        linked = gq.from_spec("orq", name="linked")
        hvd.allreduce(tf.ones((4096,)), compression=linked, name="link.x")
    return {"plans": plans, "auto": stats["auto"], "digest": digest(model.variables), "log": stream.getvalue(),
            "trial_steps": comp.trial.step + 1, "steps": steps, "tensors": {k: v["pattern"] for k, v in
                                                                            stats["tensors"].items()},
            "slots": [(s["key"], s["pattern"]) for s in comp.slots()], "large": sorted(comp.trial.large),
            "by_pattern": {p: c["tensors"] for p, c in stats["total"].items() if p != "all"},
            "link": link_report(linked.world())}


SCRIPT = ["compressed"] * 4 + ["fp32", "compressed", "compressed", "fp16", "fp16", "fp32", "compressed", "fp32",
                               "compressed"]
N = 12000  # large enough that either pattern compresses it


def switch_mode(pattern: str) -> dict:
    comp = gq.from_spec("uniform:bits=4,ef=true", pattern=pattern, link_gbps=1.0, name=f"sw{pattern}")
    script = tr.Trial(start=10**9)  # never runs on its own: the plan is set by hand below
    comp._measured.trial = script  # before the first trace: the gradient is traced with its switch
    w = tf.Variable(tf.zeros((N,)), name=f"w{pattern}")

    @tf.function
    def step(c):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * c)
        return hvd.DistributedGradientTape(tape, compression=comp).gradient(loss, [w])[0]

    out: dict = {"steps": []}
    results = hashlib.sha256()
    for k, plan in enumerate(SCRIPT):
        g = np.random.default_rng(1000 * k + rank).standard_normal(N).astype(np.float32)
        script.plan = plan
        plain = k > 0 and plan != "compressed" and SCRIPT[k - 1] != "compressed"
        injected = None
        if plain:  # what a restored checkpoint could leave: held, not sent
            key0 = comp.slots()[0]["key"]
            injected = np.random.default_rng(7 + k + rank).standard_normal(N).astype(np.float32) / 8
            comp.residuals[key0].assign(injected)
            comp.owners[key0].assign(rank)
        held = {key: v.numpy().copy() for key, v in comp.residuals.items()
                if int(comp.owners[key].numpy()) == rank and np.any(v.numpy() != 0)}
        # what this rank must deliver with an uncompressed step: its own residual, and the owner
        # residual (scatter) on the chunk this rank owns
        own = next((key for key in held if "#" not in key), None)
        sent = g + held[own] if own is not None and not plain else g
        reduced_keys = [key for key in held if key.endswith("#reduce") and not plain]
        if reduced_keys:
            lo, hi = chunk_bounds(N, comp.scheme.bucket, size)[rank]
            owner = np.zeros_like(g)
            owner[lo:hi] = held[reduced_keys[0]][: hi - lo]
            sent = sent + owner
        every = hvd.allgather(tf.constant(sent.reshape(1, -1)), name=f"oracle.{pattern}.{k}").numpy()
        stock = hvd.allreduce(tf.constant(sent), op=hvd.Average, name=f"stock.{pattern}.{k}",
                              compression=hvd.Compression.fp16 if plan == "fp16" else hvd.Compression.none).numpy()
        reduced = step(tf.constant(g)).numpy()
        results.update(reduced.tobytes())
        after = sorted(key for key, v in comp.residuals.items() if np.any(v.numpy() != 0))
        key = comp.slots()[0]["key"]
        row = {"plan": plan, "held": sorted(held), "after": after, "pattern": comp.stats()["tensors"][key]["pattern"],
               "own": own, "plain": plain}
        if injected is not None:
            row["held_bits"] = bool(np.array_equal(comp.residuals[key].numpy(), injected))
        if plan in ("fp32", "fp16"):
            exact = every.astype(np.float64).mean(0)
            if plan == "fp16":  # Horovod's fp16: each rank's value cast, summed in fp16, cast back
                exact = every.astype(np.float16).astype(np.float64).mean(0)
            row["err"] = float(np.abs(reduced.astype(np.float64) - exact).max())
            row["scale"] = float(np.abs(exact).max())
            # stock Horovod's bits wherever its average is a normal number (Horovod scales a
            # float16 average inside its op, where a subnormal's halving may round)
            normal = np.abs(stock) >= (2.0**-14 if plan == "fp16" else 0.0)
            row["stock_equal"] = bool(np.array_equal(reduced[normal], stock[normal])) and int(normal.sum()) > N // 2
        out["steps"].append(row)
    out["digest"] = results.hexdigest()
    out["branches"] = comp._switch.rows(comp._host.slots[comp.slots()[0]["key"]], True)
    return out


if args.mode == "trial":
    report(rank, trial_mode())
else:
    report(rank, {"gather": switch_mode("gather"), "scatter": switch_mode("scatter")})
